"""Shared fixtures for the data-pipeline tests: tiny PNGs and trajectory records built here."""

from __future__ import annotations

import os
from typing import Any

from PIL import Image


def png(path: str, size: tuple[int, int] = (40, 30), color: tuple[int, int, int] = (200, 10, 10)) -> str:
    os.makedirs(os.path.dirname(path), exist_ok=True)
    Image.new("RGB", size, color).save(path, format="PNG")
    return path


def record(tmp: str, tid: str = "t0", platform: str = "desktop", actions: list[dict] | None = None, **over: Any) -> dict:
    """A valid schema record with one screenshot per action (pixel coords on a 100x50 screen)."""
    if actions is None:
        click = "left_click" if platform == "desktop" else "click"
        actions = [{"action": click, "coordinate": [50, 25]}, {"action": "terminate", "status": "success"}]
    steps = []
    for i, a in enumerate(actions):
        shot = png(os.path.join(tmp, "imgs", f"{tid}_{i}.png"), (100, 50), (i * 40 % 256, 20, 20))
        steps.append({"index": i, "screenshot": shot, "action": a, "thought": f"think {i}", "description": f"desc {i}"})
    rec = {
        "id": tid,
        "platform": platform,
        "instruction": f"do {tid}",
        "screen_size": [100, 50],
        "steps": steps,
        "judge": {"subtasks": [{"subtask": "a", "completed": True}]},
    }
    rec.update(over)
    return rec
