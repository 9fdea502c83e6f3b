"""``hf`` backend: a verl single-controller worker holding a ``transformers`` model that scores the
student's sampled response tokens (forward only, CPU or GPU).

Reuses verl's ``Worker`` and its nd-compute dispatch (the one verl's engine workers use: a TensorDict
is split by ``BatchData.chunk``; a ``KVBatchMeta`` is fetched by each rank from TransferQueue with
verl's own conversions, through ``verl_mopd.teachers.fetch``, which reads a GRPO group's shared images
once), verl's model-class choice
(``verl.utils.model.get_hf_auto_model_class``: Qwen3-VL and other VLMs load with
``AutoModelForImageTextToText``) and ``verl.utils.torch_functional.logprobs_from_logits``.

Layouts read by :func:`rows_from_batch`:
- no-padding (what the trainer stores): ``input_ids`` jagged ``(bs, j)`` prompt + response,
  ``responses`` jagged ``(bs, r)``, optional ``position_ids`` jagged ``(bs, j)`` or ``(bs, 4, j)``.
- padded (in-memory DataProto): ``input_ids``/``attention_mask`` ``(bs, prompt_len + response_len)``
  (prompt left-padded, response right-padded), ``responses`` ``(bs, response_len)``, optional
  ``position_ids`` ``(bs, L)`` or ``(bs, C, L)``.
Multimodal: a per-sample ``multi_modal_inputs`` dict (``pixel_values``, ``image_grid_thw``, ...) is
concatenated along dim 0 over a micro-batch and passed to the model, as verl's actor does.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Mapping
from dataclasses import dataclass

import torch
from verl.single_controller.base import Worker
from verl.single_controller.base.decorator import Dispatch, register
from verl.utils.torch_functional import logprobs_from_logits

from verl_mopd.teachers.fetch import FetchOnceWorker, fetch_once_dispatch_mode
from verl_mopd.teachers.layout import TEACHER_MESH, position_rows, teacher_output
from verl_mopd.teachers.router import get_field
from verl_mopd.teachers.weights import HostWeights, resolve_policy

__all__ = ["ScoringRow", "rows_from_batch", "plan_micro_batches", "score_rows", "pack_like_old_log_probs",
           "load_teacher_model", "HFTeacherWorker"]


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
    no-padding (jagged) layout.
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
        pos = position_rows(position_ids, [len(s) for s in seqs]) if position_ids is not None else None
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
def score_rows(model, rows: list[ScoringRow], token_budget: int, device: str | torch.device = "cpu",
               temperature: float = 1.0) -> list[torch.Tensor]:
    """Log-prob of each row's response tokens under ``model`` (logits divided by ``temperature``, as
    verl's engines do): a list of ``(n_response_i,)`` float32.

    Micro-batches are right-padded (exact for a causal LM: no valid token attends to padding);
    log-softmax runs only over the micro-batch's response window.
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
        # window [lo, hi) of positions that predict some row's response tokens
        lo = min(len(rows[i].tokens) - 1 - rows[i].n_response for i in mb)
        hi = max(len(rows[i].tokens) - 1 for i in mb)
        logits = model(**kwargs).logits[:, lo:hi].float()
        if temperature != 1.0:
            logits = logits / temperature
        logp = logprobs_from_logits(logits, ids[:, lo + 1 : hi + 1].to(device), inplace_backward=False)
        for j, i in enumerate(mb):
            t, r = len(rows[i].tokens), rows[i].n_response
            out[i] = logp[j, t - 1 - r - lo : t - 1 - lo].float().cpu()
    return out


def pack_like_old_log_probs(per_row: list[torch.Tensor], response_len: int | None) -> torch.Tensor:
    """Padded ``(bs, response_len)`` with 0.0 after each response, or jagged when ``response_len`` is None."""
    if response_len is None:
        return torch.nested.as_nested_tensor(per_row, layout=torch.jagged)
    out = torch.zeros(len(per_row), response_len, dtype=torch.float32)
    for i, lp in enumerate(per_row):
        out[i, : lp.shape[0]] = lp
    return out


def load_teacher_model(model_path: str, dtype: str = "float32", trust_remote_code: bool = False):
    """The checkpoint with an LM head, through verl's own class choice (``get_hf_auto_model_class``:
    ``AutoModelForImageTextToText`` for Qwen3-VL / Qwen2.5-VL, ``AutoModelForCausalLM`` for LMs)."""
    from transformers import AutoConfig, AutoModel
    from verl.utils.model import get_hf_auto_model_class

    hf_config = AutoConfig.from_pretrained(model_path, trust_remote_code=trust_remote_code)
    auto_class = get_hf_auto_model_class(hf_config)
    if auto_class is AutoModel:
        raise ValueError(
            f"teacher checkpoint {model_path}: architecture {getattr(hf_config, 'architectures', None)} "
            f"(model_type {hf_config.model_type!r}) has no language-model head class in transformers; "
            "a teacher must be a causal LM or an image-text-to-text model"
        )
    return auto_class.from_pretrained(model_path, dtype=getattr(torch, dtype), trust_remote_code=trust_remote_code)


