"""Config dataclasses of the MOPD loss and gate (the single source of truth for their defaults).

- :class:`MOPDDistillationLossConfig` extends verl's ``DistillationLossConfig`` with the K3
  knobs; select it in YAML with ``distillation.distillation_loss._target_:
  verl_mopd.config.MOPDDistillationLossConfig`` (our ``trainer/config/mopd.yaml`` does). Without
  it, ``mopd_k3`` uses the same defaults (``verl_mopd.losses.K3_*``).
- :class:`MOPDConfig` owns the whole ``mopd:`` block (the reward gate of ``verl_mopd.trainer.gate``
  and the teachers of ``verl_mopd.teachers``) and refuses unknown keys; beta is verl's own
  ``distillation_loss_coef``.
"""

from __future__ import annotations

import difflib
import math
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from typing import Any

from omegaconf import DictConfig, OmegaConf
from verl.base_config import BaseConfig
from verl.workers.config import DistillationLossConfig

from verl_mopd.errors import ConfigError
from verl_mopd.losses import K3_CLAMP_BELOW, K3_LINEAR_ABOVE, KL_MASK_KEY, TEACHER_LOGPROBS_KEY

GATE_NORMALIZATIONS = ("all", "kept")


@dataclass
class MOPDDistillationLossConfig(DistillationLossConfig):
    """verl's ``DistillationLossConfig`` plus the ``mopd_k3`` knobs.

    k3_linear_above (float): K3 continues linearly (tangent) above this ``d = log p_T - log p_S``;
        must be >= 2.61 so that mopd_k3 equals verl's k3 wherever verl does not clamp.
    k3_clamp_below (float): K3 is held constant below this ``d`` (finite for ``-inf`` teacher
        log-probs); must be <= -11 for the same reason.
    use_rollout_is_weights (bool): multiply the per-token K3 by verl's ``rollout_is_weights`` when the
        batch has them (rollout correction on), as the public UI-MOPD release does.
    """

    loss_mode: str = "mopd_k3"
    use_policy_gradient: bool = False
    loss_max_clamp: float | None = None
    log_prob_min_clamp: float | None = None
    k3_linear_above: float = K3_LINEAR_ABOVE
    k3_clamp_below: float = K3_CLAMP_BELOW
    use_rollout_is_weights: bool = True

    def __post_init__(self):
        from verl_mopd.verl_loss import register_loss

        register_loss()  # this config is only built where mopd_k3 is meant to be available
        errors = []
        if self.loss_mode == "mopd_k3":
            if self.use_policy_gradient:
                errors.append(
                    "distillation.distillation_loss.use_policy_gradient=True: mopd_k3 is a supervised loss; "
                    "set it to false"
                )
            if self.loss_max_clamp is not None:
                errors.append(
                    f"distillation.distillation_loss.loss_max_clamp={self.loss_max_clamp}: verl clamps the "
                    "per-token loss there, which zeroes mopd_k3's gradient exactly where it was kept; set null"
                )
        if not self.k3_linear_above >= 2.61:
            errors.append(f"distillation.distillation_loss.k3_linear_above={self.k3_linear_above}: must be >= 2.61")
        if not self.k3_clamp_below <= -11.0:
            errors.append(f"distillation.distillation_loss.k3_clamp_below={self.k3_clamp_below}: must be <= -11")
        if errors:
            raise ConfigError(errors, "mopd_k3 loss config")
        super().__post_init__()


#: keys that earlier versions read from the ``mopd`` block -> what to do instead
REMOVED_KEYS = {
    "beta": "beta is verl's distillation.distillation_loss.distillation_loss_coef (UI-MOPD: 0.01); set that instead",
    "platform_key": "the platform column has one name, mopd.routing_key; set that instead",
    "mask_key": f"the gate is always stored as {KL_MASK_KEY!r}, the field the loss reads; delete the key",
    "output_key": f"teacher log-probs are always stored as {TEACHER_LOGPROBS_KEY!r}, the field the loss reads; "
                  "delete the key",
}


