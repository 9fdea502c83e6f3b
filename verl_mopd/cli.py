"""``verl-mopd``: the command line of verl-mopd.

    verl-mopd check                  is mopd_k3 registered in verl here? (versions, entry point)
    verl-mopd score ...              score model outputs with the GUI action reward
"""

from __future__ import annotations

import argparse
import sys


def _check(args: argparse.Namespace) -> int:
    import importlib.metadata as md

    import verl  # noqa: F401  (loads the verl.plugins entry points)

    from verl_mopd import __version__, plugin

    eps = [ep for ep in md.entry_points(group="verl.plugins") if ep.name == "verl_mopd"]
    print(f"verl-mopd {__version__}, verl {md.version('verl')}, torch {md.version('torch')}")
    print(f"entry point verl.plugins: {eps[0].value if eps else 'MISSING (reinstall verl-mopd)'}")
    ok = plugin.is_registered()
    print(f"loss_mode={plugin.MOPD_LOSS_MODE} registered after `import verl`: {ok}")
    if not ok:
        try:
            plugin.require_registered()
        except RuntimeError as exc:
            print(exc, file=sys.stderr)
    return 0 if ok else 1


def build_parser() -> argparse.ArgumentParser:
    from verl_mopd.rewards.cli import add_score_arguments

    parser = argparse.ArgumentParser(prog="verl-mopd", description="Multi-teacher on-policy distillation for verl")
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("check", help="check that mopd_k3 is registered in verl").set_defaults(func=_check)
    score = sub.add_parser("score", help="score model outputs with the GUI action reward")
    add_score_arguments(score)
    score.set_defaults(func=_score)
    return parser


def _score(args: argparse.Namespace) -> int:
    from verl_mopd.rewards.cli import run_score

    return run_score(args)


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return int(args.func(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
