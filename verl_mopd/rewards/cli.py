"""``verl-mopd score``: score one response or a JSONL file of rollouts.

``verl_mopd/cli.py`` mounts this with :func:`add_score_arguments` + :func:`run_score`.

    verl-mopd score --platform mobile --truth '{"action": {"action": "click", "coordinate": [500, 300]}}' \\
        '<tool_call>{"name": "mobile_use", "arguments": {"action": "click", "coordinate": [505, 298]}}</tool_call>'
    verl-mopd score --file rollouts.jsonl [--mode ui_mopd] [--preset aitw] [--out scored.jsonl]

A JSONL line holds ``response`` (or ``solution_str``), ``ground_truth`` and optionally
``extra_info`` and ``data_source``. The summary (per platform) goes to stdout as JSON.

``--out`` is written whole or not at all (a temporary file renamed at the end): a bad line or a
typo in ``--file`` leaves an existing ``--out`` untouched, and ``--out`` naming ``--file`` is
refused. Mistakes raise :class:`~verl_mopd.errors.UsageError` naming the option or ``file:line``.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
from collections.abc import Iterator
from typing import Any

from verl_mopd.errors import UsageError
from verl_mopd.files import atomic_write, json_line, refuse_overwrite
from verl_mopd.rewards.score import MODES, PRESETS, compute_score, summarize


def add_score_arguments(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    parser.add_argument("response", nargs="?", help="model text to score (omit with --file)")
    parser.add_argument("--truth", help="ground truth: our JSON layout or a <tool_call> string")
    parser.add_argument("--platform", choices=["desktop", "mobile"], help="fills 'platform' into --truth JSON")
    parser.add_argument("--extra-info", default=None, help="JSON object passed as extra_info")
    parser.add_argument("--file", help="JSONL of {response|solution_str, ground_truth, extra_info?}")
    parser.add_argument("--out", help="with --file: write one scored JSON line per input line here")
    parser.add_argument("--mode", choices=list(MODES), default="strict",
                        help="strict: +1 correct / -0.5 partly wrong / -1 unparseable; ui_mopd: the public UI-MOPD "
                             "release's reward, exactly (default: %(default)s)")
    parser.add_argument("--preset", choices=list(PRESETS), default=None,
                        help="strict mode: the click and text tolerances of a published evaluator "
                             "(default: Qwen2.5-VL's AndroidControl rule)")
    return parser


def _kwargs(args: argparse.Namespace) -> dict[str, Any]:
    return {"preset": args.preset} if args.preset else {}


def _json_option(option: str, text: str) -> Any:
    try:
        return json.loads(text)
    except json.JSONDecodeError as e:
        raise UsageError(f"{option}: not JSON ({e.msg} at column {e.colno}): {text[:80]!r}") from None


def _rows(path: str) -> Iterator[tuple[int, dict[str, Any]]]:
    """``(line number, row)`` of a JSONL file; errors name ``path:line``."""
    with open(path, "rb") as f:
        for lineno, raw in enumerate(f, 1):
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError as e:
                raise UsageError(f"{path}:{lineno}: not UTF-8 text (byte {e.start}: {e.reason})") from None
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as e:
                raise UsageError(f"{path}:{lineno}: not JSON ({e.msg} at column {e.colno})") from None
            if not isinstance(row, dict):
                raise UsageError(f"{path}:{lineno}: a {type(row).__name__}, expected a JSON object")
            yield lineno, row


def _score_file(args: argparse.Namespace) -> int:
    if args.out:
        refuse_overwrite(args.out, [args.file], "--out")
    if not os.path.isfile(args.file):
        raise UsageError(f"--file={args.file}: {'a folder, not a file' if os.path.isdir(args.file) else 'no such file'}")
    results = []
    with atomic_write(args.out) if args.out else contextlib.nullcontext() as out:
        for lineno, row in _rows(args.file):
            text = row.get("response", row.get("solution_str"))
            if text is None or "ground_truth" not in row:
                raise UsageError(f"{args.file}:{lineno}: needs 'response' (or 'solution_str') and 'ground_truth'")
            try:
                r = compute_score(
                    row.get("data_source"), text, row["ground_truth"], row.get("extra_info"), args.mode, **_kwargs(args)
                )
            except ValueError as e:
                raise UsageError(f"{args.file}:{lineno}: {e}") from None
            results.append(r)
            if out is not None:
                out.write(json_line({**row, "reward": r}))
    print(json.dumps(summarize(results), indent=2))
    return 0


def run_score(args: argparse.Namespace) -> int:
    if args.file:
        return _score_file(args)
    if args.out:
        raise UsageError("--out needs --file")
    if args.response is None or args.truth is None:
        raise UsageError("give a response and --truth, or --file")
    truth: Any = args.truth
    if truth.lstrip().startswith("{"):
        truth = _json_option("--truth", truth)
        if args.platform:
            truth.setdefault("platform", args.platform)
    extra = _json_option("--extra-info", args.extra_info) if args.extra_info else None
    if extra is not None and not isinstance(extra, dict):
        raise UsageError(f"--extra-info: a JSON {type(extra).__name__}, expected an object")
    try:
        r = compute_score(None, args.response, truth, extra, args.mode, **_kwargs(args))
    except ValueError as e:
        raise UsageError(f"--truth: {e}") from None
    print(json.dumps(r, ensure_ascii=False))
    return 0
