"""``megatron`` backend: a forward-only teacher on verl's Megatron engine (GPU only).

Built the way verl builds its reference policy (``verl/workers/engine_workers.py``,
``ActorRolloutRefWorker.init_model`` for ``ref``): a ``TrainingWorkerConfig`` with an
``HFModelConfig`` and a ``McoreEngineConfig`` (``forward_only=True``, TP/PP from our block,
``param_offload`` when colocated), run by verl's ``TrainingWorker`` whose ``infer_batch`` returns
the per-token ``log_probs`` of the input. Importable and config-checked on CPU; the engine
itself needs ``megatron-core`` and CUDA (``pip install verl-mopd[megatron]``).
"""

from __future__ import annotations

from verl_mopd.teachers.config import TeacherConfig, TeacherConfigError

__all__ = ["engine_config", "training_worker_config", "megatron_teacher_class"]


def engine_config(cfg: TeacherConfig):
    """verl ``McoreEngineConfig`` for a forward-only teacher (validated by verl's ``__post_init__``)."""
    if cfg.backend != "megatron":
        raise TeacherConfigError([f"mopd.teachers.{cfg.platform}.backend={cfg.backend!r}: expected 'megatron'"])
    if cfg.dtype not in ("bfloat16", "float16"):
        raise TeacherConfigError(
            [f"mopd.teachers.{cfg.platform}.dtype={cfg.dtype!r}: verl's Megatron engine allows ['bfloat16', 'float16']"]
        )
    from verl.workers.config import McoreEngineConfig

    return McoreEngineConfig(
        forward_only=True,
        param_offload=cfg.placement == "colocated",
        tensor_model_parallel_size=cfg.tensor_model_parallel_size,
        pipeline_model_parallel_size=cfg.pipeline_model_parallel_size,
        dtype=cfg.dtype,
        use_dynamic_bsz=True,
        infer_max_token_len_per_gpu=cfg.micro_batch_tokens,
    )


def training_worker_config(cfg: TeacherConfig):
    """verl ``TrainingWorkerConfig`` (language model, no optimizer) for this teacher.

    Reads the checkpoint's HF config (``HFModelConfig``), not its weights.
    """
    from verl.workers.config import HFModelConfig, TrainingWorkerConfig

    return TrainingWorkerConfig(
        model_type="language_model",
        model_config=HFModelConfig(path=cfg.model_path, trust_remote_code=cfg.trust_remote_code),
        engine_config=engine_config(cfg),
        optimizer_config=None,
    )


def megatron_teacher_class(cfg: TeacherConfig):
    """``RayClassWithInitArgs`` of the teacher worker for ``RayWorkerGroup`` (GPU pools only)."""
    import ray
    from verl.single_controller.base.decorator import Dispatch, make_nd_compute_dataproto_dispatch_fn, register
    from verl.single_controller.ray import RayClassWithInitArgs
    from verl.workers.engine_workers import TrainingWorker

    class MegatronTeacherWorker(TrainingWorker):
        """verl's ``TrainingWorker``, forward only, answering the group's teacher call."""

        @register(dispatch_mode=make_nd_compute_dataproto_dispatch_fn(mesh_name="train"), blocking=False)
        def compute_teacher_log_prob(self, data):
            import time

            from verl.utils import tensordict_utils as tu

            start = time.perf_counter()
            tu.assign_non_tensor(data, compute_loss=False, calculate_entropy=False)
            with self.engine.eval_mode():
                output = self.engine.infer_batch(data, loss_function=None)
            if not self.engine.is_mp_src_rank_with_outputs():
                return None
            logp = output["model_output"]["log_probs"]
            return {"teacher_logprobs": logp.cpu(), "teacher_time_s": time.perf_counter() - start,
                    "tokens": int(sum(t.numel() for t in logp.unbind(0)))}

        @register(dispatch_mode=Dispatch.ONE_TO_ALL)
        def init_model(self):
            self.reset()
            return True

    return RayClassWithInitArgs(cls=ray.remote(MegatronTeacherWorker), config=training_worker_config(cfg))
