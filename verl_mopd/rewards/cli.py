"""``verl-mopd score``: score one response or a JSONL file of rollouts.

``verl_mopd/cli.py`` mounts this with :func:`add_score_arguments` + :func:`run_score`; it also
runs alone as ``python -m verl_mopd.rewards``.

    verl-mopd score --platform mobile --truth '{"action": {"action": "click", "coordinate": [500, 300]}}' \\
        '<tool_call>{"name": "mobile_use", "arguments": {"action": "click", "coordinate": [505, 298]}}</tool_call>'
    verl-mopd score --file rollouts.jsonl [--mode ui_mopd] [--preset aitw] [--out scored.jsonl]

A JSONL line holds ``response`` (or ``solution_str``), ``ground_truth`` and optionally
``extra_info`` and ``data_source``. The summary (per platform) goes to stdout as JSON.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from verl_mopd.rewards.score import MODES, PRESETS, compute_score, summarize


def add_score_arguments(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    parser.add_argument("response", nargs="?", help="model text to score (omit with --file)")
    parser.add_argument("--truth", help="ground truth: our JSON layout or a <tool_call> string")
    parser.add_argument("--platform", choices=["desktop", "mobile"], help="fills 'platform' into --truth JSON")
    parser.add_argument("--extra-info", default=None, help="JSON object passed as extra_info")
    parser.add_argument("--file", help="JSONL of {response|solution_str, ground_truth, extra_info?}")
    parser.add_argument("--out", help="with --file: write one scored JSON line per input line here")
    parser.add_argument("--mode", choices=list(MODES), default="strict")
    parser.add_argument("--preset", choices=list(PRESETS), default=None)
    return parser


def _kwargs(args: argparse.Namespace) -> dict[str, Any]:
    return {"preset": args.preset} if args.preset else {}


def run_score(args: argparse.Namespace) -> int:
    if args.file:
        results = []
        out = open(args.out, "w", encoding="utf-8") if args.out else None
        try:
            with open(args.file, encoding="utf-8") as f:
                for lineno, line in enumerate(f, 1):
                    if not line.strip():
                        continue
                    row = json.loads(line)
                    text = row.get("response", row.get("solution_str"))
                    if text is None or "ground_truth" not in row:
                        raise SystemExit(f"{args.file}:{lineno}: needs 'response' (or 'solution_str') and 'ground_truth'")
                    r = compute_score(
                        row.get("data_source"), text, row["ground_truth"], row.get("extra_info"), args.mode, **_kwargs(args)
                    )
                    results.append(r)
                    if out:
                        out.write(json.dumps({**row, "reward": r}, ensure_ascii=False) + "\n")
        finally:
            if out:
                out.close()
        print(json.dumps(summarize(results), indent=2))
        return 0
    if args.response is None or args.truth is None:
        raise SystemExit("score: give a response and --truth, or --file")
    truth: Any = args.truth
    if truth.lstrip().startswith("{"):
        truth = json.loads(truth)
        if args.platform:
            truth.setdefault("platform", args.platform)
    extra = json.loads(args.extra_info) if args.extra_info else None
    r = compute_score(None, args.response, truth, extra, args.mode, **_kwargs(args))
    print(json.dumps(r, ensure_ascii=False))
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = add_score_arguments(argparse.ArgumentParser(prog="verl-mopd score", description=__doc__.split("\n")[0]))
    return run_score(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
