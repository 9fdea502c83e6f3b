"""Fetch a teacher shard from TransferQueue once per data-parallel group, broadcast it over the group.

verl's nd-compute dispatch gives every rank of a data-parallel (DP) group the same ``KVBatchMeta``
and verl's ``tqbridge`` (wrapped around every ``@register`` method) makes each of them fetch it: a
TP-8 teacher reads each shard 8 times from TransferQueue, images included. Here:

- :func:`fetch_once_dispatch_mode`: verl's nd-compute dispatch on a mesh, with each DP shard
  wrapped in a :class:`DeferredShard`, which ``tqbridge`` does not recognize (so it fetches nothing);
  the collect side is verl's own (``collect_lazy_compute_data_proto``).
- :class:`FetchOnceWorker`: a mixin for a verl ``Worker``. :meth:`~FetchOnceWorker.fetch_shard`
  fetches on one rank of the model-parallel group and broadcasts the shard to the others
  (``torch.distributed.broadcast_object_list``); :meth:`~FetchOnceWorker.store_output` writes the
  result from the collect rank. Both run verl's own conversions (``kv_batch_meta2batch_meta``,
  ``_meta_to_realdata``, ``_update_meta_with_output``, ``batch_meta2kv_batch_meta``), exactly the
  calls ``tqbridge`` makes, so the stored layout and the returned meta are the ones verl produces.

Screenshots once per GRPO group (``SHARE_GROUP_INPUTS`` in the call's ``extra_info``): the rollouts of
one prompt (verl's keys ``{uid}_{session}_{index}``) carry the same ``multi_modal_inputs``, stored once
per rollout. :func:`shared_input_rows` finds the rows that provably share them, and the fetching
rank reads the field for one row per group and hands every row of the group that same dict
(:meth:`~FetchOnceWorker.fetch_shard`); the broadcast then pickles each dict once too (pickle
memoizes shared objects).

Every rank counts what it read from TransferQueue, field by field (:meth:`~FetchOnceWorker.fetch_stats`).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial
from typing import Any

import torch
from verl.single_controller.base.decorator import Dispatch, register

__all__ = ["DeferredShard", "fetch_once_dispatch_mode", "tensordict_nbytes", "field_nbytes", "SHARED_FIELD",
           "SHARE_GROUP_INPUTS", "group_uid", "shared_input_rows", "FetchOnceWorker"]

#: the per-sample field the rollouts of one prompt share (images: 99.9 % of a teacher's input bytes)
SHARED_FIELD = "multi_modal_inputs"
#: batch-level ``extra_info`` key of a teacher call: fetch ``SHARED_FIELD`` once per group of rows that share it
SHARE_GROUP_INPUTS = "mopd_share_group_inputs"


@dataclass(frozen=True)
class DeferredShard:
    """One DP rank's ``BatchMeta`` (or ``KVBatchMeta``), not fetched yet (``tqbridge`` only fetches
    ``BatchMeta`` / ``KVBatchMeta`` arguments)."""

    meta: Any

    def __len__(self) -> int:
        return len(self.meta)


def _dispatch_deferred(mesh_name: str, worker_group, *args, **kwargs):
    """verl's ``dispatch_lazy_compute_data_proto`` with each DP chunk of a ``KVBatchMeta`` wrapped."""
    from transfer_queue import BatchMeta, KVBatchMeta
    from verl.single_controller.base.decorator import _split_args_kwargs_data_proto, dispatch_nd_compute

    if mesh_name not in worker_group._dispatch_info:
        worker_group._dispatch_info[mesh_name] = worker_group._query_dispatch_info(mesh_name)
    dp_rank_mapping = worker_group._dispatch_info[mesh_name]
    dp_size = max(dp_rank_mapping) + 1
    split_args, split_kwargs = _split_args_kwargs_data_proto(dp_size, *args, **kwargs)

    def wrap(chunks):  # verl's BatchData.chunk turns a KVBatchMeta into per-rank BatchMetas
        return [DeferredShard(c) if isinstance(c, BatchMeta | KVBatchMeta) else c for c in chunks]

    return dispatch_nd_compute(dp_rank_mapping, dp_size, worker_group, *[wrap(a) for a in split_args],
                               **{k: wrap(v) for k, v in split_kwargs.items()})


