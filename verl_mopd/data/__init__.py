"""Uni-GUI data pipeline: trajectory schema, cleaning with a per-reason report, readers, verl parquet.

See :mod:`verl_mopd.data.trajectories` (schema, rules), :mod:`.readers` (AgentNet, AndroidControl),
:mod:`.judges` (subtask judge), :mod:`.convert` (parquet layout) and :mod:`.cli` (``verl-mopd prepare``).
"""

from verl_mopd.data.convert import ConvertConfig, convert, split_by_trajectory, trajectory_rows
from verl_mopd.data.judges import JudgeConfig, OfflineJudge, OpenAIJudge, Verdict
from verl_mopd.data.readers import read_agentnet, read_android_control
from verl_mopd.data.trajectories import (
    RULES,
    CleanConfig,
    Drop,
    SchemaError,
    Step,
    Trajectory,
    clean,
    clean_report,
    format_report,
    read_jsonl,
    write_jsonl,
)

__all__ = [
    "RULES",
    "CleanConfig",
    "ConvertConfig",
    "Drop",
    "JudgeConfig",
    "OfflineJudge",
    "OpenAIJudge",
    "SchemaError",
    "Step",
    "Trajectory",
    "Verdict",
    "clean",
    "clean_report",
    "convert",
    "format_report",
    "read_agentnet",
    "read_android_control",
    "read_jsonl",
    "split_by_trajectory",
    "trajectory_rows",
    "write_jsonl",
]
