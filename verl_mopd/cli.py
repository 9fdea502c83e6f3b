"""``verl-mopd``: the command line of verl-mopd.

    verl-mopd check                  is mopd_k3 registered in verl here? (versions, entry point)
    verl-mopd score ...              score model outputs with the GUI action reward
    verl-mopd prepare ...            clean GUI trajectories and write verl parquet (RL + SFT)
    verl-mopd eval offline|merge ... evaluate a checkpoint step by step; build merge baselines
    verl-mopd validate-recipe FILE [key=value ...] [--print]
                                     compose a recipe with verl's config and check it (no Ray, no GPU)
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
    from verl_mopd.data.cli import add_prepare_arguments
    from verl_mopd.eval.cli import add_eval_arguments

    prepare = sub.add_parser("prepare", help="clean trajectories and write verl parquet")
    add_prepare_arguments(prepare)
    prepare.set_defaults(func=_lazy("verl_mopd.data.cli", "run_prepare"))
    evaluate = sub.add_parser("eval", help="evaluate a checkpoint offline; merge baselines")
    add_eval_arguments(evaluate)
    evaluate.set_defaults(func=_lazy("verl_mopd.eval.cli", "run_eval"))
    recipe = sub.add_parser("validate-recipe", help="compose and check a recipe YAML without Ray or GPUs")
    recipe.add_argument("file", help="recipe YAML, e.g. recipes/ui_mopd/stage2_mopd_qwen3vl8b.yaml")
    recipe.add_argument("overrides", nargs="*", help="hydra overrides key=value, as on the launch command")
    recipe.add_argument("--print", dest="print_config", action="store_true", help="print the resolved config")
    recipe.set_defaults(func=_validate_recipe)
    return parser


def _lazy(module: str, name: str):
    def run(args: argparse.Namespace) -> int:
        import importlib

        return getattr(importlib.import_module(module), name)(args)

    return run


def _validate_recipe(args: argparse.Namespace) -> int:
    from verl_mopd.trainer.validate import validate_recipe_cli

    return validate_recipe_cli(args.file, args.overrides, args.print_config)


def _score(args: argparse.Namespace) -> int:
    from verl_mopd.rewards.cli import run_score

    return run_score(args)


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return int(args.func(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
