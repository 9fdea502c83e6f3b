"""``hf`` backend: a verl single-controller worker holding a ``transformers`` causal LM that
scores the student's sampled response tokens (forward only, CPU or GPU).

Reuses verl's ``Worker`` / ``@register`` dispatch (``verl/single_controller``) and
``verl.utils.torch_functional.logprobs_from_logits`` (the same log-prob kernel verl's actor uses).

Layouts read (the step batch as the trainer holds it):
- padded: ``input_ids``/``attention_mask`` ``(bs, prompt_len + response_len)`` (prompt
  left-padded, response right-padded), ``responses`` ``(bs, response_len)``, optional
  ``position_ids`` ``(bs, L)`` or ``(bs, C, L)`` (mrope). Output ``(bs, response_len)``, the
  same shape and padding as verl's ``old_log_probs``; padded response positions are 0.0.
- no-padding: ``input_ids`` nested jagged ``(bs, j)`` holding prompt + response, ``responses``
  nested ``(bs, j)``. Output nested ``(bs, j)`` of response length.
Multimodal: a per-sample ``multi_modal_inputs`` dict (``pixel_values``, ``image_grid_thw``, ...)
is concatenated along dim 0 over a micro-batch and passed to the model, as verl's actor does.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np
import torch
from verl.single_controller.base import Worker
from verl.single_controller.base.decorator import Dispatch, register
from verl.utils.torch_functional import logprobs_from_logits
from verl_mopd.teachers.router import get_field

__all__ = ["ScoringRow", "rows_from_batch", "plan_micro_batches", "score_rows", "HFTeacherWorker"]


@dataclass
class ScoringRow:
    """One sample to score: ``tokens`` (T,) the full sequence, its last ``n_response`` tokens are
    the response; ``position_ids`` (T,) or (C, T) or None; ``mm`` multimodal inputs or None."""

    tokens: torch.Tensor
    n_response: int
    position_ids: torch.Tensor | None = None
    mm: Mapping | None = None




def rows_from_batch(batch) -> tuple[list[ScoringRow], int | None]:
    """Per-sample sequences of a DataProto / TensorDict batch.

    Returns ``(rows, response_len)``; ``response_len`` is the padded width, or None for the
    nested (no-padding) layout.
    """
    input_ids, responses = get_field(batch, "input_ids"), get_field(batch, "responses")
    if input_ids is None or responses is None:
        raise KeyError("teacher scoring needs `input_ids` and `responses` in the batch")
    position_ids = get_field(batch, "position_ids")
    mm = get_field(batch, "multi_modal_inputs")
    mm_list = None
    if mm is not None:
        mm_list = mm.tolist() if hasattr(mm, "tolist") else list(mm)
    rows = []
    if input_ids.is_nested:
        seqs, resps = input_ids.unbind(0), responses.unbind(0)
        pos = position_ids.unbind(0) if position_ids is not None and position_ids.is_nested else None
        for i, (seq, resp) in enumerate(zip(seqs, resps, strict=True)):
            rows.append(ScoringRow(seq, int(resp.shape[-1]), None if pos is None else pos[i],
                                   None if mm_list is None else mm_list[i]))
        return rows, None
    attention_mask = get_field(batch, "attention_mask")
    if attention_mask is None:
        raise KeyError("padded teacher scoring needs `attention_mask`")
    response_len = responses.shape[-1]
    valid = attention_mask.bool()
    n_resp = attention_mask[:, -response_len:].sum(-1)
    for i in range(input_ids.shape[0]):
        keep = valid[i]
        pos = None
        if position_ids is not None:
            pos = position_ids[i][..., keep]
        rows.append(ScoringRow(input_ids[i][keep], int(n_resp[i]), pos, None if mm_list is None else mm_list[i]))
    return rows, response_len


def plan_micro_batches(lengths: list[int], token_budget: int) -> list[list[int]]:
    """Group row ids into micro-batches whose padded size ``len(mb) * max_len`` fits the budget.

    Rows are taken longest first (less padding); a row longer than the budget gets its own
    micro-batch. Every row id appears exactly once.
    """
    order = sorted(range(len(lengths)), key=lambda i: -lengths[i])
    plan, cur, cur_max = [], [], 0
    for i in order:
        new_max = max(cur_max, lengths[i])
        if cur and new_max * (len(cur) + 1) > token_budget:
            plan.append(cur)
            cur, new_max = [], lengths[i]
        cur.append(i)
        cur_max = new_max
    if cur:
        plan.append(cur)
    return plan


def _concat_mm(items: list[Mapping | None]) -> dict:
    items = [m for m in items if m]
    if not items:
        return {}
    return {k: torch.cat([m[k] for m in items], dim=0) for k in items[0]}


@torch.no_grad()
def score_rows(model, rows: list[ScoringRow], token_budget: int, device: str | torch.device = "cpu") -> list[torch.Tensor]:
    """Log-prob of each row's response tokens under ``model``: a list of ``(n_response_i,)`` float32.

    Micro-batches are right-padded (exact for a causal LM: no valid token attends to padding).
    """
    out: list[torch.Tensor | None] = [None] * len(rows)
    for mb in plan_micro_batches([len(r.tokens) for r in rows], token_budget):
        width = max(len(rows[i].tokens) for i in mb)
        ids = torch.zeros(len(mb), width, dtype=torch.long)
        mask = torch.zeros(len(mb), width, dtype=torch.long)
        has_pos = rows[mb[0]].position_ids is not None
        pos = None
        if has_pos:
            p0 = rows[mb[0]].position_ids
            pos = torch.zeros(len(mb), *p0.shape[:-1], width, dtype=p0.dtype)
        for j, i in enumerate(mb):
            t = len(rows[i].tokens)
            ids[j, :t] = rows[i].tokens
            mask[j, :t] = 1
            if has_pos:
                pos[j, ..., :t] = rows[i].position_ids
        kwargs = {"input_ids": ids.to(device), "attention_mask": mask.to(device), "use_cache": False}
        if has_pos:
            # (bs, C, L) -> (C, bs, L): the layout transformers' mrope models take
            kwargs["position_ids"] = (pos.transpose(0, 1) if pos.dim() == 3 else pos).to(device)
        mm = _concat_mm([rows[i].mm for i in mb])
        kwargs.update({k: v.to(device) for k, v in mm.items()})
        logits = model(**kwargs).logits.float()
        logp = logprobs_from_logits(logits[:, :-1], ids[:, 1:].to(device), inplace_backward=False)
        for j, i in enumerate(mb):
            t, r = len(rows[i].tokens), rows[i].n_response
            out[i] = logp[j, t - 1 - r : t - 1].cpu()
    return out


def pack_like_old_log_probs(per_row: list[torch.Tensor], response_len: int | None) -> torch.Tensor:
    """Padded ``(bs, response_len)`` with 0.0 after each response, or nested when ``response_len`` is None."""
    if response_len is None:
        return torch.nested.as_nested_tensor(per_row, layout=torch.jagged)
    out = torch.zeros(len(per_row), response_len, dtype=torch.float32)
    for i, lp in enumerate(per_row):
        out[i, : lp.shape[0]] = lp
    return out


class HFTeacherWorker(Worker):
    """One rank of an ``hf`` teacher: loads a ``transformers`` causal LM, scores responses.

    ``config`` is a ``TeacherConfig`` (or its dict). On CPU each rank is a plain process; on
    GPU, verl's ``Worker`` sets the visible device.
    """

    def __init__(self, config, num_threads: int | None = None):
        super().__init__()
        from verl_mopd.teachers.config import TeacherConfig

        self.config = config if isinstance(config, TeacherConfig) else TeacherConfig(**dict(config))
        if num_threads is not None:
            torch.set_num_threads(num_threads)
        self.model = None

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def init_model(self):
        from transformers import AutoModelForCausalLM

        cfg = self.config
        device = "cuda" if cfg.device == "cuda" and torch.cuda.is_available() else "cpu"
        if cfg.device == "cuda" and device != "cuda":
            raise RuntimeError(f"mopd.teachers.{cfg.platform}.device=cuda but this worker sees no CUDA device")
        self.device = device
        self.model = AutoModelForCausalLM.from_pretrained(
            cfg.model_path, dtype=getattr(torch, cfg.dtype), trust_remote_code=cfg.trust_remote_code
        ).to(device)
        self.model.eval()
        return True

    @register(dispatch_mode=Dispatch.DP_COMPUTE_PROTO, blocking=False)
    def compute_teacher_log_prob(self, data):
        """``data``: this rank's rows (DataProto or TensorDict, padded or nested layout).

        Returns ``{"teacher_logprobs": (bs, response_len) or nested, "teacher_time_s": float,
        "tokens": int}``; the group collects the per-rank results itself (layout-agnostic).
        """
        if self.model is None:
            raise RuntimeError("call init_model() before compute_teacher_log_prob()")
        start = time.perf_counter()
        rows, response_len = rows_from_batch(data)
        per_row = score_rows(self.model, rows, self.config.micro_batch_tokens, self.device)
        return {
            "teacher_logprobs": pack_like_old_log_probs(per_row, response_len),
            "teacher_time_s": time.perf_counter() - start,
            "tokens": int(sum(r.n_response for r in rows)),
        }


def response_lengths(batch) -> np.ndarray:
    """``(bs,)`` number of response tokens per row (padded or nested layout)."""
    rows, _ = rows_from_batch(batch)
    return np.array([r.n_response for r in rows], dtype=np.int64)
