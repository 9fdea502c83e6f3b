"""``verl-mopd``: the command line of verl-mopd.

    verl-mopd check                  is mopd_k3 registered in verl here? GPU stack versions vs supported
    verl-mopd demo [--steps N] [--out DIR]
                                     both UI-MOPD stages end to end on CPU with tiny models
    verl-mopd score ...              score model outputs with the GUI action reward
    verl-mopd prepare ...            clean GUI trajectories and write verl parquet (RL + SFT)
    verl-mopd eval offline|merge ... evaluate a checkpoint step by step; build merge baselines
    verl-mopd inspect DIR [--out FILE] [--tokenizer PATH]
                                     a run's step dumps (or verl's rollout dumps) as one static HTML page
    verl-mopd smoke [--device cpu|cuda] [--out DIR]
                                     both stages through verl's real trainers on tiny Qwen3-VL, checked
    verl-mopd validate-recipe FILE [key=value ...] [--print]
                                     compose a recipe with verl's config and check it (no Ray, no GPU)

Only the chosen command's module is imported (verl and torch take seconds to import): ``--help``,
``--version`` and a mistyped command answer without either. Each command is one entry of
:data:`COMMANDS`: its help, the function that adds its arguments and the one that runs it, both
named as ``"module:function"`` and imported only when that command is chosen.

Known third-party start-up warnings (:mod:`verl_mopd.quiet`) are hidden unless ``--debug``.

Errors: :func:`main` is the one error boundary. A user mistake (a bad option value, a missing
or malformed file, a bad line) is printed as one line, ``verl-mopd <command>: error: ...``,
naming the option or ``file:line``, and the exit code is 2; which exceptions count as user
mistakes is defined in :mod:`verl_mopd.errors` (raise ``verl_mopd.errors.UsageError`` for new
ones). Anything else is a bug and keeps its traceback. ``--debug`` anywhere on the command line
(or ``VERL_MOPD_DEBUG=1``) shows the traceback of user errors too. Exit codes: 0 success, 1 the
command ran and found problems (``validate-recipe``), failures (``eval offline``) or nothing to
keep (``prepare``; with ``--strict``, unreadable lines), 2 a user mistake (argparse's own errors
included), 130 interrupted.
"""

from __future__ import annotations

import argparse
import difflib
import importlib
import os
import sys
import traceback

#: command -> (help, "module:add_arguments" or None, "module:run")
COMMANDS = {
    "check": ("check that mopd_k3 is registered in verl here (versions, entry point, GPU packages, Megatron stack)",
              None, "verl_mopd.cli:_check"),
    "demo": ("both UI-MOPD stages end to end on CPU (tiny models, no download)",
             "verl_mopd.demo.cli:add_demo_arguments", "verl_mopd.demo.cli:run_demo"),
    "score": ("score model outputs with the GUI action reward",
              "verl_mopd.rewards.cli:add_score_arguments", "verl_mopd.rewards.cli:run_score"),
    "prepare": ("clean trajectories and write verl parquet",
                "verl_mopd.data.cli:add_prepare_arguments", "verl_mopd.data.cli:run_prepare"),
    "eval": ("evaluate a checkpoint offline; merge baselines",
             "verl_mopd.eval.cli:add_eval_arguments", "verl_mopd.eval.cli:run_eval"),
    "inspect": ("a run's dumps as one static HTML page: per platform, the tokens where teacher and student disagree (K3)",
                "verl_mopd.inspect.cli:add_inspect_arguments", "verl_mopd.inspect.cli:run_inspect"),
    "smoke": ("both UI-MOPD stages through verl's own trainers on tiny Qwen3-VL models, then checks",
              "verl_mopd.testing.smoke:add_smoke_arguments", "verl_mopd.testing.smoke:run_smoke_command"),
    "validate-recipe": ("compose and check a recipe YAML without Ray or GPUs",
                        "verl_mopd.cli:_validate_recipe_arguments", "verl_mopd.cli:_validate_recipe"),
}


def _load(ref: str):
    module, name = ref.split(":")
    return getattr(importlib.import_module(module), name)


