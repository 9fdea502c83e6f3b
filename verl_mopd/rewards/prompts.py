"""Platform system prompts: the ``computer_use`` / ``mobile_use`` tools in Qwen3-VL function-call format.

Generated from :data:`verl_mopd.rewards.actions.ACTION_SPECS`, the table the parser validates
against, so the actions and arguments the student is offered are exactly the ones it is graded on.

Public API:

- ``tool_definition(platform, actions=None) -> dict``: the OpenAI-style function schema
  (``{"type": "function", "function": {...}}``); pass ``tools=[...]`` to a Qwen3-VL
  ``apply_chat_template`` to let the chat template render it.
- ``system_prompt(platform, actions=None, preamble=DEFAULT_PREAMBLE) -> str``: the full system
  message text as Qwen3-VL's chat template renders a system message plus that tool (for
  pipelines that store the system prompt as text).
- ``render_tool_call(action) -> str``: an :class:`Action` as the model should write it,
  ``<tool_call>\\n{...}\\n</tool_call>`` (SFT targets, examples, round-trip tests).
- ``USER_TEMPLATE``: the user turn of a step, ``.format(instruction=..., history=...)``; one
  ``<image>`` marks the screenshot. ``verl-mopd prepare`` writes it into the training prompts and
  the online agents send it, so an online step reads like a training step.
"""

from __future__ import annotations

import json
from typing import Any, Iterable

from verl_mopd.rewards.actions import (
    ACTION_SPECS,
    DEFAULT_PROMPT_ACTIONS,
    GRID_MAX,
    SYSTEM_BUTTONS,
    TOOL_NAMES,
    Action,
    check_platform,
)

DEFAULT_PREAMBLE = "You are a helpful assistant."

USER_TEMPLATE = "Instruction: {instruction}\n\nPrevious actions:\n{history}\n\n<image>"

_TOOL_INTRO = {
    "desktop": (
        "Use a mouse and keyboard to interact with a computer, and take screenshots.\n"
        "* This is an interface to a desktop GUI. You do not have access to a terminal or "
        "applications menu. You must click on desktop icons to start applications.\n"
        "* Some applications may take time to start or process actions, so you may need to wait "
        "and take successive screenshots to see the results of your actions.\n"
        f"* The screen's resolution is {GRID_MAX}x{GRID_MAX} (relative coordinates).\n"
        "* Whenever you intend to move the cursor to click on an element like an icon, consult "
        "the screenshot to determine the coordinates of the element before moving the cursor.\n"
        "* Click buttons, links, icons, etc. with the cursor tip in the center of the element."
    ),
    "mobile": (
        "Use a touchscreen to interact with a mobile device, and take screenshots.\n"
        "* This is an interface to a mobile device with touchscreen. You can perform actions like "
        "clicking, typing, swiping, etc.\n"
        "* Some applications may take time to start or process actions, so you may need to wait "
        "and take successive screenshots to see the results of your actions.\n"
        f"* The screen's resolution is {GRID_MAX}x{GRID_MAX} (relative coordinates).\n"
        "* Tap buttons, links, icons, etc. in the center of the element."
    ),
}

_ARG_JSON_TYPE = {
    "point": {"type": "array"},
    "text": {"type": "string"},
    "keys": {"type": "array"},
    "number": {"type": "number"},
    "button": {"type": "string", "enum": list(SYSTEM_BUTTONS)},
    "status": {"type": "string", "enum": ["success", "failure"]},
}


def _resolve_actions(platform: str, actions: Iterable[str] | None) -> tuple[str, ...]:
    specs = ACTION_SPECS[check_platform(platform)]
    chosen = tuple(DEFAULT_PROMPT_ACTIONS[platform] if actions is None else actions)
    unknown = [a for a in chosen if a not in specs]
    if unknown or not chosen:
        raise ValueError(f"actions={list(chosen)!r}: unknown {unknown}; allowed {platform} actions: {list(specs)}")
    return chosen


def tool_definition(platform: str, actions: Iterable[str] | None = None) -> dict[str, Any]:
    """The platform's tool as an OpenAI-style function schema, restricted to ``actions``.

    Each argument's description names the actions that use it and whether they require it.
    """
    chosen = _resolve_actions(platform, actions)
    specs = ACTION_SPECS[platform]
    action_lines = [f"* `{name}`: {specs[name].description}" for name in chosen]
    properties: dict[str, Any] = {
        "action": {
            "description": "The action to perform. The available actions are:\n" + "\n".join(action_lines),
            "enum": list(chosen),
            "type": "string",
        }
    }
    users: dict[str, list[tuple[str, bool, str, str]]] = {}
    for name in chosen:
        for a in specs[name].args:
            users.setdefault(a.name, []).append((name, a.required, a.kind, a.description))
    for arg_name, uses in users.items():
        kind = uses[0][2]
        descs = list(dict.fromkeys(d for _, _, _, d in uses))
        if len(descs) == 1:
            desc = descs[0]
        else:
            desc = " ".join(
                "For " + ", ".join(f"`{n}`" for n, _, _, d2 in uses if d2 == d) + f": {d}" for d in descs
            )
        req = [n for n, r, _, _ in uses if r]
        opt = [n for n, r, _, _ in uses if not r]
        notes = []
        if req:
            notes.append("Required by " + ", ".join(f"`action={n}`" for n in req) + ".")
        if opt:
            notes.append("Optional for " + ", ".join(f"`action={n}`" for n in opt) + ".")
        properties[arg_name] = {"description": f"{desc} {' '.join(notes)}", **_ARG_JSON_TYPE[kind]}
    return {
        "type": "function",
        "function": {
            "name": TOOL_NAMES[platform],
            "description": _TOOL_INTRO[platform],
            "parameters": {"properties": properties, "required": ["action"], "type": "object"},
        },
    }


def system_prompt(
    platform: str, actions: Iterable[str] | None = None, preamble: str | None = DEFAULT_PREAMBLE
) -> str:
    """The system message text with the platform tool, laid out as Qwen3-VL's chat template does.

    Args:
        platform: ``"desktop"`` or ``"mobile"``.
        actions: the subset of the platform's actions to offer (default
            :data:`~verl_mopd.rewards.actions.DEFAULT_PROMPT_ACTIONS`).
        preamble: text before the tools section (``None`` or ``""`` for none).
    """
    tool = json.dumps(tool_definition(platform, actions), ensure_ascii=False)
    tools_block = (
        "# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
        "You are provided with function signatures within <tools></tools> XML tags:\n<tools>\n"
        f"{tool}\n</tools>\n\n"
        "For each function call, return a json object with function name and arguments within "
        "<tool_call></tool_call> XML tags:\n<tool_call>\n"
        '{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call>'
    )
    return f"{preamble}\n\n{tools_block}" if preamble else tools_block


def render_tool_call(action: Action) -> str:
    """``<tool_call>\\n{"name": ..., "arguments": {...}}\\n</tool_call>`` for ``action``."""
    return "<tool_call>\n" + json.dumps(action.to_tool_call(), ensure_ascii=False) + "\n</tool_call>"
