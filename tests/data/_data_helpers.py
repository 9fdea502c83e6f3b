"""Shared fixtures for the data-pipeline tests: tiny PNGs and trajectory records built here."""

from __future__ import annotations

import io
import json
import os
from typing import Any

from PIL import Image


def png(path: str, size: tuple[int, int] = (40, 30), color: tuple[int, int, int] = (200, 10, 10)) -> str:
    os.makedirs(os.path.dirname(path), exist_ok=True)
    Image.new("RGB", size, color).save(path, format="PNG")
    return path


def png_bytes(size: tuple[int, int] = (40, 30), color: tuple[int, int, int] = (9, 99, 199), fmt: str = "PNG") -> bytes:
    buf = io.BytesIO()
    Image.new("RGB", size, color).save(buf, format=fmt)
    return buf.getvalue()


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


def relative(rec: dict, root: str) -> dict:
    """``rec`` with its screenshot paths relative to ``root`` (as a JSONL in ``root`` would give them)."""
    steps = [{**s, "screenshot": os.path.relpath(s["screenshot"], root)} for s in rec["steps"]]
    return {**rec, "steps": steps}


def write_lines(path: str, lines: list[dict | str | bytes]) -> str:
    """A JSONL file of records (dicts), raw text lines and raw byte lines."""
    with open(path, "wb") as f:
        for line in lines:
            if isinstance(line, dict):
                line = json.dumps(line)
            f.write((line.encode() if isinstance(line, str) else line) + b"\n")
    return path


def read_jsonl_dicts(path: str) -> list[dict]:
    with open(path, encoding="utf-8") as f:
        return [json.loads(line) for line in f]
