"""``PlatformTeacherGroup``: one teacher per platform; split the step's samples by platform, score
every part with its platform's teacher (dedicated teachers, and each wave of colocated ones, in
flight at once), merge back in order.

Each teacher is a verl worker group (``RayWorkerGroup``) whose ``compute_teacher_log_prob`` uses
verl's nd-compute dispatch (``make_nd_compute_dataproto_dispatch_fn``, ``blocking=False``): the call
returns verl's ``DataProtoFuture`` at once, so dispatching every platform before waiting on any
gives concurrency without threads. Two entry points:

- :meth:`PlatformTeacherGroup.score_transfer_queue` (the trainer): the driver reads only the
  routing key, the gate and the response mask, and hands each teacher a ``KVBatchMeta`` of its
  rows; every rank fetches its own shard from TransferQueue and writes ``teacher_logprobs`` back
  itself (verl's ``tqbridge``, as in verl's own ``compute_log_prob``). Images never pass through the
  driver.
- :meth:`PlatformTeacherGroup.compute_teacher_logprobs` (in memory: tests, the demo, benchmarks):
  a DataProto / TensorDict goes out in chunks and the response log-probs come back.

Rows gated off (``mopd_kl_mask == 0``) go to no teacher; their ``teacher_logprobs`` are the
student's ``old_log_probs``, a finite stand-in (TransferQueue serves a field only when every sample
of a micro-batch has it) that the loss multiplies by the gate's 0. K3 against it is 0 only while the
student is still the rollout policy; it is the gate, not the stand-in, that keeps these rows out.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Mapping

import numpy as np
import torch

from verl_mopd.config import MOPDConfig
from verl_mopd.losses import KL_MASK_KEY, TEACHER_LOGPROBS_KEY
from verl_mopd.teachers.config import TeacherConfig
from verl_mopd.teachers.fetch import SHARE_GROUP_INPUTS, group_uid
from verl_mopd.teachers.layout import (
    CALL_INFO,
    END_KEY,
    K3_SUM_KEY,
    START_KEY,
    TEACHER_MESH,
    TIME_KEY,
    TOKENS_KEY,
    as_jagged,
    teacher_fields,
    to_full_sequence,
    to_no_padding,
)
from verl_mopd.teachers.router import check_known, get_field, merge, routing_keys, split, take_rows

__all__ = ["PlatformTeacherGroup", "build_worker_group", "data_parallel_size"]


def dedicated_resource_pool(cfg: TeacherConfig, *, use_gpu: bool, name: str):
    """The own ``RayResourcePool`` of a ``placement: dedicated`` teacher: ``cfg.nnodes`` x ``cfg.n_gpus_per_node``
    bundles of one device each, with verl's default of 10 CPUs (processes) per bundle on a GPU, 1 on CPU."""
    from verl.single_controller.ray import RayResourcePool

    if cfg.backend == "hf" and cfg.device == "cpu":
        use_gpu = False  # a CPU teacher takes CPU bundles, even in a GPU run
    return RayResourcePool(process_on_nodes=[cfg.n_gpus_per_node] * cfg.nnodes, use_gpu=use_gpu,
                           max_colocate_count=1 if not use_gpu else 10, name_prefix=name)