class HFTeacherWorker(FetchOnceWorker, Worker):
    """One rank of an ``hf`` teacher: loads a ``transformers`` model, scores responses.

    Every rank is its own data-parallel rank of mesh ``TEACHER_MESH`` (registered the way verl's
    ``TrainingWorker`` registers its ``train`` mesh), so the group dispatches with verl's nd-compute
    dispatch. ``config`` is a ``TeacherConfig`` (or its dict). A ``colocated`` teacher on CUDA keeps
    its weights by its ``weights`` policy between calls (``resident``, ``pinned``, ``pageable``).
    """

    def __init__(self, config, num_threads: int | None = None):
        super().__init__()
        from verl_mopd.teachers.config import TeacherConfig

        self.config = config if isinstance(config, TeacherConfig) else TeacherConfig(**dict(config))
        if num_threads is not None:
            torch.set_num_threads(num_threads)
        self.model = None
        self.device = "cpu"
        self.offload = False
        self._register_dispatch_collect_info(TEACHER_MESH, dp_rank=self.rank, is_collect=True)

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def init_model(self):
        cfg = self.config
        device = "cuda" if cfg.device == "cuda" and torch.cuda.is_available() else "cpu"
        if cfg.device == "cuda" and device != "cuda":
            raise RuntimeError(f"mopd.teachers.{cfg.platform}.device=cuda but this worker sees no CUDA device")
        self.device = device
        self.offload = cfg.placement == "colocated" and device == "cuda"
        self.model = load_teacher_model(cfg.model_path, cfg.dtype, cfg.trust_remote_code)
        self.model.to(device).eval()
        self.weights = HostWeights([*self.model.parameters(), *self.model.buffers()], device,
                                   resolve_policy(cfg.weights, self.offload))
        self.weights.offload()  # the actor's GPU memory is free until the first call
        return True

    @contextlib.contextmanager
    def _on_device(self):
        """The model on its device for one call; back in host memory afterwards by the teacher's
        ``weights`` policy (``verl_mopd.teachers.weights``)."""
        self.weights.load()
        try:
            yield
        finally:
            self.weights.offload()
            if self.weights.policy != "resident":
                torch.cuda.empty_cache()

    @register(dispatch_mode=fetch_once_dispatch_mode(TEACHER_MESH), blocking=False)
    def compute_teacher_log_prob(self, shard):
        """``shard``: this rank's shard, a TensorDict in the no-padding layout, or a ``DeferredShard``
        (the group dispatched a ``KVBatchMeta``) that this rank fetches from TransferQueue.

        Returns ``teacher_output``: ``{TEACHER_LOGPROBS_KEY: (bs, j, 1)}`` and the call's metrics (for a
        deferred shard, stored in TransferQueue and its ``KVBatchMeta`` returned, as ``tqbridge`` does).
        """
        if self.model is None:
            raise RuntimeError("call init_model() before compute_teacher_log_prob()")
        started = time.perf_counter()
        data = self.fetch_shard(shard)
        return self.store_output(self._score(data, started), shard, is_collect=True)

    def _score(self, data, started: float):
        from verl.utils import tensordict_utils as tu

        if len(data) == 0:  # a rank with no rows (fewer rows than ranks)
            return None
        # not verl's tu.maybe_fix_3d_position_ids: it breaks a shard whose samples all have one length
        # (teachers.layout.position_rows reads both layouts)
        temperature = float(tu.get_non_tensor_data(data, key="temperature", default=1.0))
        rows, width = rows_from_batch(data)
        if width is not None:
            raise ValueError("teacher workers take the no-padding layout (jagged input_ids); "
                             "PlatformTeacherGroup converts padded batches before dispatch")
        with self._on_device():
            per_row = score_rows(self.model, rows, self.config.micro_batch_tokens, self.device, temperature)
        full = []
        for row, lp in zip(rows, per_row, strict=True):
            seq = torch.zeros(len(row.tokens), dtype=torch.float32)
            t = len(row.tokens)
            seq[t - 1 - row.n_response : t - 1] = lp
            full.append(seq)
        return teacher_output(torch.nested.as_nested_tensor(full, layout=torch.jagged), data, started)
