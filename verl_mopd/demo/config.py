"""The demo's knobs (:class:`DemoConfig`), its names (platforms, models, metric fields) and its seed streams.

No torch here: ``verl-mopd demo --help`` builds its flags from :class:`DemoConfig` without importing torch or verl.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

#: model sizes: hidden, layers, heads, kv heads
SIZES = {
    "micro": dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1),
    "tiny": dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2),
    "small": dict(hidden_size=128, num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=2),
}

PLATFORMS = ("desktop", "mobile")
#: the reward gate's metrics, named as ``mopd.gate_metric`` names them: ``acc`` (1 iff fully correct) or
#: ``rm_scores`` (the task score, +1 / -0.5 / -1)
GATE_METRICS = ("acc", "rm_scores")
#: every per-step record of ``metrics.jsonl`` has these keys
METRIC_FIELDS = (
    "run", "seed", "step", "time_s", "loss", "pg_loss", "mask_on_fraction", "grad_ratio",
    *[f"{k}/{p}" for k in ("reward", "acc", "k3", "teacher_samples") for p in PLATFORMS],
)
#: the models every seed evaluates, in table order
MODELS = ("teacher:desktop", "teacher:mobile", "teacher base", "student base", "MOPD student", "GRPO, no KL",
          "mixed SFT", "desktop SFT", "mobile SFT", "weight average", "TIES")
#: the baselines MOPD is compared with, paired per seed (``desktop SFT`` / ``mobile SFT``: the student base
#: fine-tuned on one corpus; the weight average and TIES merge those two)
BASELINES = ("GRPO, no KL", "mixed SFT", "desktop SFT", "mobile SFT", "weight average", "TIES", "student base")
#: the fixed held-out eval set (the same tasks for every seed and method)
EVAL_SEED = 999_999
_STREAMS = {"teacher_init": 1, "student_init": 2, "teacher_base_data": 3, "student_base_data": 4,
            "sft:desktop": 5, "sft:mobile": 6, "teacher:desktop": 7, "teacher:mobile": 8, "mixed": 9,
            "rl_prompts": 10, "rollout": 11, "base_val": 12}  # the data roles: each draws its own seeds


def _seed(seed: int, stream: str, step: int = 0) -> int:
    """An independent 31-bit seed per (run seed, data role, step)."""
    return int(np.random.SeedSequence([seed, _STREAMS[stream], step]).generate_state(1)[0] >> 1)


@dataclass
class DemoConfig:
    """Sizes and knobs of the demo (defaults: the full demo, 3 seeds).

    seeds / seed: how many seeds, from ``seed`` on; workers: parallel processes (0: one per seed
        with ``teachers=local``, 1 with ``teachers=ray``); threads: torch threads per process.
    base_seed: seed of the two pretrained bases, which every seed shares (the paper's two
        Qwen3-VL checkpoints); pretrain_mobile_share: mobile share of their pretraining mix;
        teacher_pretrain_lr / pretrain_lr: their pretraining lr (constant, no warm-up, decay or
        clip: a warm-up + decay-to-0 schedule stalls the tiny base before it learns to copy
        coordinates). Each base pretrains until it is competent: every ``base_check_every`` steps
        its greedy acc on ``base_val_tasks`` fresh validation tasks per platform is measured, and it
        stops at the first check at its target, ``teacher_base_acc`` / ``base_acc``;
        ``teacher_base_steps`` / ``base_steps`` is the cap (a target of 0: stop at the cap). So
        another ``base_seed`` gives bases of the same competence, not of the same age
        (``scripts/demo_readme.py bases``). The targets: the teacher base at 0.9 (base seed 0: step
        80, 0.95), the student base at 0.56 (step 55, 0.57: past the action names, most clicks still
        missed, so no stage-2 method starts near a solved task). With the student base stopped at
        80 steps instead (0.68, clicking at 0.24 / 0.45), GRPO alone sometimes learns the desktop
        click and sometimes loses it, which made MOPD's desktop lead over it a tie on most windows
        of 3 consecutive seeds; from 0.56 GRPO alone does not take off (docs/demo.md).
    sft_desktop / sft_mobile: sizes of the finite stage-1 corpora; teacher_steps: each teacher's
        SFT steps on its corpus (passes over it, reshuffled); sft_lr: the stage-1 fine-tuning lr
        of the teachers and mixed SFT (a converged base fine-tuned at its pretraining lr can
        collapse in a few Adam steps).
    steps: stage-2 RL steps (MOPD and the no-KL GRPO baseline), ``prompts_per_step`` x
        ``rollout_n`` rollouts each (GRPO groups of ``rollout_n``); 350: at 250, MOPD's mobile
        rollout reward was still rising on every seed and its mobile acc ended at 0.81-0.90 on 4
        of 9 seeds (the portrait frame is the slower skill); at 350 it is at 0.89-1.00 on all 9.
    mixed_sft_steps: SFT steps of the mixed-SFT baseline on the union of the corpora (``sft_batch``
        samples at ``sft_lr``); 0 = the stage-1 budget, ``2 * teacher_steps`` (as many samples as
        the two teachers together), which is the paper's baseline: the stage-1 recipe on the
        mixed data. ``mixed_sft_steps = steps`` gives it as many optimizer steps as RL instead.
    beta: ``distillation_loss_coef`` (0.3: chosen by the logged sweep in the README; the paper's
        0.01 makes the K3 term ~2% of the update at this scale); tau_kl / gate_metric: the gate.
    eval_tasks: held-out tasks PER PLATFORM, the same for every seed and model.
    teachers: ``local`` (router + hf ``score_rows`` in-process) or ``ray`` (PlatformTeacherGroup,
        hf workers on local Ray).
    max_new_tokens: 32 fits the longest target (mobile ``swipe``: 31 tokens + ``<eos>``).
    out: output folder; bases: folder of the pretrained bases (default ``<out>/bases``), reused
        when their knobs match, so runs that differ only in stage-1/2 knobs can share them.
    """

    seeds: int = 3
    seed: int = 0
    base_seed: int = 0
    pretrain_mobile_share: float = 0.6
    teacher_base_steps: int = 160
    base_steps: int = 160
    teacher_base_acc: float = 0.9
    base_acc: float = 0.56
    base_check_every: int = 5
    base_val_tasks: int = 128
    sft_desktop: int = 128
    sft_mobile: int = 64
    teacher_steps: int = 20
    steps: int = 350
    mixed_sft_steps: int = 0
    prompts_per_step: int = 16
    rollout_n: int = 4
    sft_batch: int = 64
    pretrain_lr: float = 5e-3
    teacher_pretrain_lr: float = 3e-3
    sft_lr: float = 1e-3
    rl_lr: float = 1e-3
    beta: float = 0.3
    tau_kl: float = 0.5
    gate_metric: str = "acc"
    size: str = "tiny"
    teacher_size: str = "small"
    ties_density: float = 0.5
    eval_tasks: int = 512
    max_new_tokens: int = 32
    teachers: str = "local"
    baselines: bool = True
    workers: int = 0
    threads: int = 1
    log_every: int = 10
    out: str = "mopd_demo"
    bases: str = ""
    plot: bool = True

    def __post_init__(self):
        for name in ("seeds", "teacher_base_steps", "base_steps", "sft_desktop", "sft_mobile", "teacher_steps", "steps",
                     "mixed_sft_steps", "prompts_per_step", "rollout_n", "sft_batch", "eval_tasks", "max_new_tokens",
                     "threads", "log_every", "workers", "seed", "base_seed", "base_check_every", "base_val_tasks"):
            v = getattr(self, name)
            low = 0 if name.endswith("steps") or name in ("workers", "seed", "base_seed") else 1
            if not isinstance(v, int) or isinstance(v, bool) or v < low:
                raise ValueError(f"demo.{name}={v!r}: must be an integer >= {low}")
        if self.rollout_n < 2:
            raise ValueError(f"demo.rollout_n={self.rollout_n}: GRPO needs >= 2 rollouts per prompt")
        if self.prompts_per_step % 2:
            raise ValueError(f"demo.prompts_per_step={self.prompts_per_step}: must be even (both platforms)")
        if self.teachers not in ("ray", "local"):
            raise ValueError(f"demo.teachers={self.teachers!r}: allowed 'ray', 'local'")
        if self.teachers == "ray" and self.workers > 1:
            raise ValueError(f"demo.workers={self.workers} with teachers='ray': the Ray teacher group runs "
                             "in one driver process; use workers=1 (seeds run one after another) or teachers='local'")
        for name in ("size", "teacher_size"):
            if getattr(self, name) not in SIZES:
                raise ValueError(f"demo.{name}={getattr(self, name)!r}: allowed {sorted(SIZES)}")
        if self.gate_metric not in GATE_METRICS:
            raise ValueError(f"demo.gate_metric={self.gate_metric!r}: allowed {', '.join(map(repr, GATE_METRICS))} "
                             "(the names of mopd.gate_metric)")
        for name in ("pretrain_lr", "teacher_pretrain_lr", "sft_lr", "rl_lr", "beta", "tau_kl"):
            v = getattr(self, name)
            if not isinstance(v, (int, float)) or not math.isfinite(v) or v < 0 or (name.endswith("lr") and v == 0):
                raise ValueError(f"demo.{name}={v!r}: must be a finite number "
                                 f"{'> 0' if name.endswith('lr') else '>= 0'}")
        for name in ("teacher_base_acc", "base_acc"):
            v = getattr(self, name)
            if not isinstance(v, (int, float)) or isinstance(v, bool) or not 0.0 <= v <= 1.0:
                raise ValueError(f"demo.{name}={v!r}: must be a validation acc in [0, 1] (0: stop at the step count)")
        if not 0.0 <= self.pretrain_mobile_share <= 1.0:
            raise ValueError(f"demo.pretrain_mobile_share={self.pretrain_mobile_share!r}: must be in [0, 1]")
        if not 0.0 < self.ties_density <= 1.0:
            raise ValueError(f"demo.ties_density={self.ties_density!r}: must be in (0, 1]")

    @property
    def mixed_steps(self) -> int:
        """SFT steps of the mixed-SFT baseline (``mixed_sft_steps``, or the stage-1 budget)."""
        return self.mixed_sft_steps or 2 * self.teacher_steps

    @property
    def n_workers(self) -> int:
        if self.teachers == "ray":
            return 1
        return min(self.seeds, self.workers or self.seeds)


def _plural(n: int, one: str, many: str | None = None) -> str:
    """``1 seed``, ``3 seeds``."""
    return f"{n} {one if n == 1 else (many or one + 's')}"
