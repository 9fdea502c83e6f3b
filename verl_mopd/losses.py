"""The MOPD loss (UI-MOPD, Sec. 3): K3 distillation term, reward-gated mask, aggregation.

    L = L_PG + beta * L_MOPD,        beta = 0.01
    L_MOPD = token-mean over response tokens of  m_i * K3(d_t),   d_t = log p_T(y_t) - log p_S(y_t)
    K3(d) = exp(d) - d - 1
    m_i = 1 if mean_{j in group(i)} r_j <= tau_kl else 0          (the adaptive reward gate)

Which divergence this optimizes. The *value* of K3 on student samples is an unbiased estimate
of the reverse KL(student || teacher). Its *gradient*, backpropagated as a supervised loss on
the student's own samples (``use_policy_gradient=False``), is

    E_{y~S}[ d/dtheta K3 ] = E_{y~S}[ (1 - p_T/p_S) * grad log p_S(y) ]
                           = -E_{y~T}[ grad log p_S(y) ]          (E_S[grad log p_S] = 0)
                           = grad KL(teacher || student)

per token, i.e. the FORWARD KL (mass-covering; what an SFT on teacher samples would optimize),
at every state h_t the student visits: sum_t E_{h_t~S}[ grad KL(T(.|h_t) || S(.|h_t)) ] (the
states come from the student, not the teacher). Using k1 as a policy-gradient reward, or
backpropagating k2, gives the reverse KL instead.
``tests/loss/test_losses_on_cpu.py`` checks this identity exactly on an enumerable toy policy.

What is reused from verl 0.9.1: ``verl.trainer.ppo.core_algos.agg_loss`` for aggregation (so the
loss is invariant to data/sequence-parallel sizes and micro-batching exactly as verl's is), and
verl's ``kl_penalty(..., "k3")`` is the reference our K3 equals wherever verl does not clamp.
What verl lacks, and is written here: a K3 that keeps a bounded, non-zero gradient where verl's
clamps zero it (``d > ~2.6``, the tokens where the student is furthest below the teacher), the
group reward gate, and the thought-skipping token window.

This module is the method, in torch only (verl's ``agg_loss`` is imported where it aggregates).
verl's loss mode ``mopd_k3`` over it, the micro-batch verl's own loss cannot take and the
registration are :mod:`verl_mopd.verl_loss`, beside it.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any, NamedTuple

import numpy as np
import torch

__all__ = [
    "K3_CLAMP_BELOW",
    "K3_LINEAR_ABOVE",
    "KL_MASK_KEY",
    "KL_START_KEY",
    "TEACHER_LOGPROBS_KEY",
    "counted_tokens",
    "gated_k3",
    "gated_k3_gate_in_op",
    "k3_kl",
    "k3_metrics",
    "kept_kl_mask",
    "mopd_kl_loss",
    "padded",
    "reward_gate",
    "thought_end_index",
]

#: Above this ``d = log p_T - log p_S`` K3 continues as the tangent line at this point
#: (value and slope ``e^3 - 1 ~ 19.1`` continuous; convex, finite, gradient bounded by the slope).
#: verl's own k3 is exact only up to ``d ~ 2.61`` (where its result clamp at 10 starts), so any
#: threshold >= 2.61 equals verl's value wherever verl does not clamp. Config key:
#: ``distillation.distillation_loss.k3_linear_above``.
K3_LINEAR_ABOVE = 3.0
#: Below this ``d`` (teacher far below the student, down to a ``-inf`` teacher log-prob) K3 is held
#: at its value here, so it stays finite. The gradient there is zero, as in verl (whose result clamp
#: already zeroes it below ``d ~ -11``); its magnitude would be at most 1 anyway. Config key:
#: ``distillation.distillation_loss.k3_clamp_below``.
K3_CLAMP_BELOW = -20.0


#: Per-sample batch keys written on the driver (``verl_mopd.trainer.gate``) and read here.
KL_MASK_KEY = "mopd_kl_mask"
KL_START_KEY = "mopd_kl_start"
#: where the teacher group stores the teachers' log-probs of the sampled tokens (verl's name)
TEACHER_LOGPROBS_KEY = "teacher_logprobs"


class _K3(torch.autograd.Function):
    """K3 with a linear continuation above ``hi``, held constant below ``lo``, optionally gated.

    Forward runs in place where it can and keeps the per-token derivative, so the backward is a
    single multiply (verl's clamp/exp/clamp chain costs several elementwise passes each way).
    Float ops only on the hot path: a bool comparison over (B, T) is ~100x slower than a float
    pass on CPU here, so masks are built only when one reduction (``aminmax``) says the batch has
    a ``d`` below ``lo`` or a non-finite ``d``.
    """

    @staticmethod
    def forward(ctx, student_BT, teacher_BT, lo: float, hi: float, kl_mask_B1, token_mask_BT):
        with torch.no_grad():
            d_BT = teacher_BT - student_BT
            d_min, d_max = torch.aminmax(d_BT) if d_BT.numel() else (d_BT.new_zeros(()), d_BT.new_zeros(()))
            rare = not bool((d_min >= lo) & (d_max < math.inf))  # NaN compares False: also rare
            dc_BT = d_BT.clamp(lo, hi)
            dk_BT = torch.exp(dc_BT).sub_(1.0)  # dK3/dd on [lo, hi]; equals the tangent slope above hi
            k_BT = dc_BT.neg_().add_(dk_BT)
            if rare:
                # constant below lo (e.g. -inf teacher log-probs): zero derivative there
                dk_BT.mul_((d_BT - lo).clamp_min_(0.0).sign_())
            if math.isfinite(hi):  # hi = inf is the plain K3 (no linear part; 0 * inf would be NaN)
                k_BT.add_(d_BT.sub_(hi).clamp_min_(0.0), alpha=math.expm1(hi))
            if kl_mask_B1 is not None:
                k_BT.mul_(kl_mask_B1)
                dk_BT.mul_(kl_mask_B1)
            if rare and (token_mask_BT is not None or kl_mask_B1 is not None):
                # a NaN/inf log-prob on a token that does not count (masked, or its sample gated
                # off) must not reach the value or the gradient: 0 * NaN would be NaN
                if token_mask_BT is None:
                    not_counted_BT = kl_mask_B1 == 0
                elif kl_mask_B1 is None:
                    not_counted_BT = token_mask_BT == 0
                else:
                    not_counted_BT = (token_mask_BT == 0) | (kl_mask_B1 == 0)
                off_BT = not_counted_BT & ~torch.isfinite(k_BT)
                k_BT.masked_fill_(off_BT, 0.0)
                dk_BT.masked_fill_(off_BT, 0.0)
        ctx.save_for_backward(dk_BT)
        return k_BT

    @staticmethod
    def backward(ctx, grad_out_BT):
        (dk_BT,) = ctx.saved_tensors
        # dK/d(student) = -dK/dd; the teacher is a constant of the loss (no gradient).
        return torch.mul(grad_out_BT, dk_BT).neg_(), None, None, None, None, None


def _check_per_sample(name: str, value: torch.Tensor, bs: int, note: str = "") -> None:
    """A per-sample tensor must be (bs,) or (bs, 1): anything else would broadcast silently."""
    if tuple(value.shape) not in ((bs,), (bs, 1)):
        raise ValueError(
            f"{name} has shape {tuple(value.shape)}; expected ({bs},) or ({bs}, 1), one value per sample{note}"
        )


def k3_kl(
    student_log_probs: torch.Tensor,
    teacher_log_probs: torch.Tensor,
    *,
    linear_above: float = K3_LINEAR_ABOVE,
    clamp_below: float = K3_CLAMP_BELOW,
    kl_mask: torch.Tensor | None = None,
    token_mask: torch.Tensor | None = None,
) -> torch.Tensor:
    """Per-token K3 estimator ``exp(d) - d - 1`` with ``d = teacher - student``.

    Args:
        student_log_probs: (bs, response_len) log p_S of the sampled tokens; differentiable.
        teacher_log_probs: (bs, response_len) log p_T of the same tokens; a constant (``-inf``
            allowed: a token the teacher never emits).
        linear_above: for ``d > linear_above`` the tangent line at ``linear_above`` (must be >= 0;
            ``inf`` gives the plain K3, whose gradient ``e^d - 1`` is unbounded).
        clamp_below: for ``d < clamp_below`` the value at ``clamp_below`` (must be < linear_above).
        kl_mask: optional (bs,) or (bs, 1) per-sample weight broadcast over tokens (the reward
            gate, :func:`reward_gate`); applied in place, so no (bs, response_len) temporary is
            made for it.
        token_mask: optional (bs, response_len), nonzero on the tokens that count. Only read when
            a log-prob is NaN or ``d`` is ``+inf``: such a token outside the mask or in a gated-off
            sample then gives exactly 0 and 0 gradient (a counted one stays NaN/inf, visibly).

    Returns:
        (bs, response_len) K3 values, ``>= 0`` and finite for finite inputs. Equals
        ``exp(d) - d - 1`` exactly on ``[clamp_below, linear_above]``. As a value it estimates
        KL(student || teacher); its expected gradient on student samples is that of
        KL(teacher || student) (module docstring).
    """
    student_BT, teacher_BT = student_log_probs, teacher_log_probs
    if student_BT.shape != teacher_BT.shape:
        raise ValueError(
            f"student_log_probs {tuple(student_BT.shape)} and teacher_log_probs {tuple(teacher_BT.shape)} "
            "must have the same shape (bs, response_len): one teacher log-prob per sampled token (not top-k)"
        )
    if not student_BT.is_floating_point():
        raise ValueError(f"student_log_probs has dtype {student_BT.dtype}; log-probs must be floating point")
    if not clamp_below < linear_above or linear_above < 0:
        raise ValueError(
            f"need clamp_below < linear_above and linear_above >= 0, got clamp_below={clamp_below}, "
            f"linear_above={linear_above}"
        )
    if token_mask is not None and token_mask.shape != student_BT.shape:
        raise ValueError(
            f"token_mask has shape {tuple(token_mask.shape)}; expected {tuple(student_BT.shape)} "
            "(bs, response_len), as the log-probs"
        )
    teacher_BT = teacher_BT.detach().to(student_BT.dtype)
    kl_mask_B1 = None
    if kl_mask is not None:
        if student_BT.dim() == 0:
            raise ValueError("kl_mask needs log-probs of shape (bs, response_len)")
        _check_per_sample("kl_mask", kl_mask, student_BT.shape[0])
        kl_mask_B1 = kl_mask.detach().to(student_BT.dtype).reshape(-1, *([1] * (student_BT.dim() - 1)))
    return _K3.apply(student_BT, teacher_BT, float(clamp_below), float(linear_above), kl_mask_B1, token_mask)


def _group_index(group_ids: Any) -> tuple[np.ndarray, int]:
    """Map arbitrary hashable group ids (tensor, numpy object array, list) to 0..G-1."""
    if isinstance(group_ids, torch.Tensor):
        group_ids = group_ids.detach().cpu().numpy()
    ids = np.asarray(group_ids, dtype=object).reshape(-1)
    index: dict[Any, int] = {}
    inverse = np.fromiter((index.setdefault(g, len(index)) for g in ids.tolist()), dtype=np.int64, count=len(ids))
    return inverse, len(index)


def reward_gate(scores: torch.Tensor | Sequence[float], group_ids: Any, tau: float) -> torch.Tensor:
    """The adaptive reward gate: switch the KL term off for groups that already do well.

    ``kl_mask_i = 1.0 if mean_{j: g_j = g_i} scores_j <= tau else 0.0`` (``m_i`` in the paper; the
    per-sample ``kl_mask`` the loss takes, stored as ``mopd_kl_mask`` on the verl path).

    Args:
        scores: (bs,) per-rollout gate metric: the task score, or ``acc`` (1.0 iff fully correct)
            as in the public UI-MOPD release (which gates on group-mean ``acc`` > 0.1).
        group_ids: (bs,) GRPO group of each rollout: verl's ``uid`` (numpy object array of str),
            a tensor, or a list. Groups must be whole: compute this over the full step batch on
            the driver, never inside a micro-batch.
        tau: the threshold ``tau_kl``.

    Returns:
        (bs,) float32 tensor of 1.0 (KL on) / 0.0 (KL masked), on the device of ``scores``.
    """
    scores_B = torch.as_tensor(scores).detach()
    if scores_B.dim() != 1:
        raise ValueError(f"scores must be 1-D (bs,), got shape {tuple(scores_B.shape)}")
    if not torch.isfinite(scores_B).all():
        bad = scores_B[~torch.isfinite(scores_B)][:3].tolist()
        raise ValueError(f"scores must be finite for the reward gate, got {bad}")
    group_B, n_groups = _group_index(group_ids)
    if len(group_B) != len(scores_B):
        raise ValueError(f"group_ids has {len(group_B)} entries but scores has {len(scores_B)}")
    group_B = torch.from_numpy(group_B).to(scores_B.device)
    scores_B = scores_B.to(torch.float64)
    sums_G = torch.zeros(n_groups, dtype=torch.float64, device=scores_B.device).index_add_(0, group_B, scores_B)
    counts_G = torch.bincount(group_B, minlength=n_groups).to(torch.float64)
    group_mean_B = (sums_G / counts_G)[group_B]
    return (group_mean_B <= tau).to(torch.float32)


def thought_end_index(responses: torch.Tensor, response_mask: torch.Tensor, think_end_token_id: int,
                      truncated: torch.Tensor | None = None) -> torch.Tensor:
    """First response position after the LAST ``</think>`` token of each row.

    Args:
        responses: (bs, response_len) token ids (padded layout).
        response_mask: (bs, response_len) 1 on response tokens.
        think_end_token_id: id of ``</think>`` in the student's tokenizer.
        truncated: optional (bs,) bool, True for a response cut off at the length limit.

    Returns:
        (bs,) int64: KL applies to positions ``>= index`` when the thought is skipped
        (``kl_skip_thought``). A response without ``</think>`` keeps the KL on every token (index 0:
        it answered without a thought), except a truncated one: it was cut off inside its thought,
        so every token is thought and the index is ``response_len`` (no KL on it).
    """
    hit_BT = (responses == think_end_token_id) & response_mask.bool()
    pos_BT = torch.arange(responses.shape[-1], device=responses.device).expand_as(responses)
    last_B = torch.where(hit_BT, pos_BT, torch.full_like(pos_BT, -1)).amax(dim=-1)
    start_B = last_B + 1
    if truncated is not None:
        cut_in_thought_B = truncated.reshape(-1).bool().to(start_B.device) & (last_B < 0)
        start_B = torch.where(cut_in_thought_B, torch.full_like(start_B, responses.shape[-1]), start_B)
    return start_B


# ----------------------------------------------------------------------------------------------
# The core both entry points share: :func:`mopd_kl_loss` (pure torch; :func:`gated_k3`) and
# ``verl_mopd.verl_loss.compute_mopd_k3`` (verl's loss_mode=mopd_k3; :func:`gated_k3_gate_in_op`).
# One place (:func:`_gated_window`) computes the thought window, the gate and the counted tokens,
# one (:func:`k3_metrics`) the metrics. Notation (tinker-cookbook's): a name's suffix gives its dimensions, ``_B`` one
# value per sample, ``_BT`` one per token of the (bs, response_len) response layout.
# ----------------------------------------------------------------------------------------------

def padded(value: torch.Tensor, padding=0) -> torch.Tensor:
    """A per-sample field in the padded (bs, ...) layout: verl's jagged nested tensors are padded."""
    return value.to_padded_tensor(padding) if getattr(value, "is_nested", False) else value


def _thought_window_BT(kl_start_B: torch.Tensor, shape: torch.Size, device) -> torch.Tensor:
    """(bs, response_len) bool: the positions ``>= kl_start_B`` (the KL's window after the thought)."""
    pos_T = torch.arange(shape[-1], device=device)
    return pos_T.unsqueeze(0) >= kl_start_B.reshape(-1, 1).to(device)


def counted_tokens(response_mask_BT: torch.Tensor, kl_mask_B: torch.Tensor | None = None,
                   kl_start_B: torch.Tensor | None = None) -> torch.Tensor:
    """(bs, response_len) bool: the tokens the KL counts.

    A response token counts when it is in its sample's thought window (position ``>= kl_start_B``,
    :func:`thought_end_index`; all positions without it) and its sample's KL is on
    (``kl_mask_B > 0``; all samples without it).
    """
    counted_BT = response_mask_BT.bool()
    if kl_start_B is not None:
        counted_BT = counted_BT & _thought_window_BT(kl_start_B, counted_BT.shape, counted_BT.device)
    if kl_mask_B is not None:
        counted_BT = counted_BT & (kl_mask_B.reshape(-1, 1) > 0)
    return counted_BT


def kept_kl_mask(kl_mask_B: torch.Tensor, response_mask_BT: torch.Tensor, kl_start_B: torch.Tensor | None = None,
                 real_B: torch.Tensor | None = None) -> torch.Tensor:
    """The gate with ``normalization="kept"`` folded in: ``kl_mask_B * N_tokens / N_counted``.

    "kept" means: the mean is over the counted tokens only (:func:`counted_tokens`: gated-off
    samples and thought tokens are left out of the denominator). :func:`mopd_kl_loss` realizes it
    by aggregating over ``counted_BT``. verl's ``agg_loss`` always divides by every response token
    of the mini-batch (``batch_num_tokens``, all-reduced by its engines), so on the verl path the
    driver (``verl_mopd.trainer.gate.compute_reward_gate``) stores this weight as ``mopd_kl_mask``
    for the whole step batch: ``N_tokens`` (response tokens of the real samples) over ``N_counted``
    turns verl's all-token denominator into the counted-token one. Exact when the step is one
    mini-batch; :func:`gated_k3` divides the weight out again for its metrics.

    Args:
        kl_mask_B: (bs,) the gate (1 on, 0 off).
        response_mask_BT: (bs, response_len) 1 on response tokens.
        kl_start_B: optional (bs,) thought window starts.
        real_B: optional (bs,) bool, False for verl's batch padding rows (whose gate is 0).

    Returns:
        (bs,) the weighted gate, same dtype as ``kl_mask_B``; all 0 when no token counts.
    """
    response_BT = response_mask_BT.bool()
    real_B = torch.ones(len(kl_mask_B), dtype=torch.bool) if real_B is None else real_B
    n_tokens = (response_BT.sum(-1) * real_B.to(response_BT.device)).sum().float()
    n_counted = counted_tokens(response_BT, kl_mask_B, kl_start_B).sum().float()
    return kl_mask_B * (n_tokens / n_counted) if n_counted > 0 else torch.zeros_like(kl_mask_B)


def k3_metrics(k3_sum_B: torch.Tensor, tokens_B: torch.Tensor, on_B: torch.Tensor, *,
               with_k3_mean: bool = True) -> dict[str, torch.Tensor]:
    """The loss's metrics, from per-sample sums (0-dim tensors; names as logged).

    Args:
        k3_sum_B: (bs,) sum of K3 times the token weight (rollout IS weight, 1 without) over the
            sample's window tokens, without the gate's value.
        tokens_B: (bs,) the sample's window tokens (response tokens at positions ``>= kl_start``).
        on_B: (bs,) bool, the sample's KL is on.
        with_k3_mean: also ``mopd/k3_mean``, over every sample (only where every sample has real
            teacher log-probs: on the verl path a gated-off sample's are a stand-in).

    Returns:
        ``mopd/k3_mean_kl_on`` (``k3_sum_kl_on / kl_on_tokens``), ``mopd/kl_mask_on_fraction``
        (1.0 for no sample), the sums ``mopd/k3_sum_kl_on``, ``mopd/kl_on_tokens`` and
        ``mopd/kl_on_samples`` over the KL-on samples, and ``mopd/k3_mean`` (``with_k3_mean``).
        How verl aggregates each: ``verl_mopd.verl_loss.K3_METRIC_AGGREGATION``.
    """
    on_B = on_B.float()
    k3_sum_kl_on = (k3_sum_B * on_B).sum()
    kl_on_tokens = (tokens_B * on_B).sum()
    stats = {
        "mopd/k3_mean_kl_on": k3_sum_kl_on / kl_on_tokens.clamp_min(1),
        "mopd/kl_mask_on_fraction": on_B.mean() if on_B.numel() else on_B.new_ones(()),
        "mopd/k3_sum_kl_on": k3_sum_kl_on,
        "mopd/kl_on_tokens": kl_on_tokens,
        "mopd/kl_on_samples": on_B.sum(),
    }
    if with_k3_mean:
        stats["mopd/k3_mean"] = k3_sum_B.sum() / tokens_B.sum().clamp_min(1)
    return stats


class _GatedWindow(NamedTuple):
    """The tokens :func:`gated_k3` and :func:`gated_k3_gate_in_op` weigh, all (bs, response_len) but
    the gate."""

    kl_mask_B: torch.Tensor | None  # (bs,) the gate, detached; None: KL on for all
    response_BT: torch.Tensor  # bool, the response tokens
    window_BT: torch.Tensor  # bool, the response tokens in the thought window
    counted_BT: torch.Tensor  # bool, :func:`counted_tokens`: the window tokens of the samples whose KL is on
    weight_BT: torch.Tensor | None  # the per-token factor after the gate (window, IS weights); None: 1


def _gated_window(student_logp_BT: torch.Tensor, response_mask_BT: torch.Tensor,
                  kl_mask_B: torch.Tensor | None, kl_start_B: torch.Tensor | None,
                  token_weight_BT: torch.Tensor | None) -> _GatedWindow:
    """The shapes checked (one message per input, naming its batch key on the verl path), then the
    tokens the gated K3 weighs."""
    if student_logp_BT.dim() != 2:
        raise ValueError(f"student_log_probs has shape {tuple(student_logp_BT.shape)}; expected (bs, response_len)")
    bs = student_logp_BT.shape[0]
    if response_mask_BT.shape != student_logp_BT.shape:
        raise ValueError(
            f"response_mask has shape {tuple(response_mask_BT.shape)}; expected {tuple(student_logp_BT.shape)} "
            "(bs, response_len), as student_log_probs"
        )
    if kl_mask_B is not None:
        _check_per_sample("kl_mask", kl_mask_B, bs, f" (the batch key {KL_MASK_KEY} on the verl path)")
        kl_mask_B = kl_mask_B.detach().reshape(-1)
    if kl_start_B is not None and tuple(kl_start_B.shape) != (bs,):
        raise ValueError(
            f"kl_start_index has shape {tuple(kl_start_B.shape)}; expected ({bs},), one index per sample "
            f"(the batch key {KL_START_KEY} on the verl path)"
        )
    response_BT = response_mask_BT.bool()
    thought_window_BT = (None if kl_start_B is None
                         else _thought_window_BT(kl_start_B, student_logp_BT.shape, student_logp_BT.device))
    window_BT = response_BT if thought_window_BT is None else response_BT & thought_window_BT
    weight_BT = thought_window_BT
    if token_weight_BT is not None:
        weight_BT = token_weight_BT if weight_BT is None else token_weight_BT * weight_BT
    return _GatedWindow(kl_mask_B, response_BT, window_BT, counted_tokens(window_BT, kl_mask_B), weight_BT)


def _weighted_k3(student_logp_BT: torch.Tensor, teacher_logp_BT: torch.Tensor, tokens: _GatedWindow,
                 kl_mask_B: torch.Tensor | None, linear_above: float, clamp_below: float) -> torch.Tensor:
    """(bs, response_len) :func:`k3_kl` times the per-token weight of ``tokens``; ``kl_mask_B`` (or
    None) is applied inside the K3 op."""
    k3_BT = k3_kl(student_logp_BT, teacher_logp_BT, linear_above=linear_above, clamp_below=clamp_below,
                  kl_mask=kl_mask_B, token_mask=tokens.counted_BT)
    return k3_BT if tokens.weight_BT is None else k3_BT * tokens.weight_BT


def _window_metrics(tokens: _GatedWindow, k3_sum_B: torch.Tensor, *,
                    with_k3_mean: bool) -> dict[str, torch.Tensor]:
    """:func:`k3_metrics` of the per-sample K3 sums (without the gate's value) over ``tokens``."""
    kl_mask_B = tokens.kl_mask_B
    on_B = (torch.ones(len(k3_sum_B), dtype=torch.bool, device=tokens.response_BT.device) if kl_mask_B is None
            else kl_mask_B > 0)
    return k3_metrics(k3_sum_B, tokens.window_BT.sum(-1), on_B, with_k3_mean=with_k3_mean)


def gated_k3(
    student_logp_BT: torch.Tensor,
    teacher_logp_BT: torch.Tensor,
    response_mask_BT: torch.Tensor,
    kl_mask_B: torch.Tensor | None = None,
    kl_start_B: torch.Tensor | None = None,
    token_weight_BT: torch.Tensor | None = None,
    *,
    linear_above: float = K3_LINEAR_ABOVE,
    clamp_below: float = K3_CLAMP_BELOW,
) -> tuple[torch.Tensor, torch.Tensor, dict[str, torch.Tensor]]:
    """The per-token MOPD loss, gated and windowed, with the tokens it counts and its metrics, where
    every sample has real teacher log-probs (the pure path, :func:`mopd_kl_loss`).

    ``k3_BT = K3(teacher - student) * kl_mask_B * [pos >= kl_start_B] * token_weight_BT``. K3 is
    computed for the gated-off samples too (for ``mopd/k3_mean``), and the gate multiplies it
    afterwards. Where a gated-off sample may carry stand-in teacher log-probs (the verl path), use
    :func:`gated_k3_gate_in_op`, which computes the same loss with the gate inside the K3 op.

    Args:
        student_logp_BT: (bs, response_len) log p_S of the sampled tokens; differentiable.
        teacher_logp_BT: (bs, response_len) log p_T of the same tokens.
        response_mask_BT: (bs, response_len) 1 on response tokens.
        kl_mask_B: optional (bs,) or (bs, 1) gate (:func:`reward_gate`; 1 on, 0 off; on the verl
            path possibly times the constant :func:`kept_kl_mask` weight); None: KL on for all.
        kl_start_B: optional (bs,) first position of the KL window (:func:`thought_end_index`).
        token_weight_BT: optional (bs, response_len) weight per token (verl's
            ``rollout_is_weights``), in the loss and in the metrics.
        linear_above, clamp_below: see :func:`k3_kl`.

    Returns:
        ``(k3_BT, counted_BT, stats)``: the per-token loss (gated-off samples and tokens before the
        window exactly 0, with exactly 0 gradient; aggregate it over ``response_mask_BT`` for
        ``normalization="all"``), the bool :func:`counted_tokens` (aggregate over them for
        ``"kept"``), and :func:`k3_metrics` as 0-dim tensors, ``mopd/k3_mean`` included.
    """
    tokens = _gated_window(student_logp_BT, response_mask_BT, kl_mask_B, kl_start_B, token_weight_BT)
    k3_BT = _weighted_k3(student_logp_BT, teacher_logp_BT, tokens, None, linear_above, clamp_below)
    with torch.no_grad():
        stats = _window_metrics(tokens, (k3_BT * tokens.response_BT).sum(-1), with_k3_mean=True)
    if tokens.kl_mask_B is not None:
        k3_BT = k3_BT * tokens.kl_mask_B.to(student_logp_BT.dtype).reshape(-1, 1)
    return k3_BT, tokens.counted_BT, stats


def gated_k3_gate_in_op(
    student_logp_BT: torch.Tensor,
    teacher_logp_BT: torch.Tensor,
    response_mask_BT: torch.Tensor,
    kl_mask_B: torch.Tensor | None = None,
    kl_start_B: torch.Tensor | None = None,
    token_weight_BT: torch.Tensor | None = None,
    *,
    linear_above: float = K3_LINEAR_ABOVE,
    clamp_below: float = K3_CLAMP_BELOW,
) -> tuple[torch.Tensor, torch.Tensor, dict[str, torch.Tensor]]:
    """:func:`gated_k3`'s loss where a gated-off sample may carry stand-in teacher log-probs (the
    verl path, ``verl_mopd.verl_loss.compute_mopd_k3``: ``mopd.skip_gated`` sends it to no teacher).

    The gate is applied inside the K3 op, in place (no K3 of a gated-off sample is ever formed), so
    there is no ``mopd/k3_mean``; the gate's value (a :func:`kept_kl_mask` weight) is divided out of
    the metrics again. Same arguments and returns as :func:`gated_k3`.
    """
    tokens = _gated_window(student_logp_BT, response_mask_BT, kl_mask_B, kl_start_B, token_weight_BT)
    k3_BT = _weighted_k3(student_logp_BT, teacher_logp_BT, tokens, tokens.kl_mask_B, linear_above, clamp_below)
    with torch.no_grad():
        k3_sum_B = (k3_BT * tokens.response_BT).sum(-1)
        if tokens.kl_mask_B is not None:  # the gate's value (a "kept" weight) divided out again
            kl_mask_B = tokens.kl_mask_B
            k3_sum_B = k3_sum_B / torch.where(kl_mask_B > 0, kl_mask_B, torch.ones_like(kl_mask_B))
        stats = _window_metrics(tokens, k3_sum_B, with_k3_mean=False)
    return k3_BT, tokens.counted_BT, stats


def mopd_kl_loss(
    student_log_probs: torch.Tensor,
    teacher_log_probs: torch.Tensor,
    response_mask: torch.Tensor,
    kl_mask: torch.Tensor | None = None,
    loss_agg_mode: str = "token-mean",
    *,
    kl_start_index: torch.Tensor | None = None,
    rollout_is_weights: torch.Tensor | None = None,
    normalization: str = "all",
    linear_above: float = K3_LINEAR_ABOVE,
    clamp_below: float = K3_CLAMP_BELOW,
    **global_batch_info: Any,
) -> tuple[torch.Tensor, dict[str, float]]:
    """Aggregated, gated K3 loss ``L_MOPD`` and its metrics: :func:`gated_k3` plus verl's ``agg_loss``.

    Args:
        student_log_probs: (bs, response_len), differentiable.
        teacher_log_probs: (bs, response_len).
        response_mask: (bs, response_len) 1 on response tokens.
        kl_mask: optional (bs,) or (bs, 1) per-sample gate from :func:`reward_gate` (1 on, 0 off);
            ``None`` = all on.
        loss_agg_mode: any of verl's ``agg_loss`` modes ("token-mean", "token-sum",
            "seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm").
        kl_start_index: optional (bs,) from :func:`thought_end_index`: KL only on positions
            ``>= index`` (the public release's ``kl_skip_thought``).
        rollout_is_weights: optional (bs, response_len) weight per token (verl's rollout
            correction weights, as ``use_rollout_is_weights`` on the verl path).
        normalization: how tokens without KL count in the mean. ``"all"``: as zeros (the
            denominator is every response token, exactly as verl aggregates); ``"kept"``: they are
            excluded (the denominator is the counted tokens, :func:`counted_tokens`: those of
            samples whose KL is on, inside the thought window).
        linear_above, clamp_below: see :func:`k3_kl`.
        **global_batch_info: ``dp_size``, ``batch_num_tokens``, ``global_batch_size``,
            ``loss_scale_factor`` passed through to verl's ``agg_loss``. With ``"kept"``, they must
            describe the counted tokens (verl's engines count all tokens; :func:`kept_kl_mask` is
            how the verl path realizes "kept").

    Returns:
        ``(loss, metrics)``: the scalar loss, and :func:`k3_metrics` as floats: ``mopd/k3_mean``
        (every sample's window tokens, ungated), ``mopd/k3_mean_kl_on`` (window tokens of samples
        whose KL is on), ``mopd/kl_mask_on_fraction`` (fraction of samples with the KL on) and the
        sums ``mopd/k3_sum_kl_on``, ``mopd/kl_on_tokens``, ``mopd/kl_on_samples``. K3 is weighted
        by ``rollout_is_weights`` in all of them.
    """
    from verl.trainer.ppo.core_algos import agg_loss

    if normalization not in ("all", "kept"):
        raise ValueError(f"normalization must be 'all' or 'kept', got {normalization!r}")
    k3_BT, counted_BT, stats = gated_k3(
        student_log_probs, teacher_log_probs, response_mask, kl_mask, kl_start_index, rollout_is_weights,
        linear_above=linear_above, clamp_below=clamp_below,
    )
    metrics = {name: value.item() for name, value in stats.items()}
    loss_mask_BT = (counted_BT if normalization == "kept" else response_mask).to(student_log_probs.dtype)
    if _nothing_counts(loss_mask_BT, loss_agg_mode, global_batch_info):
        # every denominator agg_loss could use is 0 (empty batch, all masked, all gated with
        # "kept"): the mean of nothing is 0 here, with a zero gradient, instead of 0/0 = NaN
        return (k3_BT * loss_mask_BT).sum(), metrics
    loss = agg_loss(loss_mat=k3_BT, loss_mask=loss_mask_BT, loss_agg_mode=loss_agg_mode, **global_batch_info)
    return loss, metrics


def _nothing_counts(mask_BT: torch.Tensor, loss_agg_mode: str, global_batch_info: dict[str, Any]) -> bool:
    """Whether ``agg_loss`` would divide by zero: no counted token (or sequence) in its denominator."""
    if loss_agg_mode == "token-sum":
        return False
    key = "batch_num_tokens" if loss_agg_mode == "token-mean" else "global_batch_size"
    given = global_batch_info.get(key)
    if given is not None:
        return float(given) == 0
    return mask_BT.numel() == 0 or not bool(mask_BT.any())
