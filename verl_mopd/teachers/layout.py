"""What a teacher worker receives and returns, in verl 0.9.1's layouts.

Input (one worker's shard, verl's no-padding layout as TransferQueue stores it): ``input_ids``
jagged ``(bs, j)`` prompt + response, ``responses`` / ``response_mask`` / ``loss_mask`` jagged
``(bs, r)``, ``position_ids`` jagged ``(bs, j)`` or ``(bs, 4, j)`` (Qwen-VL: text + 3 mrope rows),
``multi_modal_inputs`` one dict per sample, optionally ``old_log_probs`` jagged ``(bs, r)``, and the
batch-level ``temperature`` / ``compute_loss`` / ``calculate_entropy`` verl's engines read.

Output: ``teacher_logprobs`` jagged ``(bs, j, 1)`` over the whole sequence, position ``t`` holding
log p(token ``t + 1``): the layout verl's engines return ``log_probs`` in (labels rolled by one in
``preprocess_thd_engine``) and its teacher loop stores ``teacher_logprobs`` in, read back by
``verl.workers.utils.padding.no_padding_2_padding`` in the distillation loss. Only the response
positions are ever read; the ``hf`` backend leaves the prompt positions at 0.0.
"""

from __future__ import annotations

import time

import torch
from tensordict import TensorDict

from verl_mopd.losses import TEACHER_LOGPROBS_KEY

__all__ = [
    "TEACHER_MESH",
    "START_KEY",
    "END_KEY",
    "TEACHER_FIELDS",
    "MEGATRON_TEACHER_FIELDS",
    "teacher_fields",
    "CALL_INFO",
    "as_jagged",
    "position_rows",
    "to_full_sequence",
    "teacher_output",
    "output_metrics",
    "to_no_padding",
]

#: dispatch mesh every teacher worker registers (``Worker._register_dispatch_collect_info``)
TEACHER_MESH = "teacher"

#: the stored per-sample fields a teacher worker reads (absent ones are skipped by TransferQueue)
TEACHER_FIELDS = ("input_ids", "position_ids", "prompts", "responses", "response_mask", "loss_mask",
                  "multi_modal_inputs", "old_log_probs")
#: what a ``backend: megatron`` teacher reads of them: verl's Megatron engine takes ``input_ids``,
#: ``loss_mask``, ``multi_modal_inputs`` and builds its own (m)rope positions from the packed
#: ``input_ids``; ``response_mask`` cuts the output, ``old_log_probs`` gives the K3 metric (a few KB
#: per sample). ``position_ids`` (4 int64 rows per token for Qwen-VL), ``prompts`` and ``responses``
#: are not fetched.
MEGATRON_TEACHER_FIELDS = ("input_ids", "response_mask", "loss_mask", "multi_modal_inputs", "old_log_probs")


def teacher_fields(backend: str) -> tuple[str, ...]:
    """The fields a teacher of ``backend`` (``hf`` / ``megatron``) is sent."""
    return MEGATRON_TEACHER_FIELDS if backend == "megatron" else TEACHER_FIELDS

#: batch-level keys of a teacher call, as verl's ``_compute_ref_log_prob`` sets them; teachers are
#: never tempered (``validate_temperature`` keeps the student's rollout temperature at 1.0 too)
CALL_INFO = {"temperature": 1.0, "compute_loss": False, "calculate_entropy": False}

# names of the per-call metrics a worker returns as batch-level (non-tensor) entries
TIME_KEY, TOKENS_KEY, K3_SUM_KEY = "teacher_time_s", "teacher_tokens", "teacher_k3_sum"
# the call's wall-clock span on the worker (``time.time()``: comparable across processes, for the timeline)
START_KEY, END_KEY = "teacher_start_unix", "teacher_end_unix"


def as_jagged(t: torch.Tensor) -> torch.Tensor:
    """A jagged nested tensor of ``t``'s rows (TransferQueue packs per-sample tensors jagged; an
    equal-length batch may arrive stacked)."""
    if t.is_nested:
        return t
    return torch.nested.as_nested_tensor(list(t.unbind(0)), layout=torch.jagged)


