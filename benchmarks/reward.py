"""Reward throughput: rollouts scored per second on one core, against ``json.loads`` of the same calls.

    python benchmarks/reward.py [--n 1024] [--think-chars 2000] [--repeats 5]

The batch mixes both platforms and all three levels, each response with a reasoning block of
``--think-chars`` characters before ``</think>`` (Qwen3-VL Thinking output). The baseline is
``json.loads`` of each response's tool-call JSON alone (the floor of any parser). Target from
issue 3: 1,024 rollouts in < 50 ms.
"""

from __future__ import annotations

import argparse
import json
import random
import time

from verl_mopd.rewards import compute_score


def make_batch(n: int, think_chars: int, seed: int = 0):
    rng = random.Random(seed)
    words = "the button is at the top right so I should click it and then wait for the page".split()
    rows = []
    for i in range(n):
        platform = "mobile" if i % 2 else "desktop"
        tool = "mobile_use" if platform == "mobile" else "computer_use"
        click = "click" if platform == "mobile" else "left_click"
        kind = i % 6
        if kind <= 1:
            gt = {"platform": platform, "action": {"action": click, "coordinate": [450, 450]}, "bbox": [400, 400, 500, 500]}
            args = {"action": click, "coordinate": [rng.randint(380, 520), rng.randint(380, 520)]}
        elif kind == 2:
            gt = {"platform": platform, "action": {"action": "type", "text": "weather in paris tomorrow"}}
            args = {"action": "type", "text": rng.choice(["weather in paris tomorrow", "Weather in Paris", "flights"])}
        elif kind == 3:
            gt = {"platform": platform, "action": {"action": "terminate", "status": "success"}}
            args = {"action": "terminate", "status": rng.choice(["success", "failure"])}
        elif kind == 4:
            gt = {"platform": platform, "action": {"action": "wait"}}
            args = {"action": "wait", "time": 2}
        else:
            gt = {"platform": platform, "action": {"action": click, "coordinate": [100, 900]}}
            args = {"action": click, "coordinate": [100, 900]}
        body = json.dumps({"name": tool, "arguments": args})
        think = " ".join(rng.choice(words) for _ in range(think_chars // 4))[:think_chars]
        text = f"{think}\n</think>\n\n<tool_call>\n{body}\n</tool_call>"
        if kind == 5:
            text = f"{think}\n</think>\nI will click. {{'name': {tool!r}, 'arguments': {{'action': {click!r}, "  # malformed
        rows.append((text, gt, body))
    return rows


def bench(fn, repeats: int) -> float:
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--n", type=int, default=1024)
    ap.add_argument("--think-chars", type=int, default=2000)
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args()
    rows = make_batch(args.n, args.think_chars)
    bodies = [b for _, _, b in rows]

    t_json = bench(lambda: [json.loads(b) for b in bodies], args.repeats)
    print(f"n={args.n} rollouts, {args.think_chars} reasoning chars each, best of {args.repeats}, one core")
    print(f"{'path':<28}{'ms / batch':>12}{'rollouts/s':>14}{'x json.loads':>14}")
    print(f"{'json.loads (calls only)':<28}{t_json * 1e3:>12.2f}{args.n / t_json:>14,.0f}{1.0:>14.1f}")
    for mode in ("strict", "ui_mopd"):
        t = bench(lambda mode=mode: [compute_score("bench", s, gt, None, mode=mode) for s, gt, _ in rows], args.repeats)
        print(f"{'compute_score ' + mode:<28}{t * 1e3:>12.2f}{args.n / t:>14,.0f}{t / t_json:>14.1f}")
    levels = [compute_score("bench", s, gt)["score"] for s, gt, _ in rows]
    print("levels (strict):", {lv: levels.count(lv) for lv in (1.0, -0.5, -1.0)})


if __name__ == "__main__":
    main()