def build_worker_group(cfg: TeacherConfig, *, use_gpu: bool, num_threads: int | None = None, resource_pool=None,
                       run_config=None):
    """A verl ``RayWorkerGroup`` for one teacher, models loaded.

    Its own pool of ``cfg.nnodes`` x ``cfg.n_gpus_per_node`` unless ``resource_pool`` is given (the
    actor's, for ``placement: colocated``). On CPU (``use_gpu=False``) ``max_colocate_count=1`` so
    each rank's placement bundle asks for one CPU (verl's default of 10 would not fit a small machine).
    ``run_config``: the composed run config, required by ``megatron`` teachers (built like verl's ref).
    """
    from verl.single_controller.ray import RayClassWithInitArgs, RayWorkerGroup

    if cfg.backend == "hf" and cfg.device == "cpu":
        use_gpu = False  # a CPU teacher takes CPU bundles, even in a GPU run
    if cfg.backend == "hf":
        import ray

        from verl_mopd.teachers.backends.hf import HFTeacherWorker

        # dict(cfg): verl's BaseConfig is a Mapping of its fields
        init = RayClassWithInitArgs(cls=ray.remote(HFTeacherWorker), config=dict(cfg), num_threads=num_threads)
    elif cfg.backend == "megatron":
        if run_config is None:
            raise ValueError(f"mopd.teachers.{cfg.platform}: backend=megatron teachers are built like verl's "
                             "reference model from the run config; pass run_config")
        from verl_mopd.teachers.backends.megatron import megatron_teacher_class

        init = megatron_teacher_class(cfg, run_config)
    else:  # TeacherConfig refuses any other backend
        raise ValueError(f"mopd.teachers.{cfg.platform}.backend={cfg.backend!r}: allowed values are ['hf', 'megatron']")
    # placement-group and actor names are cluster-wide: unique per build
    name = f"mopd_teacher_{cfg.platform}_{uuid.uuid4().hex[:8]}"
    if resource_pool is None:
        resource_pool = dedicated_resource_pool(cfg, use_gpu=use_gpu, name=name)
    wg = RayWorkerGroup(resource_pool=resource_pool, ray_cls_with_init=init, use_gpu=use_gpu, name_prefix=name)
    wg.init_model()
    return wg


def data_parallel_size(wg) -> int:
    """Data-parallel size of a teacher worker group on ``TEACHER_MESH`` (queried as verl's
    ``_balance_batch`` queries the actor's; cached in the group's ``_dispatch_info``)."""
    info = getattr(wg, "_dispatch_info", None)
    if info is None:  # not a verl worker group (a stand-in in tests)
        return int(getattr(wg, "world_size", 1))
    if TEACHER_MESH not in info:
        info[TEACHER_MESH] = wg._query_dispatch_info(TEACHER_MESH)
    return max(info[TEACHER_MESH]) + 1


def _pad_tensordict(data, multiple: int):
    """Repeat rows until ``len(data)`` is a multiple of ``multiple``; the repeats get an all-zero
    ``response_mask`` (they count in no metric) and are dropped from the result by the caller."""
    from verl.utils import tensordict_utils as tu

    n = len(data)
    pad = (-n) % multiple
    if pad == 0:
        return data, 0
    out = tu.index_select_tensor_dict(data, list(range(n)) + [i % n for i in range(pad)])
    masks = list(out["response_mask"].unbind(0))
    masks[n:] = [torch.zeros_like(m) for m in masks[n:]]
    out["response_mask"] = torch.nested.as_nested_tensor(masks, layout=torch.jagged)
    return out, pad


def _pad_kv_meta(meta, multiple: int, tq):
    """Append synthetic samples so that ``len(meta)`` is a multiple of ``multiple``.

    verl's own way (``verl.trainer.ppo.padding_utils.upsample_batch_to_divisible_size``): a minimal
    text-only sample (``construct_minimal_padding_template``, all-zero ``response_mask``) per missing
    row, under fresh keys, deleted again after scoring. Equal shards keep verl's engines' data-parallel
    collectives (micro-batch count, token all-reduce) in step. Returns ``(meta, pad_keys)``.
    """
    from transfer_queue import KVBatchMeta
    from verl.trainer.ppo.padding_utils import construct_minimal_padding_template
    from verl.utils.tensordict_utils import list_of_dict_to_tensordict

    pad = (-len(meta)) % multiple
    if pad == 0:
        return meta, []
    light = [f for f in meta.fields if f not in ("multi_modal_inputs", "old_log_probs")]
    source = tq.kv_batch_get(keys=meta.keys[:1], partition_id=meta.partition_id, select_fields=light)[0]
    token = int(source["input_ids"][-1])  # any id of the vocabulary; the padding rows' scores are discarded
    template, tag = construct_minimal_padding_template(source, meta.tags[0], token)
    # every field the real rows send must exist on the padding rows too (TransferQueue returns a field
    # only when all requested samples have it)
    if "multi_modal_inputs" in meta.fields:
        template["multi_modal_inputs"] = {}
    if "old_log_probs" in meta.fields:
        template["old_log_probs"] = torch.zeros(1, dtype=torch.float32)
    template = {k: v for k, v in template.items() if k in meta.fields}
    keys = [f"mopd_teacher_pad_{uuid.uuid4().hex}_{i}" for i in range(pad)]
    tq.kv_batch_put(keys=keys, partition_id=meta.partition_id,
                    fields=list_of_dict_to_tensordict([dict(template) for _ in keys]), tags=[dict(tag) for _ in keys])
    padded = KVBatchMeta(keys=meta.keys + keys, tags=meta.tags + [dict(tag) for _ in keys],
                         partition_id=meta.partition_id, fields=meta.fields, extra_info=meta.extra_info)
    return padded, keys


