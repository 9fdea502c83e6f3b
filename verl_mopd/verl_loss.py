"""verl's side of the MOPD loss: the ``mopd_k3`` loss mode, the micro-batch verl cannot take, registration.

The method is :mod:`verl_mopd.losses` (pure torch). This module is its thin adapter to verl 0.9.1:

- :func:`compute_mopd_k3`, verl's ``DistillationLossFn`` for
  ``distillation.distillation_loss.loss_mode=mopd_k3``: it unpacks verl's batch and calls
  :func:`verl_mopd.losses.gated_k3_gate_in_op`. verl's ``distillation_loss`` aggregates what
  it returns with ``agg_loss`` over ``response_mask``, and ``distillation_ppo_loss`` adds
  ``distillation_loss_coef`` (beta) times it to the PG loss, on the FSDP and Megatron engines alike;
- :func:`distillation_ppo_loss_on_any_micro_batch`: verl's ``distillation_ppo_loss``, also on a
  micro-batch of padding rows only, where verl's own raises (the trainer installs it,
  ``verl_mopd.trainer.hooks``);
- :func:`register_loss` / :func:`is_registered` / :func:`require_registered`: ``mopd_k3`` in verl's
  ``DISTILLATION_LOSS_REGISTRY`` (``verl_mopd.plugin.register()`` calls :func:`register_loss`).

Every verl import is deferred, so importing this module stays cheap.
"""

from __future__ import annotations

import math

import torch

from verl_mopd.losses import (
    K3_CLAMP_BELOW,
    K3_LINEAR_ABOVE,
    KL_MASK_KEY,
    KL_START_KEY,
    TEACHER_LOGPROBS_KEY,
    gated_k3_gate_in_op,
    padded,
)

__all__ = [
    "K3_METRIC_AGGREGATION",
    "MOPD_LOSS_MODE",
    "compute_mopd_k3",
    "distillation_ppo_loss_on_any_micro_batch",
    "is_registered",
    "register_loss",
    "require_registered",
]

#: how verl aggregates each metric of :func:`~verl_mopd.losses.k3_metrics` over micro-batches and
#: data-parallel ranks (``verl.utils.metric.AggregationType`` names)
K3_METRIC_AGGREGATION = {
    "mopd/k3_mean": "MEAN",
    "mopd/k3_mean_kl_on": "MEAN",
    "mopd/kl_mask_on_fraction": "MEAN",
    "mopd/k3_sum_kl_on": "SUM",
    "mopd/kl_on_tokens": "SUM",
    "mopd/kl_on_samples": "SUM",
}


def _field(data, key: str) -> torch.Tensor | None:
    return padded(data[key]) if key in data.keys() else None


def compute_mopd_k3(config, distillation_config, model_output: dict, data) -> tuple[torch.Tensor, dict]:
    """verl ``DistillationLossFn`` for ``loss_mode=mopd_k3``: unpack verl's batch, then
    :func:`~verl_mopd.losses.gated_k3_gate_in_op`.

    Same inputs as verl's ``compute_distillation_loss_reverse_kl_estimator`` (student
    ``model_output["log_probs"]``, ``data["teacher_logprobs"]``, padded or nested layouts, via
    verl's ``no_padding_2_padding``), plus the optional per-sample keys ``mopd_kl_mask`` (absent =
    KL on for all; with ``mopd.normalization=kept`` it holds :func:`~verl_mopd.losses.kept_kl_mask`) and
    ``mopd_kl_start`` (thought skipping), and verl's ``rollout_is_weights`` when
    ``use_rollout_is_weights`` is set (as the public UI-MOPD release weights its KL).

    Returns:
        (bs, response_len) per-token losses (gated samples exactly 0, with exactly 0 gradient),
        and :func:`~verl_mopd.losses.k3_metrics` (all but ``mopd/k3_mean``) as
        ``verl.utils.metric.Metric`` values, logged as ``actor/...``. ``mopd/k3_mean_kl_on`` and ``mopd/kl_mask_on_fraction`` are per
        micro-batch, and verl logs the MEAN of the per-micro-batch values (and over DP ranks), not
        a token mean over the step; the SUM metrics add up to exact totals. Micro-batches of
        padding rows only log nothing (:func:`distillation_ppo_loss_on_any_micro_batch`).
    """
    from verl.utils.metric import AggregationType, Metric
    from verl.workers.utils.padding import no_padding_2_padding

    loss_config = distillation_config.distillation_loss
    if loss_config.use_policy_gradient:
        raise ValueError(
            "distillation.distillation_loss.use_policy_gradient=True with loss_mode=mopd_k3: mopd_k3 is "
            "backpropagated as a supervised loss (its gradient is that of the forward KL); set "
            "use_policy_gradient=false, or use loss_mode=k1 for the policy-gradient (reverse KL) variant."
        )
    student_logp_BT = no_padding_2_padding(model_output["log_probs"], data)
    teacher_logp_BT = no_padding_2_padding(data[TEACHER_LOGPROBS_KEY], data).squeeze(-1)
    is_weights_BT = None
    if getattr(loss_config, "use_rollout_is_weights", False) and "rollout_is_weights" in data.keys():
        is_weights_BT = padded(data["rollout_is_weights"]).to(student_logp_BT.dtype)
    k3_BT, _, stats = gated_k3_gate_in_op(
        student_logp_BT, teacher_logp_BT, padded(data["response_mask"]).bool(),
        kl_mask_B=_field(data, KL_MASK_KEY), kl_start_B=_field(data, KL_START_KEY), token_weight_BT=is_weights_BT,
        linear_above=getattr(loss_config, "k3_linear_above", K3_LINEAR_ABOVE),
        clamp_below=getattr(loss_config, "k3_clamp_below", K3_CLAMP_BELOW),
    )
    return k3_BT, {name: Metric(AggregationType[K3_METRIC_AGGREGATION[name]], value) for name, value in stats.items()}


