"""``PlatformTeacherGroup``: one teacher per platform; split the step batch by platform, score every
part with its platform's teacher (all platforms in flight at once), merge back in batch order.

Each teacher is a verl worker group (``RayWorkerGroup`` over its own ``RayResourcePool``) whose
``compute_teacher_log_prob`` is registered with ``Dispatch.DP_COMPUTE_PROTO, blocking=False``: the
call returns verl's ``DataProtoFuture`` at once, so dispatching every platform before waiting on
any gives concurrency without threads. Rows gated off (``mopd_kl_mask == 0``) go to no teacher.
"""

from __future__ import annotations

import time
from collections.abc import Mapping

import numpy as np
import torch

from verl_mopd.teachers.config import TeacherConfig, TeachersConfig
from verl_mopd.teachers.router import check_known, get_field, merge, routing_keys, split, take_rows

__all__ = ["PlatformTeacherGroup", "build_worker_group"]


def build_worker_group(cfg: TeacherConfig, *, use_gpu: bool, num_threads: int | None = None, resource_pool=None):
    """A verl ``RayWorkerGroup`` for one teacher on its own pool (``cfg.nnodes`` x ``cfg.n_gpus_per_node``).

    On CPU (``use_gpu=False``) ``max_colocate_count=1`` so each rank's placement bundle asks for one
    CPU (verl's default of 10 would not fit a small machine).
    """
    from verl.single_controller.ray import RayClassWithInitArgs, RayResourcePool, RayWorkerGroup

    if cfg.backend == "hf" and cfg.device == "cpu":
        use_gpu = False  # a CPU teacher takes CPU bundles, even in a GPU run
    if cfg.backend == "hf":
        import ray

        from verl_mopd.teachers.backends.hf import HFTeacherWorker

        actor_cls = ray.remote(HFTeacherWorker)
        init = RayClassWithInitArgs(cls=actor_cls, config=dict(_teacher_fields(cfg)), num_threads=num_threads)
    elif cfg.backend == "megatron":
        from verl_mopd.teachers.backends.megatron import megatron_teacher_class

        init = megatron_teacher_class(cfg)
    else:
        raise ValueError(
            f"mopd.teachers.{cfg.platform}.backend=server has no worker group: it is served by verl's teacher "
            "loop (see verl_mopd.teachers.backends.server.to_distillation_config)"
        )
    if resource_pool is None:
        resource_pool = RayResourcePool(
            process_on_nodes=[cfg.n_gpus_per_node] * cfg.nnodes,
            use_gpu=use_gpu,
            max_colocate_count=1 if not use_gpu else 10,
            name_prefix=f"mopd_teacher_{cfg.platform}",
        )
    wg = RayWorkerGroup(resource_pool=resource_pool, ray_cls_with_init=init, use_gpu=use_gpu,
                        name_prefix=f"mopd_teacher_{cfg.platform}")
    wg.init_model()
    return wg


def _teacher_fields(cfg: TeacherConfig) -> dict:
    from dataclasses import fields

    return {f.name: getattr(cfg, f.name) for f in fields(cfg) if f.name != "_target_"}




def _pad_rows(sub, divisor: int):
    """Pad ``sub`` to a multiple of ``divisor`` rows (verl's pad helpers); returns (padded, pad)."""
    from verl.protocol import DataProto

    if divisor == 1:
        return sub, 0
    if isinstance(sub, DataProto):
        from verl.protocol import pad_dataproto_to_divisor

        return pad_dataproto_to_divisor(sub, divisor)
    from verl.utils.tensordict_utils import pad_to_divisor

    n = len(sub)
    padded = pad_to_divisor(sub, divisor)
    return padded, len(padded) - n


def _concat_rows(chunks: list[torch.Tensor]) -> torch.Tensor:
    if chunks[0].is_nested:
        from verl.utils.tensordict_utils import concat_nested_tensors

        return concat_nested_tensors(chunks)
    return torch.cat(chunks, dim=0)


def _drop_tail(t: torch.Tensor, pad: int) -> torch.Tensor:
    if pad == 0:
        return t
    if t.is_nested:
        rows = list(t.unbind(0))[:-pad]
        return torch.nested.as_nested_tensor(rows, layout=torch.jagged)
    return t[:-pad]


def _response_mask(batch) -> torch.Tensor | None:
    mask = get_field(batch, "response_mask")
    if mask is not None:
        return mask
    am, resp = get_field(batch, "attention_mask"), get_field(batch, "responses")
    if am is not None and resp is not None and not resp.is_nested:
        return am[:, -resp.shape[-1] :]
    return None