def _check(args: argparse.Namespace) -> int:
    import importlib.metadata as md

    import verl  # noqa: F401  (loads the verl.plugins entry points)

    from verl_mopd import __version__, verl_loss

    eps = [ep for ep in md.entry_points(group="verl.plugins") if ep.name == "verl_mopd"]
    print(f"verl-mopd {__version__}, verl {md.version('verl')}, torch {md.version('torch')}")
    print(f"entry point verl.plugins: {eps[0].value if eps else 'MISSING (reinstall verl-mopd)'}")
    ok = verl_loss.is_registered()
    print(f"loss_mode={verl_loss.MOPD_LOSS_MODE} registered after `import verl`: {ok}")
    if not ok:
        try:
            verl_loss.require_registered()
        except RuntimeError as exc:
            print(exc, file=sys.stderr)
    from verl_mopd.install_check import print_attention_backend, print_gpu_stack
    from verl_mopd.teachers.backends.megatron import check_megatron_stack

    print_gpu_stack()  # informational: versions against the supported GPU stack (GPU nodes)
    print_attention_backend()  # the backend Transformer Engine will use (n/a without TE, on CPU)
    check_megatron_stack()  # informational: needed only by Megatron runs (GPU nodes)
    return 0 if ok else 1


def _validate_recipe_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("file", help="recipe YAML, e.g. recipes/ui_mopd/stage2_mopd_qwen3vl8b.yaml")
    parser.add_argument("overrides", nargs="*", help="hydra overrides key=value, as on the launch command")
    parser.add_argument("--print", dest="print_config", action="store_true", help="print the resolved config")
    parser.add_argument("--head", action="store_true",
                        help="this is the cluster's head node, where the run starts (run_stage1.sh and run_stage2.sh "
                             "pass it): a local path (student, data, teacher) missing here is an error, not a warning")


def _validate_recipe(args: argparse.Namespace) -> int:
    from verl_mopd.checks.recipe_cli import validate_recipe_cli

    return validate_recipe_cli(args.file, args.overrides, args.print_config, args.head)


def _version() -> str:
    import importlib.metadata as md

    from verl_mopd import __version__

    try:
        return f"verl-mopd {__version__} (verl {md.version('verl')})"
    except md.PackageNotFoundError:
        return f"verl-mopd {__version__} (verl not installed)"


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """The parser; only ``command``'s arguments are loaded (none when None: the list of commands)."""
    parser = argparse.ArgumentParser(prog="verl-mopd", description="Multi-teacher on-policy distillation for verl")
    parser.add_argument("--debug", action="store_true",
                        help="show tracebacks of user errors and third-party start-up warnings (also: VERL_MOPD_DEBUG=1)")
    parser.add_argument("--version", action="version", version=_version(), help="print the versions and exit")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name, (help_text, add_arguments, run) in COMMANDS.items():
        p = sub.add_parser(name, help=help_text, description=help_text)
        if add_arguments and command == name:
            _load(add_arguments)(p)
        p.set_defaults(func=run)
    return parser


def _unknown_command(parser: argparse.ArgumentParser, command: str) -> None:
    """argparse's error for a command that does not exist, with the nearest one (exit 2)."""
    close = difflib.get_close_matches(command, COMMANDS, n=1, cutoff=0.5)
    hint = f"; did you mean {close[0]!r}?" if close else ""
    parser.error(f"unknown command {command!r}{hint} (commands: {', '.join(COMMANDS)})")


def main(argv: list[str] | None = None) -> int:
    """Run one command; user mistakes become a one-line message and exit code 2 (module docstring)."""
    from verl_mopd.errors import user_error_message

    argv = sys.argv[1:] if argv is None else list(argv)
    end = argv.index("--") if "--" in argv else len(argv)
    debug = "--debug" in argv[:end] or os.environ.get("VERL_MOPD_DEBUG", "") not in ("", "0")
    argv = [a for i, a in enumerate(argv) if not (a == "--debug" and i < end)]
    command = next((a for a in argv if not a.startswith("-")), None)
    parser = build_parser(command if command in COMMANDS else None)
    if command is not None and command not in COMMANDS:
        _unknown_command(parser, command)
    args = parser.parse_args(argv)
    if not debug:
        from verl_mopd.quiet import hide_known_warnings

        hide_known_warnings()
    try:
        return int(_load(args.func)(args) or 0)
    except KeyboardInterrupt:
        if debug:
            raise
        print(f"verl-mopd {args.command}: interrupted", file=sys.stderr)
        return 130
    except (Exception, SystemExit) as exc:
        message = user_error_message(exc)
        if message is None:
            if isinstance(exc, SystemExit):
                raise
            print(f"verl-mopd {args.command}: internal error (please report it with the traceback below)", file=sys.stderr)
            raise
        if debug:
            traceback.print_exc()
        print(f"verl-mopd {args.command}: error: {message}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
