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
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

__all__ = [
    "K3_CLAMP_BELOW",
    "K3_LINEAR_ABOVE",
    "k3_kl",
    "mopd_kl_loss",
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


class _K3(torch.autograd.Function):
    """K3 with a linear continuation above ``hi``, held constant below ``lo``, optionally gated.

    Forward runs in place where it can and keeps the per-token derivative, so the backward is a
    single multiply (verl's clamp/exp/clamp chain costs several elementwise passes each way).
    Float ops only on the hot path: a bool comparison over (B, T) is ~100x slower than a float
    pass on CPU here, so masks are built only when one reduction (``aminmax``) says the batch has
    a ``d`` below ``lo`` or a non-finite ``d``.
    """

    @staticmethod
    def forward(ctx, student, teacher, lo: float, hi: float, gate, token_mask):
        with torch.no_grad():
            d = teacher - student  # (B, T)
            d_min, d_max = torch.aminmax(d) if d.numel() else (d.new_zeros(()), d.new_zeros(()))
            rare = not bool((d_min >= lo) & (d_max < math.inf))  # NaN compares False: also rare
            dc = d.clamp(lo, hi)
            dk = torch.exp(dc).sub_(1.0)  # dK3/dd on [lo, hi]; equals the tangent slope above hi
            k = dc.neg_().add_(dk)
            if rare:
                # constant below lo (e.g. -inf teacher log-probs): zero derivative there
                dk.mul_((d - lo).clamp_min_(0.0).sign_())
            if math.isfinite(hi):  # hi = inf is the plain K3 (no linear part; 0 * inf would be NaN)
                k.add_(d.sub_(hi).clamp_min_(0.0), alpha=math.expm1(hi))
            if gate is not None:
                k.mul_(gate)
                dk.mul_(gate)
            if rare and (token_mask is not None or gate is not None):
                # a NaN/inf log-prob on a token that does not count (masked, or its sample gated
                # off) must not reach the value or the gradient: 0 * NaN would be NaN
                if token_mask is None:
                    not_counted = gate == 0
                else:
                    not_counted = token_mask == 0 if gate is None else (token_mask == 0) | (gate == 0)
                off = not_counted & ~torch.isfinite(k)
                k.masked_fill_(off, 0.0)
                dk.masked_fill_(off, 0.0)
        ctx.save_for_backward(dk)
        return k

    @staticmethod
    def backward(ctx, grad_out):
        (dk,) = ctx.saved_tensors
        # dK/d(student) = -dK/dd; the teacher is a constant of the loss (no gradient).
        return torch.mul(grad_out, dk).neg_(), None, None, None, None, None


def _check_per_sample(name: str, value: torch.Tensor, bs: int) -> None:
    """A per-sample tensor must be (bs,) or (bs, 1): anything else would broadcast silently."""
    if tuple(value.shape) not in ((bs,), (bs, 1)):
        raise ValueError(f"{name} has shape {tuple(value.shape)}; expected ({bs},) or ({bs}, 1), one value per sample")


def k3_kl(
    student_log_probs: torch.Tensor,
    teacher_log_probs: torch.Tensor,
    *,
    linear_above: float = K3_LINEAR_ABOVE,
    clamp_below: float = K3_CLAMP_BELOW,
    gate: torch.Tensor | None = None,
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
        gate: optional (bs,) or (bs, 1) per-sample weight broadcast over tokens (the reward gate);
            applied in place, so no (bs, response_len) temporary is made for it.
        token_mask: optional (bs, response_len), nonzero on the tokens that count. Only read when
            a log-prob is NaN or ``d`` is ``+inf``: such a token outside the mask or in a gated-off
            sample then gives exactly 0 and 0 gradient (a counted one stays NaN/inf, visibly).

    Returns:
        (bs, response_len) K3 values, ``>= 0`` and finite for finite inputs. Equals
        ``exp(d) - d - 1`` exactly on ``[clamp_below, linear_above]``. As a value it estimates
        KL(student || teacher); its expected gradient on student samples is that of
        KL(teacher || student) (module docstring).
    """
    if student_log_probs.shape != teacher_log_probs.shape:
        raise ValueError(
            f"student_log_probs {tuple(student_log_probs.shape)} and teacher_log_probs "
            f"{tuple(teacher_log_probs.shape)} must have the same shape (bs, response_len)"
        )
    if not student_log_probs.is_floating_point():
        raise ValueError(f"student_log_probs has dtype {student_log_probs.dtype}; log-probs must be floating point")
    if not clamp_below < linear_above or linear_above < 0:
        raise ValueError(
            f"need clamp_below < linear_above and linear_above >= 0, got clamp_below={clamp_below}, "
            f"linear_above={linear_above}"
        )
    if token_mask is not None and token_mask.shape != student_log_probs.shape:
        raise ValueError(
            f"token_mask has shape {tuple(token_mask.shape)}; expected {tuple(student_log_probs.shape)} "
            "(bs, response_len), as the log-probs"
        )
    teacher = teacher_log_probs.detach().to(student_log_probs.dtype)
    if gate is not None:
        if student_log_probs.dim() == 0:
            raise ValueError("gate needs log-probs of shape (bs, response_len)")
        _check_per_sample("gate", gate, student_log_probs.shape[0])
        gate = gate.detach().to(student_log_probs.dtype).reshape(-1, *([1] * (student_log_probs.dim() - 1)))
    return _K3.apply(student_log_probs, teacher, float(clamp_below), float(linear_above), gate, token_mask)


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

    ``gate_i = 1.0 if mean_{j: g_j = g_i} scores_j <= tau else 0.0``.

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
    scores_t = torch.as_tensor(scores).detach()
    if scores_t.dim() != 1:
        raise ValueError(f"scores must be 1-D (bs,), got shape {tuple(scores_t.shape)}")
    if not torch.isfinite(scores_t).all():
        bad = scores_t[~torch.isfinite(scores_t)][:3].tolist()
        raise ValueError(f"scores must be finite for the reward gate, got {bad}")
    inverse, n_groups = _group_index(group_ids)
    if len(inverse) != len(scores_t):
        raise ValueError(f"group_ids has {len(inverse)} entries but scores has {len(scores_t)}")
    inv = torch.from_numpy(inverse).to(scores_t.device)
    s = scores_t.to(torch.float64)
    sums = torch.zeros(n_groups, dtype=torch.float64, device=s.device).index_add_(0, inv, s)
    counts = torch.bincount(inv, minlength=n_groups).to(torch.float64)
    group_mean = (sums / counts)[inv]
    return (group_mean <= tau).to(torch.float32)


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
    hit = (responses == think_end_token_id) & response_mask.bool()
    pos = torch.arange(responses.shape[-1], device=responses.device).expand_as(responses)
    last = torch.where(hit, pos, torch.full_like(pos, -1)).amax(dim=-1)
    start = last + 1
    if truncated is not None:
        cut_in_thought = truncated.reshape(-1).bool().to(start.device) & (last < 0)
        start = torch.where(cut_in_thought, torch.full_like(start, responses.shape[-1]), start)
    return start


def _window_mask(kl_start_index: torch.Tensor, shape: torch.Size, device) -> torch.Tensor:
    pos = torch.arange(shape[-1], device=device)
    return pos.unsqueeze(0) >= kl_start_index.reshape(-1, 1).to(device)


def mopd_kl_loss(
    student_log_probs: torch.Tensor,
    teacher_log_probs: torch.Tensor,
    response_mask: torch.Tensor,
    kl_mask: torch.Tensor | None = None,
    loss_agg_mode: str = "token-mean",
    *,
    kl_start_index: torch.Tensor | None = None,
    normalization: str = "all",
    linear_above: float = K3_LINEAR_ABOVE,
    clamp_below: float = K3_CLAMP_BELOW,
    **global_batch_info: Any,
) -> tuple[torch.Tensor, dict[str, float]]:
    """Aggregated, gated K3 loss ``L_MOPD`` and its metrics.

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
        normalization: how gated-off samples count in the mean. ``"all"``: as zeros (the
            denominator is every response token, exactly as verl aggregates); ``"kept"``: they are
            excluded (the denominator is the kept tokens / kept sequences only).
        linear_above, clamp_below: see :func:`k3_kl`.
        **global_batch_info: ``dp_size``, ``batch_num_tokens``, ``global_batch_size``,
            ``loss_scale_factor`` passed through to verl's ``agg_loss``. With ``"kept"``, they must
            describe the kept tokens (verl's engines count all tokens; see
            ``verl_mopd.trainer.gate`` for how the verl path realizes "kept").

    Returns:
        ``(loss, metrics)``: the scalar loss, and floats ``mopd/k3_mean`` (all response tokens,
        ungated), ``mopd/k3_mean_kl_on`` (tokens of samples whose KL is on), and
        ``mopd/kl_mask_on_fraction`` (fraction of samples with the KL on).
    """
    from verl.trainer.ppo.core_algos import agg_loss

    if normalization not in ("all", "kept"):
        raise ValueError(f"normalization must be 'all' or 'kept', got {normalization!r}")
    if student_log_probs.dim() != 2:
        raise ValueError(f"student_log_probs has shape {tuple(student_log_probs.shape)}; expected (bs, response_len)")
    bs = student_log_probs.shape[0]
    if response_mask.shape != student_log_probs.shape:
        raise ValueError(
            f"response_mask has shape {tuple(response_mask.shape)}; expected {tuple(student_log_probs.shape)} "
            "(bs, response_len), as student_log_probs"
        )
    if kl_mask is not None:
        _check_per_sample("kl_mask", kl_mask, bs)
    if kl_start_index is not None and tuple(kl_start_index.shape) != (bs,):
        raise ValueError(f"kl_start_index has shape {tuple(kl_start_index.shape)}; expected ({bs},), one index per sample")
    mask = response_mask.to(student_log_probs.dtype)
    if kl_start_index is not None:
        mask = mask * _window_mask(kl_start_index, mask.shape, mask.device)
    gate = None if kl_mask is None else kl_mask.detach().to(student_log_probs.dtype).reshape(-1, 1)

    counted = mask if gate is None else mask * (gate != 0)
    k3 = k3_kl(
        student_log_probs, teacher_log_probs, linear_above=linear_above, clamp_below=clamp_below, token_mask=counted
    )
    with torch.no_grad():
        row_sum = (k3 * mask).sum(-1)
        row_tokens = mask.sum(-1)
        on = torch.ones_like(row_sum) if gate is None else gate.squeeze(-1)
        metrics = {
            "mopd/k3_mean": (row_sum.sum() / row_tokens.sum().clamp_min(1)).item(),
            "mopd/k3_mean_kl_on": ((row_sum * on).sum() / (row_tokens * on).sum().clamp_min(1)).item(),
            "mopd/kl_mask_on_fraction": on.mean().item() if len(on) else 1.0,
        }
    if gate is not None:
        if normalization == "kept":
            mask = mask * gate
        k3 = k3 * gate
    if _nothing_counts(mask, loss_agg_mode, global_batch_info):
        # every denominator agg_loss could use is 0 (empty batch, all masked, all gated with
        # "kept"): the mean of nothing is 0 here, with a zero gradient, instead of 0/0 = NaN
        return (k3 * mask).sum(), metrics
    loss = agg_loss(loss_mat=k3, loss_mask=mask, loss_agg_mode=loss_agg_mode, **global_batch_info)
    return loss, metrics


def _nothing_counts(mask: torch.Tensor, loss_agg_mode: str, global_batch_info: dict[str, Any]) -> bool:
    """Whether ``agg_loss`` would divide by zero: no counted token (or sequence) in its denominator."""
    if loss_agg_mode == "token-sum":
        return False
    key = "batch_num_tokens" if loss_agg_mode == "token-mean" else "global_batch_size"
    given = global_batch_info.get(key)
    if given is not None:
        return float(given) == 0
    return mask.numel() == 0 or not bool(mask.any())


# ----------------------------------------------------------------------------------------------
# verl adapter: the per-token loss behind ``distillation.distillation_loss.loss_mode=mopd_k3``.
# Registered by :func:`register_loss` (below; ``verl_mopd.plugin.register()`` calls it); verl's ``distillation_loss`` aggregates what it
# returns with ``agg_loss`` over ``response_mask`` and ``distillation_ppo_loss`` adds
# ``distillation_loss_coef`` (beta) times it to the PG loss, on the FSDP and Megatron engines alike.
# ----------------------------------------------------------------------------------------------

#: Per-sample batch keys written on the driver (``verl_mopd.trainer.gate``) and read here.
KL_MASK_KEY = "mopd_kl_mask"
KL_START_KEY = "mopd_kl_start"
#: where the teacher group stores the teachers' log-probs of the sampled tokens (verl's name)
TEACHER_LOGPROBS_KEY = "teacher_logprobs"


def _padded(data, key: str) -> torch.Tensor | None:
    if key not in data.keys():
        return None
    value = data[key]
    return value.to_padded_tensor(0) if getattr(value, "is_nested", False) else value


def compute_mopd_k3(config, distillation_config, model_output: dict, data) -> tuple[torch.Tensor, dict]:
    """verl ``DistillationLossFn`` for ``loss_mode=mopd_k3``: gated, gradient-keeping K3 per token.

    Same inputs as verl's ``compute_distillation_loss_reverse_kl_estimator`` (student
    ``model_output["log_probs"]``, ``data["teacher_logprobs"]``, padded or nested layouts, via
    verl's ``no_padding_2_padding``), plus the optional per-sample keys ``mopd_kl_mask`` (absent =
    KL on for all) and ``mopd_kl_start`` (thought skipping), and verl's ``rollout_is_weights``
    when ``use_rollout_is_weights`` is set (as the public UI-MOPD release weights its KL).

    Returns:
        (bs, response_len) per-token losses (gated samples exactly 0, with exactly 0 gradient),
        and metrics as ``verl.utils.metric.Metric`` values (logged as ``actor/...``):

        - ``mopd/k3_mean_kl_on``: over this micro-batch's samples whose KL is on, the sum of K3 times
          the token weight (the rollout-IS weight with ``use_rollout_is_weights``, the thought
          window with ``mopd_kl_start``) divided by their counted tokens. verl aggregates it as the
          MEAN of the per-micro-batch values (and over DP ranks), not as a token mean over the step;
          micro-batches of padding rows only log nothing (:func:`mopd_distillation_ppo_loss`).
        - ``mopd/kl_mask_on_fraction``: fraction of this micro-batch's samples whose KL is on, mean
          over micro-batches.
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
    student = no_padding_2_padding(model_output["log_probs"], data)
    teacher = no_padding_2_padding(data[TEACHER_LOGPROBS_KEY], data).squeeze(-1)
    response_mask = _padded(data, "response_mask").bool()
    if teacher.shape != student.shape:
        raise ValueError(
            f"teacher_logprobs {tuple(teacher.shape)} does not match the student log-probs "
            f"{tuple(student.shape)}: mopd_k3 needs one log-prob per sampled token (not top-k)"
        )

    gate = data[KL_MASK_KEY] if KL_MASK_KEY in data.keys() else None
    start = data[KL_START_KEY] if KL_START_KEY in data.keys() else None
    token_weight = window = None
    if start is not None:
        token_weight = window = _window_mask(start, student.shape, student.device)
    if getattr(loss_config, "use_rollout_is_weights", False) and "rollout_is_weights" in data.keys():
        w = _padded(data, "rollout_is_weights").to(student.dtype)
        token_weight = w if token_weight is None else w * token_weight

    k3 = k3_kl(
        student,
        teacher,
        linear_above=getattr(loss_config, "k3_linear_above", K3_LINEAR_ABOVE),
        clamp_below=getattr(loss_config, "k3_clamp_below", K3_CLAMP_BELOW),
        gate=gate,
        token_mask=response_mask,
    )
    if token_weight is not None:
        k3 = k3 * token_weight
    with torch.no_grad():
        weight = torch.ones(student.shape[0], device=student.device) if gate is None else gate.reshape(-1)
        on = (weight > 0).float()
        counted = response_mask if window is None else response_mask * window  # thought tokens skipped
        # per sample: K3 over its counted tokens, with the constant "kept"-normalization weight the driver
        # may have folded into mopd_kl_mask divided out again (the rollout IS weights stay in)
        k3_on = (k3 * response_mask).sum(-1) / torch.where(on > 0, weight, torch.ones_like(weight))
        tokens_on = counted.sum(-1) * on
        metrics = {
            # IS-weighted K3 per counted token of the KL-on samples (docstring)
            "mopd/k3_mean_kl_on": Metric(AggregationType.MEAN, k3_on.sum() / tokens_on.sum().clamp_min(1e-8)),
            "mopd/kl_mask_on_fraction": Metric(AggregationType.MEAN, on.mean()),
            # sums over the micro-batches (per data-parallel rank, averaged over ranks): exact totals where
            # the means above average micro-batch means
            "mopd/k3_sum_kl_on": Metric(AggregationType.SUM, k3_on.sum()),
            "mopd/kl_on_tokens": Metric(AggregationType.SUM, tokens_on.sum()),
            "mopd/kl_on_samples": Metric(AggregationType.SUM, on.sum()),
        }
    return k3, metrics


def _response_tokens(data) -> int:
    mask = data["response_mask"]
    return int((mask.values() if getattr(mask, "is_nested", False) else mask).sum())


def mopd_distillation_ppo_loss(config, distillation_config, model_output: dict | None = None, data=None,
                               dp_group=None, student_logits: torch.Tensor | None = None, data_format: str = "thd"):
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


# ----------------------------------------------------------------------------------------------
# registration: the loss mode lives with the loss it names
# ----------------------------------------------------------------------------------------------

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