class PlatformTeacherGroup:
    """N platform teachers behind one call.

    Args:
        config: the ``mopd`` teachers block (``TeachersConfig``).
        worker_groups: ``{platform: worker group}`` exposing ``compute_teacher_log_prob(batch)``
            (non-blocking, returns a ``DataProtoFuture``) and ``world_size``; one per configured
            teacher. Build them with ``PlatformTeacherGroup.build``.
    """

    def __init__(self, config: TeachersConfig, worker_groups: Mapping[str, object]):
        missing = sorted(set(config.platforms) - set(worker_groups))
        extra = sorted(set(worker_groups) - set(config.platforms))
        if missing or extra:
            raise ValueError(f"worker groups do not match mopd.teachers: missing {missing}, unexpected {extra}")
        self.config = config
        self.worker_groups = dict(worker_groups)

    @classmethod
    def build(cls, config: TeachersConfig, *, use_gpu: bool = True, num_threads: int | None = None,
              colocated_pool=None):
        """One verl worker group per worker-backend teacher (``hf`` / ``megatron``), models loaded.

        ``colocated_pool``: the actor's ``RayResourcePool``; teachers with ``placement: colocated``
        are placed on it (as verl colocates worker groups on one pool) instead of a pool of their own.
        """
        server = [p for p, c in config.teachers.items() if c.backend == "server"]
        if server:
            raise ValueError(
                f"mopd.teachers {server} use backend=server: configure verl's teacher loop with "
                "verl_mopd.teachers.backends.server.to_distillation_config instead of a PlatformTeacherGroup"
            )
        wgs = {
            p: build_worker_group(c, use_gpu=use_gpu, num_threads=num_threads,
                                  resource_pool=colocated_pool if c.placement == "colocated" else None)
            for p, c in config.teachers.items()
        }
        return cls(config, wgs)

    # ------------------------------------------------------------------------------------------

    def compute_teacher_logprobs(self, batch) -> tuple[torch.Tensor, dict]:
        """Teacher log-probs of every row's sampled response tokens, in batch order.

        Args:
            batch: DataProto or TensorDict step batch with the routing column, ``input_ids``,
                ``responses`` (+ ``attention_mask`` for the padded layout), optionally the gate
                ``mopd_kl_mask`` ``(bs,)`` and ``old_log_probs``.

        Returns:
            ``(teacher_logprobs, metrics)``. ``teacher_logprobs`` has the layout of
            ``old_log_probs`` (padded ``(bs, response_len)``, 0.0 after each response, or nested).
            Rows not sent to a teacher (gated off) hold ``old_log_probs`` when present (so K3 and
            its gradient are exactly 0 there even without the gate) else 0.0.
        """
        cfg = self.config
        wall_start = time.perf_counter()
        keys = routing_keys(batch, cfg.routing_key)
        check_known(keys.tolist(), cfg.platforms, cfg.routing_key)
        n = len(keys)
        send = np.ones(n, dtype=bool)
        gate = get_field(batch, cfg.mask_key) if cfg.skip_gated else None
        if gate is not None:
            send = np.asarray(torch.as_tensor(gate).reshape(n, -1)[:, 0] > 0)
        sent_rows = np.flatnonzero(send)
        index = {k: sent_rows[v] for k, v in split(keys[sent_rows]).items()}

        # dispatch every platform before waiting on any (dedicated pools run concurrently);
        # colocated teachers share the actor's devices, so each finishes before the next starts
        pending, results = {}, {}
        for platform, rows in index.items():
            wg = self.worker_groups[platform]
            sub, pad = _pad_rows(take_rows(batch, rows), getattr(wg, "world_size", 1))
            pending[platform] = (wg.compute_teacher_log_prob(sub), pad)
            if cfg.teachers[platform].placement == "colocated":
                results[platform] = self._collect(*pending.pop(platform))
        for platform, (fut, pad) in pending.items():
            results[platform] = self._collect(fut, pad)

        parts = {p: r["teacher_logprobs"] for p, r in results.items()}
        gated_rows = np.flatnonzero(~send)
        if gated_rows.size:
            parts["__gated__"] = self._fill_rows(batch, gated_rows, parts)
            index["__gated__"] = gated_rows
        logp = merge(parts, index, n)
        metrics = self._metrics(batch, keys, send, index, results, logp)
        metrics["mopd_teacher/wall_s"] = time.perf_counter() - wall_start
        return logp, metrics

    @staticmethod
    def _collect(future, pad: int) -> dict:
        import ray

        # model-parallel ranks that hold no output (Megatron non-source ranks) return None
        outs = [o for o in ray.get(list(future.futures)) if o is not None]
        return {
            "teacher_logprobs": _drop_tail(_concat_rows([o["teacher_logprobs"] for o in outs]), pad),
            "teacher_time_s": max(o["teacher_time_s"] for o in outs),
            "tokens": sum(o["tokens"] for o in outs),
        }

    def _fill_rows(self, batch, rows: np.ndarray, parts: Mapping[str, torch.Tensor]) -> torch.Tensor:
        """Values for rows sent to no teacher: the student's ``old_log_probs`` when stored, else 0.0."""
        old = get_field(batch, "old_log_probs")
        if old is not None:
            if old.is_nested:
                sel = [old.unbind(0)[int(r)] for r in rows]
                return torch.nested.as_nested_tensor(sel, layout=torch.jagged).to(torch.float32)
            return old[torch.as_tensor(rows)].to(torch.float32)
        responses = get_field(batch, "responses")
        if responses.is_nested:
            resp = responses.unbind(0)
            return torch.nested.as_nested_tensor(
                [torch.zeros(resp[int(r)].shape[-1]) for r in rows], layout=torch.jagged
            )
        return torch.zeros(len(rows), responses.shape[-1], dtype=torch.float32)

    def _metrics(self, batch, keys, send, index, results, logp) -> dict:
        n = len(keys)
        mask = _response_mask(batch)
        if mask is not None and not mask.is_nested:
            tokens = mask.sum(-1).numpy()
        else:
            resp = get_field(batch, "responses")
            tokens = np.array([r.shape[-1] for r in resp.unbind(0)])
        m = {
            "mopd_teacher/skipped_fraction": float((~send).sum() / max(n, 1)),
            "mopd_teacher/skipped_token_fraction": float(tokens[~send].sum() / max(tokens.sum(), 1)),
        }
        old = get_field(batch, "old_log_probs")
        k3_kl = None
        if old is not None and mask is not None and not old.is_nested and not mask.is_nested:
            try:
                from verl_mopd.losses import k3_kl
            except ImportError:  # the loss module is optional for scoring
                k3_kl = None
        for platform in self.config.platforms:
            rows_all = np.flatnonzero(keys == platform)
            r = results.get(platform)
            m[f"mopd_teacher/{platform}/samples"] = float(len(rows_all))
            m[f"mopd_teacher/{platform}/scored_samples"] = float(len(index.get(platform, ())))
            m[f"mopd_teacher/{platform}/tokens"] = float(r["tokens"]) if r else 0.0
            m[f"mopd_teacher/{platform}/time_s"] = float(r["teacher_time_s"]) if r else 0.0
            if k3_kl is not None and r:
                rows = torch.as_tensor(index[platform])
                mk = mask[rows].to(torch.float32)
                k3 = k3_kl(old[rows].to(torch.float32), logp[rows])
                m[f"mopd_teacher/{platform}/k3_mean"] = float((k3 * mk).sum() / mk.sum().clamp_min(1))
        return m

    # ------------------------------------------------------------------------------------------

    def write_to_transfer_queue(self, tq, keys: list[str], partition_id: str, teacher_logprobs: torch.Tensor,
                                response_mask: torch.Tensor | None = None):
        """Store ``teacher_logprobs`` for the step's samples with ``tq.kv_batch_put``.

        A padded ``(bs, response_len)`` tensor is stored nested, one row of response length per
        sample (the v1 trainer's layout for per-token fields, as it stores ``rm_scores``);
        ``response_mask`` ``(bs, response_len)`` gives the lengths.
        """
        from verl.utils import tensordict_utils as tu

        if len(keys) != teacher_logprobs.shape[0]:
            raise ValueError(f"{len(keys)} keys for {teacher_logprobs.shape[0]} rows of teacher_logprobs")
        value = teacher_logprobs
        if not value.is_nested:
            if response_mask is None:
                raise ValueError("padded teacher_logprobs need response_mask to be stored per sample")
            lengths = response_mask.sum(-1).tolist()
            value = torch.nested.as_nested_tensor(
                [value[i, : int(lengths[i])] for i in range(value.shape[0])], layout=torch.jagged
            )
        return tq.kv_batch_put(keys=list(keys), partition_id=partition_id,
                               fields=tu.get_tensordict({self.config.output_key: value}))