def position_rows(position_ids: torch.Tensor, lengths: list[int]) -> list[torch.Tensor]:
    """Each sample's position ids, ``(T_i,)`` or ``(C, T_i)``, from the batch's ``position_ids`` whatever
    layout it arrived in; ``lengths`` are the samples' sequence lengths (``input_ids``).

    TransferQueue packs per-sample ``(C, T_i)`` position ids with ``torch.nested.as_nested_tensor``,
    which makes the *sequence* dim ragged when the lengths differ (``(bs, C, j)``, ragged dim 2) but
    the *channel* dim when they are all equal (``(bs, j, T)``, ragged dim 1). verl's
    ``tensordict_utils.maybe_fix_3d_position_ids`` (called by its engines after a pickle round trip)
    sets the ragged dim to 2 unconditionally, which turns the equal-length case into garbage rows
    (``(bs*C, C)`` slices). This reads the values by their shape against ``lengths`` instead, so it
    is right in either case, before or after verl's "fix".

    Raises:
        ValueError naming the shapes when no reading gives one ``(..., T_i)`` row per sample.
    """
    bs = len(lengths)
    if not position_ids.is_nested or position_ids.dim() == 2:
        rows = list(position_ids.unbind(0))
    else:
        values = position_ids.values()  # 2-D: (C, sum T_i) or, all T_i equal, (bs * C, T)
        if values.dim() == 2 and values.shape[1] == sum(lengths):
            bounds = [0]
            for n in lengths:
                bounds.append(bounds[-1] + n)
            rows = [values[:, bounds[i] : bounds[i + 1]] for i in range(bs)]
        elif values.dim() == 2 and len(set(lengths)) == 1 and values.shape[1] == lengths[0] and values.shape[0] % bs == 0:
            rows = list(values.reshape(bs, values.shape[0] // bs, lengths[0]).unbind(0))
        else:
            rows = []
    if len(rows) != bs or any(r.shape[-1] != n for r, n in zip(rows, lengths, strict=False)):
        raise ValueError(
            f"position_ids {tuple(position_ids.shape)} (nested: {position_ids.is_nested}, values "
            f"{tuple(position_ids.values().shape) if position_ids.is_nested else '-'}) does not hold one (..., T) row "
            f"per sample for sequence lengths {lengths}"
        )
    return rows


def to_full_sequence(response_logp, prompt_lens, response_lens) -> torch.Tensor:
    """Response-only log-probs -> the full-sequence ``teacher_logprobs`` layout.

    Args:
        response_logp: ``(bs, response_len)`` padded, or jagged ``(bs, r)``.
        prompt_lens, response_lens: ``(bs,)``.

    Returns:
        jagged ``(bs, p + r, 1)``: log-prob of response token ``j`` at position ``p + j - 1``,
        0.0 elsewhere.
    """
    resp_rows = response_logp.unbind(0) if response_logp.is_nested else response_logp
    rows = []
    for resp, p, r in zip(resp_rows, prompt_lens.tolist(), response_lens.tolist(), strict=True):
        full = torch.zeros(p + r, 1, dtype=torch.float32)
        full[p - 1 : p - 1 + r, 0] = resp[:r].to(torch.float32)
        rows.append(full)
    return torch.nested.as_nested_tensor(rows, layout=torch.jagged)


def output_metrics(response_logp: torch.Tensor, data: TensorDict) -> tuple[int, float]:
    """``(trained response tokens, sum of K3 over them)`` of a shard; K3 against the student's
    ``old_log_probs`` (0.0 without them). Synthetic padding rows have an all-zero ``response_mask``."""
    mask = as_jagged(data["response_mask"]).values().to(torch.float32)
    k3_sum = 0.0
    if "old_log_probs" in data.keys():
        from verl_mopd.losses import k3_kl

        old = as_jagged(data["old_log_probs"]).values().to(torch.float32)
        k3_sum = float((k3_kl(old, response_logp.values().to(torch.float32)) * mask).sum())
    return int(mask.sum()), k3_sum


def teacher_output(full_logp: torch.Tensor, data: TensorDict, started: float) -> TensorDict:
    """A worker's return value: ``{TEACHER_LOGPROBS_KEY: (bs, j, 1)}`` plus the call's metrics as batch-level
    entries (verl's ``tqbridge`` stores the tensor in TransferQueue and the metrics in the returned
    meta's ``extra_info``).

    Args:
        full_logp: jagged ``(bs, j)`` whole-sequence log-probs (verl's engine ``log_probs``).
        data: the shard the worker was given.
        started: ``time.perf_counter()`` at the start of the call (the call's span, ``START_KEY`` to
            ``END_KEY``, is stamped in ``time.time()``).
    """
    from verl.utils import tensordict_utils as tu
    from verl.workers.utils.padding import response_from_nested

    full_logp = full_logp.to(torch.float32)
    tokens, k3_sum = output_metrics(response_from_nested(full_logp, as_jagged(data["response_mask"])), data)
    values, offsets = full_logp.values(), full_logp.offsets()
    out = TensorDict({TEACHER_LOGPROBS_KEY: torch.nested.nested_tensor_from_jagged(values.unsqueeze(-1), offsets)},
                     batch_size=[len(data)])
    elapsed, now = time.perf_counter() - started, time.time()
    tu.assign_non_tensor(out, **{TIME_KEY: elapsed, TOKENS_KEY: tokens, K3_SUM_KEY: k3_sum,
                                 START_KEY: now - elapsed, END_KEY: now})
    return out


def to_no_padding(batch) -> tuple[TensorDict, int | None]:
    """A DataProto / TensorDict step batch in the no-padding layout the teacher workers take.

    Args:
        batch: no-padding (jagged ``input_ids``) or verl's padded layout (``input_ids`` /
            ``attention_mask`` ``(bs, P + R)``, prompt left-padded, ``responses`` ``(bs, R)``,
            optional ``response_mask`` / ``position_ids`` ``(bs, L)`` or ``(bs, C, L)`` /
            ``old_log_probs`` ``(bs, R)``); non-tensor columns (routing key, ``multi_modal_inputs``)
            travel along.

    Returns:
        ``(data, response_width)``: ``response_width`` is ``R`` for a padded input, else None.
    """
    from verl.protocol import DataProto
    from verl.utils import tensordict_utils as tu

    if isinstance(batch, DataProto):
        data = tu.get_tensordict({**batch.batch.to_dict(), **{k: list(v) for k, v in batch.non_tensor_batch.items()}})
    else:
        data = batch.copy()
    input_ids = data["input_ids"]
    if input_ids.is_nested:
        if "response_mask" not in data.keys():
            data["response_mask"] = torch.nested.as_nested_tensor(
                [torch.ones(len(r), dtype=torch.int64) for r in data["responses"].unbind(0)], layout=torch.jagged)
        return data, None
    attention_mask, responses = data["attention_mask"], data["responses"]
    width = responses.shape[-1]
    n_resp = attention_mask[:, -width:].sum(-1).tolist()
    response_mask = data["response_mask"] if "response_mask" in data.keys() else attention_mask[:, -width:]

    def jag(rows):
        return torch.nested.as_nested_tensor(rows, layout=torch.jagged)

    valid = attention_mask.bool()
    seqs = [input_ids[i][valid[i]] for i in range(len(n_resp))]
    out = {
        "input_ids": jag(seqs),
        "prompts": jag([s[: len(s) - r] for s, r in zip(seqs, n_resp, strict=True)]),
        "responses": jag([responses[i, :r] for i, r in enumerate(n_resp)]),
        "response_mask": jag([response_mask[i, :r] for i, r in enumerate(n_resp)]),
    }
    if "position_ids" in data.keys():
        pos = data["position_ids"]
        rows = [pos[i][..., valid[i]] for i in range(len(n_resp))]
        out["position_ids"] = tu.nested_tensor_from_tensor_list(rows, ragged_idx=rows[0].dim())
    if "old_log_probs" in data.keys():
        out["old_log_probs"] = jag([data["old_log_probs"][i, :r] for i, r in enumerate(n_resp)])
    skip = {"input_ids", "attention_mask", "responses", "response_mask", "position_ids", "old_log_probs", "prompts"}
    for key in data.keys():
        if key not in skip:
            out[key] = data[key]
    return TensorDict(out, batch_size=[len(n_resp)]), width
