"""Config dataclasses of the MOPD loss and gate (the single source of truth for their defaults).

- :class:`MOPDDistillationLossConfig` extends verl's ``DistillationLossConfig`` with the K3
  knobs; select it in YAML with ``distillation.distillation_loss._target_:
  verl_mopd.config.MOPDDistillationLossConfig`` (our ``trainer/config/mopd.yaml`` does). Without
  it, ``mopd_k3`` uses the same defaults (``verl_mopd.losses.K3_*``).
- :class:`MOPDGateConfig` is the driver-side ``mopd.*`` gate block read by
  ``verl_mopd.trainer.gate``.
"""

from __future__ import annotations

from dataclasses import dataclass

from verl.base_config import BaseConfig
from verl.workers.config import DistillationLossConfig

from verl_mopd.losses import K3_CLAMP_BELOW, K3_LINEAR_ABOVE

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
        from verl_mopd.losses import register_loss

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
            raise ValueError("invalid mopd_k3 loss config:\n  - " + "\n  - ".join(errors))
        super().__post_init__()


@dataclass
class MOPDGateConfig(BaseConfig):
    """The adaptive reward gate (``mopd.*`` keys), computed on the driver each step.

    enable (bool): compute and write ``mopd_kl_mask``; off = KL on for every sample.
    tau_kl (float): KL off for every rollout of a group whose mean ``gate_metric`` exceeds this.
        Default 0.1 with ``gate_metric=acc``: the public UI-MOPD run (``kl_threshold=0.1``).
    gate_metric (str): ``rm_scores`` (the task score, summed over tokens) or the name of a reward
        extra returned by the reward function (``acc``: 1.0 iff the action is fully correct).
    group_key (str): the stored field holding the GRPO group id (verl's ``uid``).
    normalization (str): ``all``: gated-off samples count as zeros in the token-mean (the
        denominator is every response token: verl's own aggregation, exact under any parallelism);
        ``kept``: they are excluded (the denominator is the kept tokens). See ``trainer/gate.py``.
    platform_key (str | None): stored field with the platform tag, for per-platform metrics.
    kl_skip_thought (bool): KL only on the tokens after the last ``</think>`` of the response.
    think_end_token (str): the token that closes the reasoning block.
    """

    enable: bool = True
    tau_kl: float = 0.1
    gate_metric: str = "acc"
    group_key: str = "uid"
    normalization: str = "all"
    platform_key: str | None = "platform"
    kl_skip_thought: bool = False
    think_end_token: str = "</think>"

    def __post_init__(self):
        if self.normalization not in GATE_NORMALIZATIONS:
            raise ValueError(f"mopd.normalization={self.normalization!r}: allowed values are {GATE_NORMALIZATIONS}")
        if not isinstance(self.tau_kl, int | float) or self.tau_kl != self.tau_kl:
            raise ValueError(f"mopd.tau_kl={self.tau_kl!r}: must be a finite number")
        if not self.gate_metric:
            raise ValueError("mopd.gate_metric is empty: use 'rm_scores' or a reward extra such as 'acc'")