def _stored_fields(meta, row: int) -> set[str]:
    """Field names stored for sample ``row`` of ``meta`` (TransferQueue metadata only, no data)."""
    from transfer_queue import KVBatchMeta
    from verl.utils.transferqueue_utils import kv_batch_meta2batch_meta

    probe = KVBatchMeta(keys=[meta.keys[row]], tags=[meta.tags[row] if meta.tags else {}],
                        partition_id=meta.partition_id)
    return set(kv_batch_meta2batch_meta(probe).field_names)


class PlatformTeacherGroup:
    """N platform teachers behind one call.

    Args:
        config: the ``mopd`` teachers block (``MOPDConfig``).
        worker_groups: ``{platform: worker group}`` exposing ``compute_teacher_log_prob`` (verl
            nd-compute dispatch on ``TEACHER_MESH``, non-blocking); one per configured teacher.
            Build them with :meth:`build`.
        plan: which colocated teachers run together (``verl_mopd.teachers.placement.TeacherPlan``);
            None: each colocated teacher alone, in config order.
        share_group_inputs: through TransferQueue, workers read a GRPO group's shared
            ``multi_modal_inputs`` once (``verl_mopd.teachers.fetch.shared_input_rows``); False reads
            one copy per rollout (verl's ``tqbridge`` way; the benchmark's baseline).
    """

    def __init__(self, config: MOPDConfig, worker_groups: Mapping[str, object], *, plan=None,
                 share_group_inputs: bool = True):
        missing = sorted(set(config.platforms) - set(worker_groups))
        extra = sorted(set(worker_groups) - set(config.platforms))
        if missing or extra:
            raise ValueError(f"worker groups do not match mopd.teachers: missing {missing}, unexpected {extra}")
        self.config = config
        self.worker_groups = dict(worker_groups)
        self.share_group_inputs = share_group_inputs
        #: ``{platform: (start, end)}`` (``time.time()`` on the workers) of the last call's teachers
        self.last_timeline: dict[str, tuple[float, float]] = {}
        colocated = [p for p, c in config.teachers.items() if c.placement == "colocated"]
        self.waves = [list(w) for w in plan.waves] if plan is not None else [[p] for p in colocated]
        if sorted(p for w in self.waves for p in w) != sorted(colocated):
            raise ValueError(f"plan waves {self.waves} do not hold each colocated teacher {colocated} once")

    @classmethod
    def build(cls, config: MOPDConfig, *, use_gpu: bool = True, num_threads: int | None = None,
              colocated_pool=None, run_config=None, plan=None):
        """One verl worker group per worker-backend teacher (``hf`` / ``megatron``), models loaded.

        ``colocated_pool``: the actor's ``RayResourcePool``; teachers with ``placement: colocated``
        are placed on it (as verl colocates worker groups on one pool) instead of a pool of their own.
        ``run_config``: the composed run config (needed by ``megatron`` teachers); the plan
        (``verl_mopd.teachers.placement.run_plan``) is made from it unless ``plan`` is given, and each
        worker gets the plan's weight policy.
        """
        import dataclasses

        from verl_mopd.errors import ConfigError
        from verl_mopd.teachers.placement import run_plan

        if plan is None and run_config is not None:
            plan = run_plan(run_config, config.teachers)
        if plan is not None and plan.problems:
            raise ConfigError(plan.problems, "teacher memory plan")
        teachers = {p: dataclasses.replace(c, weights=plan.weights[p]) if plan is not None else c
                    for p, c in config.teachers.items()}
        wgs = {
            p: build_worker_group(c, use_gpu=use_gpu, num_threads=num_threads, run_config=run_config,
                                  resource_pool=colocated_pool if c.placement == "colocated" else None)
            for p, c in teachers.items()
        }
        return cls(config, wgs, plan=plan)

    # ------------------------------------------------------------------------------------------

    def _route(self, keys: np.ndarray, gate) -> tuple[np.ndarray, dict[str, np.ndarray]]:
        """``(send (n,) bool, {platform: rows to score})``; unknown platforms refused before dispatch."""
        cfg = self.config
        check_known(keys.tolist(), cfg.platforms, cfg.routing_key)
        send = np.ones(len(keys), dtype=bool)
        if cfg.skip_gated and gate is not None:
            send = np.asarray(torch.as_tensor(gate).reshape(len(keys), -1)[:, 0] > 0)
        sent_rows = np.flatnonzero(send)
        return send, {k: sent_rows[v] for k, v in split(keys[sent_rows]).items()}

    def _run(self, payloads: Mapping[str, object]) -> dict[str, list]:
        """Call every platform's teacher: dedicated teachers all in flight at once; colocated ones
        (sharing the actor's devices) wave by wave (``self.waves``), a whole wave dispatched before
        any of it is waited on. Returns each platform's collected outputs."""
        import ray

        def collect(future):
            # ranks that hold no output (Megatron non-source ranks) answer None
            return [o for o in ray.get(list(future.futures)) if o is not None]

        def dispatch(platforms):
            return {p: self.worker_groups[p].compute_teacher_log_prob(payloads[p]) for p in platforms if p in payloads}

        colocated = {p for w in self.waves for p in w}
        pending = dispatch([p for p in payloads if p not in colocated])
        results = {}
        for wave in self.waves:
            results.update({p: collect(future) for p, future in dispatch(wave).items()})
        results.update({p: collect(future) for p, future in pending.items()})
        return results

    @staticmethod
    def _call_stats(outputs: list) -> dict[str, float]:
        from tensordict import TensorDict
        from verl.utils import tensordict_utils as tu

        def value(o, key):
            if isinstance(o, TensorDict):
                return tu.get_non_tensor_data(o, key=key, default=0.0)
            return (o.extra_info or {}).get(key, 0.0)  # BatchMeta returned through TransferQueue

        return {
            "time_s": max((float(value(o, TIME_KEY)) for o in outputs), default=0.0),
            "start": min((float(value(o, START_KEY)) for o in outputs), default=0.0),
            "end": max((float(value(o, END_KEY)) for o in outputs), default=0.0),
            "tokens": float(sum(value(o, TOKENS_KEY) for o in outputs)),
            "k3_sum": float(sum(value(o, K3_SUM_KEY) for o in outputs)),
        }

    def _metrics(self, keys, send, real, tokens, index, stats, with_k3: bool) -> dict[str, float]:
        """Per-platform and batch metrics; ``real`` (n,) excludes verl's synthetic padding rows,
        ``tokens`` (n,) trained response tokens per row."""
        m = {
            "mopd_teacher/skipped_fraction": float((~send & real).sum() / max(real.sum(), 1)),
            "mopd_teacher/skipped_token_fraction": float(tokens[~send & real].sum() / max(tokens[real].sum(), 1)),
        }
        for platform in self.config.platforms:
            s = stats.get(platform)
            m[f"mopd_teacher/{platform}/samples"] = float(((keys == platform) & real).sum())
            m[f"mopd_teacher/{platform}/scored_samples"] = float(len(index.get(platform, ())))
            m[f"mopd_teacher/{platform}/tokens"] = s["tokens"] if s else 0.0
            m[f"mopd_teacher/{platform}/time_s"] = s["time_s"] if s else 0.0
            if with_k3 and s and s["tokens"] > 0:
                m[f"mopd_teacher/{platform}/k3_mean"] = s["k3_sum"] / s["tokens"]
        self.last_timeline = {p: (s["start"], s["end"]) for p, s in stats.items() if s["end"] > 0}
        spans = list(self.last_timeline.values())
        m["mopd_teacher/overlap_s"] = sum(max(0.0, min(a[1], b[1]) - max(a[0], b[0]))
                                          for i, a in enumerate(spans) for b in spans[i + 1:])
        return m

    # ------------------------------------------------------------------------------------------
    # in memory

    def compute_teacher_logprobs(self, batch) -> tuple[torch.Tensor, dict]:
        """Teacher log-probs of every row's sampled response tokens, in batch order.

        Args:
            batch: DataProto or TensorDict step batch, padded or no-padding layout (see
                ``layout.to_no_padding``), with the routing column, optionally the gate
                ``mopd_kl_mask`` ``(bs,)`` and ``old_log_probs``.

        Returns:
            ``(teacher_logprobs, metrics)``: the layout of ``old_log_probs`` (padded
            ``(bs, response_len)`` with 0.0 after each response, or jagged ``(bs, r)``). Rows not sent
            to a teacher hold ``old_log_probs`` when present, else 0.0.
        """
        from verl.utils import tensordict_utils as tu
        from verl.workers.utils.padding import response_from_nested

        cfg = self.config
        wall_start = time.perf_counter()
        data, width = to_no_padding(batch)
        keys = routing_keys(data, cfg.routing_key)
        n = len(keys)
        send, index = self._route(keys, get_field(data, KL_MASK_KEY))
        payloads, pads = {}, {}
        for platform, rows in index.items():
            fields = [f for f in teacher_fields(cfg.teachers[platform].backend) if f in data.keys()]
            sub = tu.get_keys(take_rows(data, rows), fields)
            sub, pads[platform] = _pad_tensordict(sub, data_parallel_size(self.worker_groups[platform]))
            tu.assign_non_tensor(sub, **CALL_INFO)
            payloads[platform] = sub
        outputs = self._run(payloads)

        parts = {}
        for platform, outs in outputs.items():
            # ranks answer in data-parallel order, the order their shards were cut in
            full = torch.nested.as_nested_tensor([row[:, 0] for o in outs for row in o[TEACHER_LOGPROBS_KEY].unbind(0)],
                                                 layout=torch.jagged)
            resp = response_from_nested(full, payloads[platform]["response_mask"]).unbind(0)
            parts[platform] = torch.nested.as_nested_tensor(list(resp[: len(index[platform])]), layout=torch.jagged)
        gated = np.flatnonzero(~send)
        if gated.size:
            parts["__gated__"] = self._fill_rows(data, gated)
            index["__gated__"] = gated
        logp = merge(parts, index, n)
        if width is not None:
            logp = logp.to_padded_tensor(0.0, output_size=(n, width))
        tokens = np.array([float(m.sum()) for m in data["response_mask"].unbind(0)])
        metrics = self._metrics(keys, send, np.ones(n, dtype=bool), tokens, {k: v for k, v in index.items()
                                                                            if k != "__gated__"},
                                {p: self._call_stats(o) for p, o in outputs.items()}, "old_log_probs" in data.keys())
        metrics["mopd_teacher/wall_s"] = time.perf_counter() - wall_start
        return logp, metrics

    @staticmethod
    def _fill_rows(data, rows: np.ndarray) -> torch.Tensor:
        """Jagged response-length values for rows sent to no teacher: ``old_log_probs`` or 0.0."""
        if "old_log_probs" in data.keys():
            old = as_jagged(data["old_log_probs"]).unbind(0)
            return torch.nested.as_nested_tensor([old[int(r)].to(torch.float32) for r in rows], layout=torch.jagged)
        resp = data["responses"].unbind(0)
        return torch.nested.as_nested_tensor([torch.zeros(resp[int(r)].shape[-1]) for r in rows], layout=torch.jagged)

    # ------------------------------------------------------------------------------------------
    # through TransferQueue (the trainer)

    def score_transfer_queue(self, batch, tq) -> dict[str, float]:
        """Score a step's stored samples and store ``teacher_logprobs`` for every one of them.

        Args:
            batch: verl's ``KVBatchMeta`` of the step (``keys``, ``tags`` with ``prompt_len`` /
                ``is_padding``, ``partition_id``); the gate is already stored.
            tq: the TransferQueue client module (``kv_batch_get`` / ``kv_batch_put`` / ``kv_clear``).

        The driver reads the routing key, the gate and ``response_mask``; each teacher's ranks fetch
        their rows (``layout.teacher_fields`` of their backend, images included) and write ``teacher_logprobs`` themselves.
        Gated rows get ``old_log_probs`` in the same layout (read for those rows only).
        """
        from transfer_queue import KVBatchMeta

        cfg = self.config
        wall_start = time.perf_counter()
        small = tq.kv_batch_get(keys=batch.keys, partition_id=batch.partition_id,
                                select_fields=[cfg.routing_key, KL_MASK_KEY, "response_mask"])
        keys = routing_keys(small, cfg.routing_key)
        n = len(keys)
        tags = list(batch.tags) if batch.tags else [{} for _ in range(n)]
        send, index = self._route(keys, get_field(small, KL_MASK_KEY))
        first = next((int(rows[0]) for rows in index.values() if len(rows)), None)
        stored = _stored_fields(batch, first) if first is not None else set()
        payloads, pad_keys = {}, []
        try:
            for platform, rows in index.items():
                fields = [f for f in teacher_fields(cfg.teachers[platform].backend) if f in stored]
                if self.share_group_inputs:  # a group's rows in one shard: its images fetched once
                    rows = rows[np.argsort([group_uid(batch.keys[i]) or "" for i in rows], kind="stable")]
                meta = KVBatchMeta(keys=[batch.keys[i] for i in rows], tags=[tags[i] for i in rows],
                                   partition_id=batch.partition_id, fields=fields,
                                   extra_info={**CALL_INFO, SHARE_GROUP_INPUTS: self.share_group_inputs})
                meta, added = _pad_kv_meta(meta, data_parallel_size(self.worker_groups[platform]), tq)
                pad_keys += added
                payloads[platform] = meta
            outputs = self._run(payloads)
        finally:
            if pad_keys:
                tq.kv_clear(keys=pad_keys, partition_id=batch.partition_id)

        gated = np.flatnonzero(~send)
        if gated.size:
            self._store_gated_rows(batch, tags, gated, tq)
        real = np.array([not (t or {}).get("is_padding", False) for t in tags], dtype=bool)
        tokens = np.array([float(m.sum()) for m in as_jagged(small["response_mask"]).unbind(0)])
        metrics = self._metrics(keys, send, real, tokens, index, {p: self._call_stats(o) for p, o in outputs.items()},
                                "old_log_probs" in stored)
        metrics["mopd_teacher/wall_s"] = time.perf_counter() - wall_start
        return metrics

    def _store_gated_rows(self, batch, tags: list, rows: np.ndarray, tq) -> None:
        """``teacher_logprobs`` of gated rows: their ``old_log_probs`` in the whole-sequence layout
        (prompt lengths from verl's sample tags, or the stored ``prompts`` when a tag lacks them)."""
        from tensordict import TensorDict

        keys = [batch.keys[i] for i in rows]
        need_prompts = any("prompt_len" not in (tags[i] or {}) for i in rows)
        old = tq.kv_batch_get(keys=keys, partition_id=batch.partition_id,
                              select_fields=["old_log_probs", "prompts"] if need_prompts else ["old_log_probs"])
        if "old_log_probs" not in old.keys():
            raise KeyError("gated samples need the student's stored `old_log_probs` for their teacher_logprobs "
                           "(verl's _compute_old_log_prob runs before _compute_advantage)")
        resp = as_jagged(old["old_log_probs"])
        response_lens = resp.offsets().diff()
        if "prompts" in old.keys():
            prompt_lens = as_jagged(old["prompts"]).offsets().diff()
        else:
            prompt_lens = torch.tensor([int(tags[i]["prompt_len"]) for i in rows])
        full = to_full_sequence(resp, prompt_lens, response_lens)
        tq.kv_batch_put(keys=keys, partition_id=batch.partition_id,
                        fields=TensorDict({TEACHER_LOGPROBS_KEY: full}, batch_size=[len(keys)]))
