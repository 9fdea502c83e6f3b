"""N7: a TP-shaped teacher group reads each shard from TransferQueue once per data-parallel group.

The Megatron teacher cannot run on CPU, so the group here is a CPU stand-in with its layout:
``world = DP x TP`` verl ``Worker`` ranks on a local Ray cluster, mesh ``TEACHER_MESH`` registered
as verl's Megatron engine registers it (``dp_rank = rank // TP``, TP rank 0 collects), a gloo
process group per model-parallel group, and the ``hf`` forward on every rank (what the TP ranks
compute together). Everything else is real: verl's dispatch, the real TransferQueue, verl's
``tqbridge`` (the baseline: every rank fetches) and our ``verl_mopd.teachers.fetch`` (one fetch per
DP group, broadcast over the group), the MegatronTeacherWorker's mixin. The stored
``teacher_logprobs`` are compared with a direct forward, and the bytes each rank read are counted.
"""

import contextlib
import sys

import pytest
import ray
import torch
from _teacher_tiny import direct_vl_logprobs, save_tiny_vl, store_groups
from tensordict import TensorDict
from test_score_teachers_tq_on_cpu import _store_step
from transformers import AutoModelForImageTextToText
from verl.single_controller.base import Worker
from verl.single_controller.base.decorator import Dispatch, make_nd_compute_dataproto_dispatch_fn, register

from verl_mopd.config import MOPDConfig
from verl_mopd.teachers.backends.hf import load_teacher_model, rows_from_batch, score_rows
from verl_mopd.teachers.fetch import (
    SHARED_FIELD,
    FetchOnceWorker,
    fetch_once_dispatch_mode,
    tensordict_nbytes,
)
from verl_mopd.teachers.group import PlatformTeacherGroup
from verl_mopd.teachers.layout import MEGATRON_TEACHER_FIELDS, TEACHER_FIELDS, TEACHER_MESH, teacher_output

ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])  # the workers cannot import tests/

TP, DP = 2, 2


