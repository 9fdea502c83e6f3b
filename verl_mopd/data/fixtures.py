"""A tiny Uni-GUI fixture: small PNG screenshots and a trajectory JSONL with one bad trajectory per rule.

    python -m verl_mopd.data.fixtures /tmp/uni_gui          # writes trajectories.jsonl + imgs/
    verl-mopd prepare --input /tmp/uni_gui/trajectories.jsonl --out /tmp/uni_gui/out

Good trajectories (``good-desktop-*``, ``good-mobile-*``) carry offline judge verdicts with every
subtask completed; each ``bad-<rule>`` trajectory fails exactly that rule (and passes every rule
before it), so the report shows one drop per rule.
"""

from __future__ import annotations

import json
import os
import random
import sys
from typing import Any

SIZES = {"desktop": (96, 54), "mobile": (45, 96)}


def _png(path: str, size: tuple[int, int], box: tuple[int, int, int, int], seed: int) -> None:
    from PIL import Image, ImageDraw

    rng = random.Random(seed)
    im = Image.new("RGB", size, tuple(rng.randrange(160, 256) for _ in range(3)))
    ImageDraw.Draw(im).rectangle(box, fill=tuple(rng.randrange(0, 96) for _ in range(3)))
    im.save(path, format="PNG")


def _desktop_steps(rng: random.Random, n: int, w: int, h: int) -> list[dict[str, Any]]:
    steps = []
    for i in range(n - 1):
        x1, y1 = rng.randrange(0, w - 12), rng.randrange(0, h - 8)
        box = [x1, y1, x1 + 10, y1 + 6]
        kind = i % 3
        if kind == 0:
            action = {"action": "left_click", "coordinate": [x1 + 5, y1 + 3]}
        elif kind == 1:
            action = {"action": "type", "text": f"hello {i}"}
            box = None
        else:
            action = {"action": "key", "keys": ["ctrl", "s"]}
            box = None
        steps.append({"action": action, "bbox": box, "thought": f"Step {i}: proceed.", "description": f"do {i}"})
    steps.append({"action": {"action": "terminate", "status": "success"}, "bbox": None, "thought": "Done.", "description": "finish"})
    return steps


def _mobile_steps(rng: random.Random, n: int, w: int, h: int) -> list[dict[str, Any]]:
    steps = []
    for i in range(n - 1):
        x1, y1 = rng.randrange(0, w - 10), rng.randrange(0, h - 10)
        box = [x1, y1, x1 + 8, y1 + 8]
        kind = i % 3
        if kind == 0:
            action = {"action": "click", "coordinate": [x1 + 4, y1 + 4]}
        elif kind == 1:
            action = {"action": "swipe", "coordinate": [w // 2, int(h * 0.75)], "coordinate2": [w // 2, int(h * 0.25)]}
            box = None
        else:
            action = {"action": "system_button", "button": "Back"}
            box = None
        steps.append({"action": action, "bbox": box, "thought": f"Step {i}: go on.", "description": f"tap {i}"})
    steps.append({"action": {"action": "terminate", "status": "success"}, "bbox": None, "thought": "Done.", "description": "finish"})
    return steps


def make_fixture(out_dir: str, per_platform: int = 4, seed: int = 0) -> str:
    """Write ``out_dir/trajectories.jsonl`` and ``out_dir/imgs/*.png``; returns the JSONL path."""
    rng = random.Random(seed)
    os.makedirs(os.path.join(out_dir, "imgs"), exist_ok=True)
    records = []

    def build(tid: str, platform: str, n: int, **overrides: Any) -> dict[str, Any]:
        w, h = SIZES[platform]
        raw = (_desktop_steps if platform == "desktop" else _mobile_steps)(rng, n, w, h)
        steps = []
        for i, st in enumerate(raw):
            rel = f"imgs/{tid}_{i}.png"
            box = st["bbox"] or [0, 0, 4, 4]
            _png(os.path.join(out_dir, rel), (w, h), tuple(box), rng.randrange(1 << 30))
            step = {"index": i, "screenshot": rel, "action": st["action"], "thought": st["thought"],
                    "description": st["description"]}  # fmt: skip
            if st["bbox"]:
                step["bbox"] = st["bbox"]
            steps.append(step)
        subtasks = [f"{tid} part {k}" for k in range(2)]
        rec = {
            "id": tid,
            "platform": platform,
            "instruction": f"Complete task {tid} on the {platform}.",
            "screen_size": [w, h],
            "coords": "pixel",
            "steps": steps,
            "subtasks": subtasks,
            "judge": {"subtasks": [{"subtask": s, "completed": True} for s in subtasks], "model": "fixture"},
            "env_mismatch": False,
            "source": f"fixture_{platform}",
        }
        rec.update(overrides)
        return rec

    for platform in ("desktop", "mobile"):
        for k in range(per_platform):
            records.append(build(f"good-{platform}-{k}", platform, 3 + k % 3))
    # one failure per rule, each passing every earlier rule
    r = build("bad-structure", "desktop", 4)
    r["steps"][2]["index"] = 5
    records.append(r)
    r = build("bad-screenshots", "mobile", 3)
    r["steps"][1]["screenshot"] = "imgs/missing.png"
    records.append(r)
    r = build("bad-action_space", "mobile", 3)
    r["steps"][0]["action"] = {"action": "left_click", "coordinate": [10, 10]}  # a desktop action on mobile
    records.append(r)
    records.append(build("bad-max_steps", "desktop", 41))
    records.append(build("bad-env_mismatch", "desktop", 3, env_mismatch=True))
    r = build("bad-subtasks", "mobile", 3)
    r["judge"]["subtasks"][1]["completed"] = False
    records.append(r)
    path = os.path.join(out_dir, "trajectories.jsonl")
    with open(path, "w", encoding="utf-8") as f:
        for rec in records:
            f.write(json.dumps(rec) + "\n")
    return path


def main(argv: list[str] | None = None) -> int:
    import argparse

    p = argparse.ArgumentParser(prog="python -m verl_mopd.data.fixtures", description=__doc__.split("\n")[0])
    p.add_argument("out_dir")
    p.add_argument("--per-platform", type=int, default=4)
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    print(make_fixture(args.out_dir, args.per_platform, args.seed))
    return 0


if __name__ == "__main__":
    sys.exit(main())
