"""Score a JSONL of GUI-agent outputs with verl-mopd's reward and print the per-platform level histogram.

    python examples/reward_only/score_outputs.py examples/reward_only/outputs.jsonl
    python examples/reward_only/score_outputs.py my_rollouts.jsonl --mode ui_mopd --show 0

One JSON object per line: ``response`` (or ``solution_str``), ``ground_truth`` (our layout, or the
release's ``<tool_call>`` string) and optionally ``extra_info`` / ``data_source``, the columns
``verl-mopd score --file`` reads. Each line is scored by ``compute_score``, the function verl calls
through ``reward.custom_reward_function``, so the levels here are the rewards a training run sees.
"""

from __future__ import annotations

import argparse
import json
import sys

from verl_mopd.rewards import compute_score, summarize

LEVELS = (("correct", "+1.0 correct"), ("partial", "-0.5 partial"), ("invalid", "-1.0 invalid"))


def read_outputs(path: str) -> list[dict]:
    rows = []
    with open(path, encoding="utf-8") as f:
        for lineno, line in enumerate(f, 1):
            if not line.strip():
                continue
            row = json.loads(line)
            if row.get("response", row.get("solution_str")) is None or "ground_truth" not in row:
                sys.exit(f"{path}:{lineno}: needs 'response' (or 'solution_str') and 'ground_truth'")
            rows.append(row)
    return rows


def score_rows(rows: list[dict], mode: str) -> list[dict]:
    return [compute_score(r.get("data_source"), r.get("response", r.get("solution_str")), r["ground_truth"],
                          r.get("extra_info"), mode) for r in rows]


def histogram(summary: dict, width: int = 20) -> str:
    """One line per platform: count and bar per reward level, mean score and acc."""
    lines = [f"{'platform':<9} {'n':>4} " + " ".join(f"{title:<{width + 4}}" for _, title in LEVELS)
             + f" {'score':>6} {'acc':>5}"]
    for platform in sorted(p for p in summary if p != "all") + ["all"]:
        s = summary[platform]
        bars = " ".join(f"{s[k]:>3} {'#' * round(width * s[k] / s['n']):<{width}}" for k, _ in LEVELS)
        lines.append(f"{platform:<9} {s['n']:>4} {bars} {s['score']:>+6.3f} {s['acc']:>5.2f}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("path", help="JSONL of model outputs")
    p.add_argument("--mode", choices=["strict", "ui_mopd"], default="strict",
                   help="strict (ours) or ui_mopd (the public release's reward, exactly)")
    p.add_argument("--show", type=int, default=15, help="print the first N scored lines")
    args = p.parse_args(argv)
    rows = read_outputs(args.path)
    results = score_rows(rows, args.mode)
    for row, r in list(zip(rows, results, strict=True))[: args.show]:
        print(f"{r['score']:+5.1f}  {r['platform']:<8} {r['reason']:<22} {row.get('id', '')}  "
              f"{row.get('note', '')}")
    summary = summarize(results)
    print(f"\n{args.path} (mode={args.mode})\n{histogram(summary)}")
    return summary


if __name__ == "__main__":
    main()
