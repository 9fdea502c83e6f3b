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

Every rank counts what it read from TransferQueue (:meth:`~FetchOnceWorker.fetch_stats`).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial
from typing import Any

import torch
from verl.single_controller.base.decorator import Dispatch, register

__all__ = ["DeferredShard", "fetch_once_dispatch_mode", "tensordict_nbytes", "FetchOnceWorker"]


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
            self._fetch_counters = {"fetches": 0, "bytes": 0, "samples": 0}
        return self._fetch_counters

    def fetch_shard(self, shard):
        """This DP rank's shard on every rank of its model-parallel group, read once from TransferQueue.

        ``shard``: a :class:`DeferredShard` (or an already fetched TensorDict, returned as is).
        Returns the TensorDict verl's ``tqbridge`` would have passed (fields and ``extra_info``).
        """
        if not isinstance(shard, DeferredShard):
            return shard
        from verl.utils.transferqueue_utils import _meta_to_realdata

        group, src, device = self.fetch_group()
        data = None
        if group is None or self._global_rank() == src:
            data = _meta_to_realdata(_batch_meta(shard.meta))
            stats = self._stats()
            stats["fetches"] += 1
            stats["bytes"] += tensordict_nbytes(data)
            stats["samples"] += len(data)
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
        """This rank's TransferQueue reads so far: ``fetches``, ``bytes``, ``samples``."""
        return dict(self._stats())
