"""Shared builders for the reward tests."""

import json

TOOL = {"desktop": "computer_use", "mobile": "mobile_use"}


def call(platform: str, think: str = "</think>\n", tool: str | None = None, **arguments) -> str:
    """A Qwen3-VL-style response: ``</think>`` then one ``<tool_call>`` block."""
    body = json.dumps({"name": tool or TOOL[platform], "arguments": arguments})
    return f"{think}<tool_call>\n{body}\n</tool_call>"


def truth(platform: str, bbox=None, **action) -> dict:
    gt = {"platform": platform, "action": action}
    if bbox is not None:
        gt["bbox"] = bbox
    return gt