def _response_tokens(data) -> int:
    mask = data["response_mask"]
    return int((mask.values() if getattr(mask, "is_nested", False) else mask).sum())


def distillation_ppo_loss_on_any_micro_batch(config, distillation_config, model_output: dict | None = None,
                                              data=None, dp_group=None, student_logits: torch.Tensor | None = None, data_format: str = "thd"):
    """verl's ``distillation_ppo_loss``, also on a micro-batch with no response token.

    verl 0.9.1's ``distillation_loss`` logs ``distillation/loss_min`` / ``_max`` as ``.min()`` /
    ``.max()`` of the per-token loss over the micro-batch's response tokens
    (``compute_distillation_loss_range``), which raises on a micro-batch made only of verl's
    synthetic padding rows (``_balance_batch`` pads a step whose groups lost samples; four padding
    rows fill one fixed-size micro-batch of 4). There the distillation term is exactly 0 (a sum
    over no token), so this returns what verl's formula gives: verl's own ``ppo_loss`` when task
    rewards or the policy gradient are on (else a zero tied to the graph) and
    ``distillation/loss = 0``. It logs every metric a micro-batch with tokens logs, since verl's
    ``Metric.aggregate_dp`` refuses data-parallel ranks with unequal value counts: ours from
    :func:`compute_mopd_k3` (sums of 0 over no token, as for a micro-batch whose KL is all gated
    off) and verl's ``distillation/loss_min`` / ``_max`` as +inf / -inf, neutral for their MIN / MAX
    aggregation. Any other call is verl's function unchanged. Same arguments as verl's.
    """
    from verl.trainer.distillation.losses import distillation_ppo_loss
    from verl.utils.metric import AggregationType, Metric
    from verl.workers.utils.losses import ppo_loss

    if student_logits is not None or _response_tokens(data) > 0:
        return distillation_ppo_loss(config, distillation_config, model_output=model_output, data=data,
                                     dp_group=dp_group, student_logits=student_logits, data_format=data_format)
    loss_config = distillation_config.distillation_loss
    log_probs = model_output["log_probs"]
    zero = (log_probs.values() if getattr(log_probs, "is_nested", False) else log_probs).sum() * 0.0
    if loss_config.use_task_rewards or loss_config.use_policy_gradient:
        policy_loss, metrics = ppo_loss(config, model_output, data, dp_group)
        if not loss_config.use_task_rewards:
            policy_loss = zero
    else:
        policy_loss, metrics = zero, {}
    _, k3_metrics = compute_mopd_k3(config, distillation_config, model_output, data)
    metrics.update(k3_metrics)
    metrics["distillation/loss_min"] = Metric(AggregationType.MIN, math.inf)
    metrics["distillation/loss_max"] = Metric(AggregationType.MAX, -math.inf)
    metrics["distillation/loss"] = Metric(value=zero.detach(), aggregation=AggregationType.SUM)
    return policy_loss, metrics


# ---------------------------------------------------------------- registration: the mode lives with its loss

MOPD_LOSS_MODE = "mopd_k3"


def register_loss() -> None:
    """``mopd_k3`` (:func:`compute_mopd_k3`) into verl's ``DISTILLATION_LOSS_REGISTRY``; idempotent.

    Reuses verl's ``register_distillation_loss`` with ``use_estimator=True`` (one log-prob per
    sampled token). Raises if another function already holds the name.
    """
    from verl.trainer.distillation.losses import (
        DISTILLATION_LOSS_REGISTRY,
        DistillationLossSettings,
        register_distillation_loss,
    )

    registered = DISTILLATION_LOSS_REGISTRY.get(MOPD_LOSS_MODE)
    if registered is not None and registered is not compute_mopd_k3:
        raise RuntimeError(
            f"distillation loss mode {MOPD_LOSS_MODE!r} is already registered by "
            f"{registered.__module__}.{registered.__qualname__}, not by verl_mopd"
        )
    if registered is None:
        register_distillation_loss(DistillationLossSettings(names=[MOPD_LOSS_MODE], use_estimator=True))(
            compute_mopd_k3
        )


def is_registered() -> bool:
    """Whether ``mopd_k3`` is in verl's distillation-loss registry (imports verl)."""
    from verl.trainer.distillation.losses import DISTILLATION_LOSS_REGISTRY

    return MOPD_LOSS_MODE in DISTILLATION_LOSS_REGISTRY


def require_registered(where: str = "this process") -> None:
    """Raise a clear error if ``mopd_k3`` is not registered (verl hides plugin failures)."""
    if not is_registered():
        import os

        raise RuntimeError(
            f"loss_mode={MOPD_LOSS_MODE} is not registered in {where}. verl loads it through the "
            "'verl.plugins' entry point of the verl-mopd package: check that verl-mopd is installed in "
            "this environment (pip install -e . from its clone), that VERL_USE_EXTERNAL_PLUGINS "
            f"(now {os.getenv('VERL_USE_EXTERNAL_PLUGINS', 'auto')!r}) is 'auto' or lists 'verl_mopd', "
            "and look above for a 'verl-mopd plugin failed' warning."
        )