class TPShapedTeacher(FetchOnceWorker, Worker):
    """``TP`` ranks per data-parallel group, shards fetched once per group (the Megatron teacher's way)."""

    def __init__(self, model_path: str, tp: int):
        super().__init__()
        torch.set_num_threads(1)
        self.model_path, self.tp = model_path, tp
        self._register_dispatch_collect_info(TEACHER_MESH, dp_rank=self.rank // tp, is_collect=self.rank % tp == 0)

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def init_model(self):
        import transfer_queue

        # this class travels by value (cloudpickle), and so do the copies of verl's tqbridge globals in
        # its methods: connect this process's TransferQueue client here, as tqbridge would on first use
        transfer_queue.init()
        torch.distributed.init_process_group("gloo")  # verl's RayWorkerGroup set RANK, MASTER_ADDR, ...
        world = torch.distributed.get_world_size()
        self.groups = [torch.distributed.new_group(list(range(i, i + self.tp))) for i in range(0, world, self.tp)]
        self.model = load_teacher_model(self.model_path, "float32").eval()
        return True

    def fetch_group(self):
        first = self.rank // self.tp * self.tp
        return self.groups[self.rank // self.tp], first, None

    def _score(self, data):
        rows, _ = rows_from_batch(data)
        per_row = score_rows(self.model, rows, 4096)
        full = []
        for row, lp in zip(rows, per_row, strict=True):
            seq = torch.zeros(len(row.tokens))
            seq[len(row.tokens) - 1 - row.n_response : len(row.tokens) - 1] = lp
            full.append(seq)
        return teacher_output(torch.nested.as_nested_tensor(full, layout=torch.jagged), data, 0.0)

    @register(dispatch_mode=fetch_once_dispatch_mode(TEACHER_MESH), blocking=False)
    def compute_teacher_log_prob(self, shard):
        data = self.fetch_shard(shard)
        return self.store_output(self._score(data), shard, is_collect=self.rank % self.tp == 0)


class EveryRankFetches(TPShapedTeacher):
    """The same group on verl's own nd-compute dispatch: ``tqbridge`` fetches the shard on every rank."""

    @register(dispatch_mode=make_nd_compute_dataproto_dispatch_fn(mesh_name=TEACHER_MESH), blocking=False)
    def compute_teacher_log_prob(self, data):
        stats = self._stats()
        stats["fetches"] += 1
        stats["bytes"] += tensordict_nbytes(data)
        stats["samples"] += len(data)
        out = self._score(data)
        return out if self.rank % self.tp == 0 else None


@contextlib.contextmanager
def _group(cls, path):
    """One TP x DP group at a time (the local cluster has 8 logical CPUs, TransferQueue takes 2)."""
    from verl.single_controller.ray import RayClassWithInitArgs, RayResourcePool, RayWorkerGroup

    pool = RayResourcePool(process_on_nodes=[TP * DP], use_gpu=False, max_colocate_count=1,
                           name_prefix=f"tp_{cls.__name__}")
    wg = RayWorkerGroup(resource_pool=pool, ray_cls_with_init=RayClassWithInitArgs(
        cls=ray.remote(cls), model_path=path, tp=TP), use_gpu=False, name_prefix=f"tp_{cls.__name__}")
    try:
        wg.init_model()
        yield wg
    finally:
        for worker in wg._workers:
            ray.kill(worker)
        for pg in pool.pgs or []:
            ray.util.remove_placement_group(pg)


@pytest.fixture(scope="module")
def tp_teacher(ray_tq, tmp_path_factory):
    path = save_tiny_vl(tmp_path_factory.mktemp("tp") / "desktop", seed=11)
    cfg = MOPDConfig.from_mapping({"teachers": {
        "desktop": {"model_path": path, "backend": "hf", "device": "cpu", "dtype": "float32"}}})
    return cfg, path, AutoModelForImageTextToText.from_pretrained(path).eval()


def _score(ray_tq, cfg, wg, model, seed):
    from verl.workers.utils.padding import no_padding_2_padding

    platforms = ["desktop"] * 6
    batch, samples, _ = _store_step(ray_tq, {"desktop": model}, platforms, [1.0] * 6, seed=seed)
    before = [dict(s) for s in wg.fetch_stats()]
    PlatformTeacherGroup(cfg, {"desktop": wg}).score_transfer_queue(batch, ray_tq)
    after = wg.fetch_stats()
    reads = [{k: a[k] - b[k] for k in a if k != "fields"} for a, b in zip(after, before, strict=True)]
    stored = ray_tq.kv_batch_get(keys=batch.keys, partition_id="train",
                                 select_fields=["teacher_logprobs", "prompts", "responses"])
    teacher = no_padding_2_padding(stored["teacher_logprobs"], stored).squeeze(-1)
    for i, s in enumerate(samples):
        r = len(s["responses"])
        torch.testing.assert_close(teacher[i, :r].double(), direct_vl_logprobs(model, s), atol=1e-5, rtol=0)
    ray_tq.kv_clear(keys=batch.keys, partition_id="train")
    return reads, len(samples)  # verl's padding rows are gated off: not sent


def test_one_fetch_per_data_parallel_group_and_the_same_scores(ray_tq, tp_teacher):
    cfg, path, model = tp_teacher
    with _group(TPShapedTeacher, path) as wg:
        once, n = _score(ray_tq, cfg, wg, model, seed=7)
    with _group(EveryRankFetches, path) as wg:
        every, _ = _score(ray_tq, cfg, wg, model, seed=7)  # the same step stored again
    # one fetch per DP group, on its first rank; the other TP ranks read nothing
    assert [r["fetches"] for r in once] == [1, 0] * DP
    assert [r["fetches"] for r in every] == [1] * (TP * DP)
    assert sum(r["samples"] for r in once) == n  # every scored sample read once
    bytes_once, bytes_every = sum(r["bytes"] for r in once), sum(r["bytes"] for r in every)
    assert bytes_every == TP * bytes_once
    print(f"\nTransferQueue bytes read per step, TP={TP} DP={DP}: every rank fetches {bytes_every}, "
          f"once per DP group {bytes_once} ({bytes_every / bytes_once:.1f}x less)")


def test_a_groups_screenshot_is_read_once_and_broadcast_to_the_tp_ranks(ray_tq, tp_teacher):
    """S3-3 on the Megatron teacher's path: the fetching rank reads one screenshot per GRPO group
    (``SHARE_GROUP_INPUTS``), expands it, and broadcasts the shard; every TP rank scores the same rows."""
    from verl.workers.utils.padding import no_padding_2_padding

    cfg, path, model = tp_teacher
    batch, samples = store_groups(ray_tq, model, groups=2, rollouts=4, seed=13)
    with _group(TPShapedTeacher, path) as wg:
        before = [dict(s["fields"]) for s in wg.fetch_stats()]
        PlatformTeacherGroup(cfg, {"desktop": wg}).score_transfer_queue(batch, ray_tq)
        after = [s["fields"] for s in wg.fetch_stats()]
    stored = ray_tq.kv_batch_get(keys=batch.keys, partition_id="train",
                                 select_fields=["teacher_logprobs", "prompts", "responses"])
    teacher = no_padding_2_padding(stored["teacher_logprobs"], stored).squeeze(-1)
    for i, s in enumerate(samples):
        torch.testing.assert_close(teacher[i, : len(s["responses"])].double(), direct_vl_logprobs(model, s),
                                   atol=1e-5, rtol=0)
    image = tensordict_nbytes(TensorDict({SHARED_FIELD: [samples[0][SHARED_FIELD]]}, batch_size=[1]))
    read = [a.get(SHARED_FIELD, 0) - b.get(SHARED_FIELD, 0) for a, b in zip(after, before, strict=True)]
    assert read == [image, 0] * DP  # DP 2 shards of 4 rows: one group each, read by TP rank 0 only
    ray_tq.kv_clear(keys=batch.keys, partition_id="train")


def test_the_megatron_teacher_reads_only_what_verls_engine_uses(ray_tq, tp_teacher):
    """verl's Megatron engine builds its model inputs from ``input_ids``, ``loss_mask`` and
    ``multi_modal_inputs`` (``MegatronEngineWithLMHead.prepare_model_inputs``) and packs its own
    positions: ``MEGATRON_TEACHER_FIELDS`` drops ``position_ids``, ``prompts`` and ``responses``."""
    from verl.workers.engine.megatron.transformer_impl import MegatronEngineWithLMHead

    _, _, model = tp_teacher
    batch, samples, _ = _store_step(ray_tq, {"desktop": model}, ["desktop"] * 4, [1.0] * 4, seed=9)
    full = ray_tq.kv_batch_get(keys=batch.keys[:4], partition_id="train", select_fields=list(TEACHER_FIELDS))
    sent = ray_tq.kv_batch_get(keys=batch.keys[:4], partition_id="train",
                               select_fields=list(MEGATRON_TEACHER_FIELDS))
    inputs = MegatronEngineWithLMHead.prepare_model_inputs(None, sent)  # no field it reads is missing
    assert set(inputs) >= {"input_ids", "loss_mask", "multi_modal_inputs"}
    assert not {"position_ids", "prompts", "responses"} & set(MEGATRON_TEACHER_FIELDS)
    saved = tensordict_nbytes(full) - tensordict_nbytes(sent)
    print(f"\nmegatron teacher fields: {tensordict_nbytes(sent)} of {tensordict_nbytes(full)} bytes per 4 samples "
          f"({saved} saved: position_ids, prompts, responses)")
    assert saved == sum(tensordict_nbytes(full.select(k)) for k in ("position_ids", "prompts", "responses"))
    ray_tq.kv_clear(keys=batch.keys, partition_id="train")


def test_a_worker_without_model_parallel_groups_fetches_its_own_shard():
    class Alone(FetchOnceWorker):  # no TP x PP group: every rank reads its own shard, as verl's tqbridge
        rank = 3

    assert Alone().fetch_group() == (None, 3, None)