@dataclass
class MOPDConfig(BaseConfig):
    """The whole ``mopd:`` block: the reward gate (computed on the driver each step) and the teachers.

    enable (bool): compute and store the gate ``mopd_kl_mask``; off = KL on for every sample.
    tau_kl (float): KL off for every rollout of a group whose mean ``gate_metric`` exceeds this.
        Default 0.5 on ``acc``: every shipped run; the public release's ``kl_threshold=0.1`` gate
        would switch the KL off for every group its filter keeps (docs/reproduce.md).
    gate_metric (str): ``rm_scores`` (the task score, summed over tokens) or the name of a reward
        extra returned by the reward function (``acc``: 1.0 iff the action is fully correct).
    group_key (str): the stored field holding the GRPO group id (verl's ``uid``).
    normalization (str): ``all``: gated-off samples count as zeros in the token-mean (the
        denominator is every response token: verl's own aggregation, exact under any parallelism);
        ``kept``: they are excluded (the denominator is the kept tokens). See ``trainer/gate.py``.
    kl_skip_thought (bool): KL only on the tokens after the last ``think_end_token`` of the response.
    think_end_token (str): the token that closes the reasoning block.
    routing_key (str): the top-level dataset column with each rollout's platform: teacher routing,
        per-platform metrics and the quota sampler's ``domain_key`` (which interpolates it).
    teachers (dict[str, TeacherConfig]): one teacher per platform (``verl_mopd.teachers.config``).
    skip_gated (bool): send samples whose gate is off to no teacher.

    Beta is verl's ``distillation.distillation_loss.distillation_loss_coef``. Build it from a run
    config with :meth:`from_mapping`, which refuses unknown and removed keys.
    """

    enable: bool = True
    tau_kl: float = 0.5
    gate_metric: str = "acc"
    group_key: str = "uid"
    normalization: str = "all"
    kl_skip_thought: bool = False
    think_end_token: str = "</think>"
    routing_key: str = "platform"
    teachers: dict = field(default_factory=dict)
    skip_gated: bool = True

    def __post_init__(self):
        from verl_mopd.teachers.config import build_teachers

        errors = []
        if self.normalization not in GATE_NORMALIZATIONS:
            errors.append(f"mopd.normalization={self.normalization!r}: allowed values are {list(GATE_NORMALIZATIONS)}")
        if isinstance(self.tau_kl, bool) or not isinstance(self.tau_kl, int | float) or not math.isfinite(self.tau_kl):
            errors.append(f"mopd.tau_kl={self.tau_kl!r}: must be a finite number")
        if not self.gate_metric:
            errors.append("mopd.gate_metric is empty: use 'rm_scores' or a reward extra such as 'acc'")
        if not self.routing_key:
            errors.append("mopd.routing_key is empty: name the dataset column with the platform tag")
        teachers, teacher_errors = build_teachers(self.teachers or {})
        errors.extend(teacher_errors)
        if errors:
            raise ConfigError(errors, "mopd block")
        object.__setattr__(self, "teachers", teachers)

    @property
    def platforms(self) -> list[str]:
        """The platforms that have a teacher, in the block's order."""
        return list(self.teachers)

    @classmethod
    def from_mapping(cls, block: Mapping[str, Any] | None) -> MOPDConfig:
        """Build from a plain dict or an OmegaConf ``mopd`` block; unknown or removed keys are errors.

        An unknown key names the nearest real key (``mopd.tau_k1`` -> ``mopd.tau_kl``); a removed key
        says what replaced it. Every problem of the block is reported at once (``ConfigError``).
        """
        if block is None:
            block = {}
        if isinstance(block, DictConfig):
            block = OmegaConf.to_container(block, resolve=True)
        block = {str(k): v for k, v in dict(block).items() if k != "_target_"}
        allowed = [f.name for f in fields(cls) if not f.name.startswith("_")]
        errors = []
        for key in block:
            if key in REMOVED_KEYS:
                errors.append(f"mopd.{key} was removed: {REMOVED_KEYS[key]}")
            elif key not in allowed:
                near = difflib.get_close_matches(key, allowed, n=1, cutoff=0.6)
                hint = f"did you mean mopd.{near[0]}? " if near else ""
                errors.append(f"mopd.{key}: unknown key; {hint}allowed: {', '.join(allowed)}")
        if errors:
            raise ConfigError(errors, "mopd block")
        return cls(**block)
