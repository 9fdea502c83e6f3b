"""``verl-mopd demo [--steps N] [--out DIR] ...``: the UI-MOPD demo on CPU (see ``verl_mopd.demo.run``)."""

from __future__ import annotations

import argparse
from dataclasses import fields

from verl_mopd.demo.run import DemoConfig

_HELP = {
    "steps": "stage-2 RL steps (MOPD and the no-KL GRPO baseline; mixed SFT gets as many)",
    "teacher_steps": "stage-1 SFT steps per platform teacher",
    "teacher_lr": "stage-1 SFT learning rate of the teachers",
    "base_steps": "mixed-SFT steps of the student base before stage 2",
    "prompts_per_step": "prompts per RL step (half desktop, half mobile)",
    "rollout_n": "rollouts per prompt (GRPO group size)",
    "sft_batch": "SFT batch size",
    "beta": "distillation_loss_coef of mopd_k3",
    "tau_kl": "reward gate: KL off for groups whose mean gate metric exceeds this",
    "gate_metric": "reward gate metric: acc (1 iff fully correct) or score",
    "size": "student model size: tiny (64 hidden, 2 layers) or small (128, 3)",
    "teacher_size": "teacher model size (tiny or small)",
    "eval_tasks": "held-out tasks for the final greedy comparison",
    "teachers": "ray: PlatformTeacherGroup hf workers on local Ray; local: same router, in-process",
    "out": "output folder (metrics.jsonl, summary.json, demo.png, teachers/)",
    "threads": "torch CPU threads of the driver",
    "log_every": "print a table row every N steps",
}


def add_demo_arguments(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """Add one ``--flag`` per :class:`DemoConfig` field (``--no-baselines``, ``--no-plot`` for the bools)."""
    defaults = DemoConfig()
    for f in fields(DemoConfig):
        flag = "--" + f.name.replace("_", "-")
        default = getattr(defaults, f.name)
        if isinstance(default, bool):
            parser.add_argument("--no-" + f.name.replace("_", "-"), dest=f.name, action="store_false",
                                help=f"skip the {f.name}")
            parser.set_defaults(**{f.name: default})
            continue
        kwargs = {"choices": ["ray", "local"]} if f.name == "teachers" else {}
        if f.name in ("size", "teacher_size"):
            kwargs = {"choices": ["tiny", "small"]}
        parser.add_argument(flag, type=type(default), default=default,
                            help=f"{_HELP.get(f.name, f.name)} (default: {default})", **kwargs)
    return parser


def run_demo(args: argparse.Namespace) -> int:
    """Build a :class:`DemoConfig` from parsed ``args`` and run the demo. Returns the exit code."""
    import transformers

    from verl_mopd.demo.run import run

    transformers.utils.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()
    cfg = DemoConfig(**{f.name: getattr(args, f.name) for f in fields(DemoConfig)})
    run(cfg)
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m verl_mopd.demo", description=__doc__)
    return run_demo(add_demo_arguments(parser).parse_args(argv))
