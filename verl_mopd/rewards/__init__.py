"""GUI action reward for UI-MOPD: action schema, tolerant parser, partial-match scorer, prompts."""

from verl_mopd.rewards.actions import (
    ACTION_SPECS,
    PLATFORMS,
    TOOL_NAMES,
    Action,
    ActionError,
    from_grid,
    normalize_action,
    to_grid,
)
from verl_mopd.rewards.parse import ParseConfig, ParseError, parse_action
from verl_mopd.rewards.prompts import render_tool_call, system_prompt, tool_definition
from verl_mopd.rewards.score import PRESETS, ScoreConfig, ScoreResult, Target, compute_score, score_action, summarize

__all__ = [
    "ACTION_SPECS",
    "PLATFORMS",
    "TOOL_NAMES",
    "PRESETS",
    "Action",
    "ActionError",
    "ParseConfig",
    "ParseError",
    "ScoreConfig",
    "ScoreResult",
    "Target",
    "compute_score",
    "from_grid",
    "normalize_action",
    "parse_action",
    "render_tool_call",
    "score_action",
    "summarize",
    "system_prompt",
    "to_grid",
    "tool_definition",
]