def fetch_once_dispatch_mode(mesh_name: str) -> dict:
    """A verl dispatch mode (``register(dispatch_mode=...)``): nd-compute on ``mesh_name``, shards deferred."""
    from verl.single_controller.base.decorator import collect_lazy_compute_data_proto

    return {"dispatch_fn": partial(_dispatch_deferred, mesh_name),
            "collect_fn": partial(collect_lazy_compute_data_proto, mesh_name)}


def tensordict_nbytes(data) -> int:
    """Bytes of tensor data in a TensorDict: dense and jagged tensors (values and offsets) and the
    tensors inside per-sample dicts (``multi_modal_inputs``)."""

    def nbytes(value) -> int:
        if isinstance(value, torch.Tensor):
            if value.is_nested:
                return sum(nbytes(t) for t in (value.values(), value.offsets()))
            return value.numel() * value.element_size()
        if isinstance(value, dict):
            return sum(nbytes(v) for v in value.values())
        if isinstance(value, list | tuple):
            return sum(nbytes(v) for v in value)
        return 0

    total = 0
    for key in data.keys():
        value = data[key]
        total += nbytes(value.tolist() if hasattr(value, "tolist") and not isinstance(value, torch.Tensor)
                        else value)
    return total


def field_nbytes(data) -> dict[str, int]:
    """:func:`tensordict_nbytes` of each per-sample field of ``data`` (batch-level entries, such as
    ``temperature``, left out)."""
    from tensordict import NonTensorData

    return {key: tensordict_nbytes(data.select(key)) for key in data.keys()
            if not isinstance(data.get(key), NonTensorData)}


def group_uid(key: str) -> str | None:
    """The prompt's ``uid`` of a TransferQueue key in verl's format ``{uid}_{session_id}_{index}``
    (``verl/trainer/ppo/v1/agent_loop_tq.py``), or None for a key of another shape."""
    parts = key.rsplit("_", 2)
    return parts[0] if len(parts) == 3 and parts[1].isdigit() and parts[2].isdigit() else None


def shared_input_rows(keys: list[str], input_ids: torch.Tensor, response_mask: torch.Tensor) -> list[int]:
    """For each row, the first row whose ``multi_modal_inputs`` it provably shares (itself if none).

    Args:
        keys: TransferQueue keys in verl's format ``{uid}_{session_id}_{index}``
            (``verl/trainer/ppo/v1/agent_loop_tq.py``).
        input_ids: jagged ``(bs, j)`` prompt + response.
        response_mask: jagged ``(bs, r)``.

    Rows share when they have the same ``uid``, the same prompt tokens, and a response mask of all
    ones. verl's agent loop builds ``multi_modal_inputs`` from the trajectory's images
    (``_compute_multi_modal_inputs``): the prompt's, plus any a tool or environment turn adds, and such
    turns are response tokens with mask 0. So a row whose response is all model tokens holds only its
    prompt's images, and rollouts of one prompt hold the same ones. A row with a masked response
    token (a multi-turn trajectory, or verl's all-zero padding rows) shares with no other row.
    """
    from verl_mopd.teachers.layout import as_jagged

    seqs, masks = as_jagged(input_ids).unbind(0), as_jagged(response_mask).unbind(0)
    if not len(keys) == len(seqs) == len(masks):
        raise ValueError(f"shared_input_rows: {len(keys)} keys, {len(seqs)} input_ids, {len(masks)} response masks")
    first: dict[tuple, int] = {}
    out = []
    for i, (key, seq, mask) in enumerate(zip(keys, seqs, masks, strict=True)):
        uid = group_uid(key)
        if uid is None or len(mask) == 0 or not bool((mask == 1).all()):
            out.append(i)
            continue
        prompt = tuple(seq[: len(seq) - len(mask)].tolist())
        out.append(first.setdefault((uid, prompt), i))
    return out


def _batch_meta(meta):
    """``meta`` as a ``BatchMeta``, TransferQueue's client initialized in this process (as ``tqbridge`` does)."""
    import transfer_queue as tq
    from transfer_queue import KVBatchMeta
    from verl.utils import transferqueue_utils

    if not transferqueue_utils.TQ_INITIALIZED:
        tq.init()
        transferqueue_utils.TQ_INITIALIZED = True
    return transferqueue_utils.kv_batch_meta2batch_meta(meta) if isinstance(meta, KVBatchMeta) else meta


