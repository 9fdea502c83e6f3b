"""``verl-mopd demo [--steps N] [--out DIR] ...``: the UI-MOPD demo on CPU (see ``verl_mopd.demo.run``)."""

from __future__ import annotations

import argparse
import importlib.util
from dataclasses import fields

from verl_mopd.demo.config import SIZES, DemoConfig
from verl_mopd.errors import UsageError

_HELP = {
    "seeds": "seeds to run (stages 1-2 and every baseline per seed; the table shows mean ± SE)",
    "seed": "first seed",
    "base_seed": "seed of the two pretrained bases (fixed across seeds, like downloaded checkpoints)",
    "pretrain_mobile_share": "mobile share of the bases' pretraining mix",
    "teacher_base_steps": "cap on the pretraining steps of the shared teacher base",
    "base_steps": "cap on the pretraining steps of the student base",
    "teacher_base_acc": "pretrain the teacher base until its validation acc reaches this (0: to the cap)",
    "base_acc": "pretrain the student base until its validation acc reaches this (0: to the cap)",
    "base_check_every": "pretraining steps between the bases' validation checks",
    "base_val_tasks": "validation tasks per platform of the bases' competence check",
    "sft_desktop": "size of the finite desktop stage-1 corpus",
    "sft_mobile": "size of the finite mobile stage-1 corpus",
    "teacher_steps": "stage-1 SFT steps of each teacher on its platform's corpus",
    "steps": "stage-2 RL steps (MOPD and the no-KL GRPO baseline)",
    "mixed_sft_steps": "SFT steps of the mixed-SFT baseline (0: the stage-1 budget, 2 x teacher-steps)",
    "prompts_per_step": "prompts per RL step (half desktop, half mobile)",
    "rollout_n": "rollouts per prompt (GRPO group size)",
    "sft_batch": "SFT batch size",
    "pretrain_lr": "pretraining learning rate of the student base",
    "teacher_pretrain_lr": "pretraining learning rate of the teacher base",
    "sft_lr": "stage-1 fine-tuning learning rate (teachers and the mixed-SFT baseline)",
    "rl_lr": "stage-2 learning rate",
    "beta": "distillation_loss_coef of mopd_k3",
    "tau_kl": "reward gate: KL off for groups whose mean gate metric exceeds this",
    "gate_metric": "reward gate metric: acc (1 iff fully correct) or rm_scores (the task score), as mopd.gate_metric",
    "size": "student model size: micro (32 hidden, 2 layers), tiny (64, 2) or small (128, 3)",
    "teacher_size": "teacher model size (micro, tiny or small)",
    "ties_density": "TIES merge: fraction of each task vector kept",
    "max_new_tokens": "generation budget per response, rollouts and evaluation (32 fits the longest action)",
    "eval_tasks": "held-out tasks per platform for the greedy comparison (same for every seed and model)",
    "teachers": "local: router + hf score_rows in-process; ray: PlatformTeacherGroup hf workers on local Ray",
    "workers": "parallel processes (0: one per seed; teachers=ray runs the seeds in this process)",
    "out": "output folder (metrics.jsonl, summary.json, demo.png, bases/, seed*/); a folder that holds a finished "
           "run is kept, and the run writes beside it (OUT.2, OUT.3, ...)",
    "bases": "folder of the pretrained bases (default OUT/bases): reused when their knobs match, refused (never overwritten) when not",
    "threads": "torch CPU threads per process",
    "log_every": "print a table row every N RL steps",
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
            kwargs = {"choices": list(SIZES)}
        shown = f" (default: {default})" if default != "" else ""
        parser.add_argument(flag, type=type(default), default=default,
                            help=f"{_HELP.get(f.name, f.name)}{shown}", **kwargs)
    return parser


def check_out(out: str) -> None:
    """``--out`` must be a folder (new or not): a file there is refused, naming ``--out``."""
    import os

    if os.path.exists(out) and not os.path.isdir(out):
        raise UsageError(f"--out={out}: is a file, not a folder; give the demo's output folder (default: mopd_demo)")


def run_demo(args: argparse.Namespace) -> int:
    """Build a :class:`DemoConfig` from parsed ``args`` and run the demo. Returns the exit code
    (130 on Ctrl-C, with one line saying the output folder holds no complete run).

    The config, ``--out`` and matplotlib are checked before torch and verl are imported, so a
    mistake is reported at once. A folder holding a finished run is never written into: the run
    goes beside it (:func:`verl_mopd.demo.run.keep_finished_run`), and says so first."""
    import sys

    cfg = DemoConfig(**{f.name: getattr(args, f.name) for f in fields(DemoConfig)})  # a ValueError: exit 2
    check_out(cfg.out)
    if cfg.plot and importlib.util.find_spec("matplotlib") is None:  # the `demo` extra; checked before any work
        raise UsageError("the demo's plot needs matplotlib: pip install -e '.[demo]' (or give --no-plot)")

    from verl_mopd.demo.run import SUMMARY, _quiet, keep_finished_run, run

    _quiet()
    cfg, note = keep_finished_run(cfg)
    if note:
        print(note, flush=True)
    try:
        run(cfg)
    except KeyboardInterrupt:
        print(f"verl-mopd demo: interrupted; {cfg.out} has no {SUMMARY}, the mark of a complete run",
              file=sys.stderr)
        return 130
    return 0