class FetchOnceWorker:
    """Mixin for a verl ``Worker`` whose ranks form model-parallel groups within a DP group.

    A subclass implements :meth:`fetch_group`; its ``@register(dispatch_mode=fetch_once_dispatch_mode(
    mesh))`` method calls :meth:`fetch_shard` first and returns :meth:`store_output`.
    """

    def fetch_group(self) -> tuple[Any, int, torch.device | None]:
        """``(process group, global rank that fetches, broadcast device)`` of this rank's
        model-parallel group; ``(None, self.rank, None)`` when the rank is alone in it.

        This default is that case (every rank its own group, so every rank fetches its own shard, as
        verl's ``tqbridge`` does); a worker with tensor or pipeline parallelism overrides it
        (``MegatronTeacherWorker``: its TP x PP group and the group's first rank)."""
        return None, self.rank, None

    def _stats(self) -> dict:
        if not hasattr(self, "_fetch_counters"):
            self._fetch_counters = {"fetches": 0, "bytes": 0, "samples": 0, "fields": {}}
        return self._fetch_counters

    def _count(self, data, samples: int = 0) -> None:
        stats = self._stats()
        for key, n in field_nbytes(data).items():
            stats["bytes"] += n
            stats["fields"][key] = stats["fields"].get(key, 0) + n
        stats["samples"] += samples

    def _fetch(self, meta):
        """This shard's TensorDict from TransferQueue (``meta`` a ``BatchMeta``), ``SHARED_FIELD`` read once
        per group of rows that share it when the call asks for it (:func:`shared_input_rows`)."""
        from tensordict import NonTensorStack
        from verl.utils.transferqueue_utils import _meta_to_realdata, batch_meta2kv_batch_meta

        self._stats()["fetches"] += 1
        fields = meta.field_names
        if not (meta.extra_info.get(SHARE_GROUP_INPUTS) and SHARED_FIELD in fields
                and {"input_ids", "response_mask"} <= set(fields) and len(meta) > 1):
            data = _meta_to_realdata(meta)
            self._count(data, len(data))
            return data
        data = _meta_to_realdata(meta.select_fields([f for f in fields if f != SHARED_FIELD]))
        self._count(data, len(data))
        keys = batch_meta2kv_batch_meta(meta).keys  # the controller's key index, no sample data
        owner = shared_input_rows(keys, data["input_ids"], data["response_mask"])
        unique = sorted(set(owner))
        heavy = meta.select_fields([SHARED_FIELD]).select_samples(unique)
        heavy.extra_info = {}
        fetched = _meta_to_realdata(heavy)
        self._count(fetched)
        by_row = dict(zip(unique, list(fetched[SHARED_FIELD]), strict=True))
        data[SHARED_FIELD] = NonTensorStack(*[by_row[r] for r in owner])
        return data

    def fetch_shard(self, shard):
        """This DP rank's shard on every rank of its model-parallel group, read once from TransferQueue.

        ``shard``: a :class:`DeferredShard` (or an already fetched TensorDict, returned as is).
        Returns the TensorDict verl's ``tqbridge`` would have passed (fields and ``extra_info``).
        """
        if not isinstance(shard, DeferredShard):
            return shard
        group, src, device = self.fetch_group()
        data = None
        if group is None or self._global_rank() == src:
            data = self._fetch(_batch_meta(shard.meta))
        if group is not None:
            box = [data]
            torch.distributed.broadcast_object_list(box, src=src, group=group, device=device)
            data = box[0]
        return data

    def store_output(self, output, shard, is_collect: bool):
        """What ``tqbridge`` returns for ``output``: on a collect rank the output is put into
        TransferQueue and its ``KVBatchMeta`` returned (batch-level entries of ``output`` become its
        ``extra_info``); elsewhere None (not collected)."""
        if not isinstance(shard, DeferredShard):
            return output
        if output is None or not is_collect:
            return None
        from transfer_queue import KVBatchMeta
        from verl.utils.transferqueue_utils import _update_meta_with_output, batch_meta2kv_batch_meta

        meta = _update_meta_with_output(output, _batch_meta(shard.meta), type(self).__name__)
        if not isinstance(shard.meta, KVBatchMeta):
            return meta
        kv_meta = batch_meta2kv_batch_meta(meta)
        kv_meta.tags = shard.meta.tags
        return kv_meta

    def _global_rank(self) -> int:
        return torch.distributed.get_rank() if torch.distributed.is_initialized() else int(self.rank)

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def fetch_stats(self) -> dict:
        """This rank's TransferQueue reads so far: ``fetches``, ``bytes``, ``samples`` and ``fields``
        (``{field: bytes}``)."""
        stats = self._stats()
        return {**stats, "fields": dict(stats["fields"])}
