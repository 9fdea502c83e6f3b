"""``megatron`` backend: a forward-only teacher on verl's Megatron engine (GPU).

Built exactly as verl builds its reference policy (``ActorRolloutRefWorker.init_model``, "build
reference model", ``verl/workers/engine_workers.py``): the run's ``actor_rollout_ref.ref`` block
(megatron engine settings inherited from the actor: bridge, recompute, remove-padding, seed, ...)
converted with ``omega_conf_to_dataclass``, with this teacher's TP/PP/dtype, ``forward_only`` and
``param_offload`` (colocated with ``weights: pageable``; ``pinned`` is this worker's own
``HostWeights`` around each call) on top, the ref's optimizer and checkpoint configs (never stepped),
and the run's model block pointed at the teacher checkpoint. The worker is verl's own
``TrainingWorker``; a call goes through ``TrainingWorker.infer_batch``, which injects the engine
keys (``use_dynamic_bsz``, ``max_token_len_per_gpu`` = ``micro_batch_tokens``,
``micro_batch_size_per_gpu``, ``use_remove_padding``, ``use_fused_kernels``) and runs the engine in
eval mode (parameters loaded before and offloaded after the call when ``param_offload``). The
engine's whole-sequence ``log_probs`` are stored as they are (``verl_mopd.teachers.layout``).

:func:`megatron_stack_report` lists what verl 0.9.1's Megatron engine imports for a given config
(``verl-mopd check`` prints it).
"""

from __future__ import annotations

import importlib
import sys
import time

from verl.single_controller.base.decorator import Dispatch, register
from verl.workers.engine_workers import TrainingWorker

from verl_mopd.errors import ConfigError
from verl_mopd.teachers.config import TeacherConfig
from verl_mopd.teachers.fetch import FetchOnceWorker, fetch_once_dispatch_mode
from verl_mopd.teachers.layout import CALL_INFO, TEACHER_MESH, teacher_output
from verl_mopd.teachers.weights import HostWeights, resolve_policy

__all__ = ["teacher_blocks", "worker_config_from_blocks", "training_worker_config", "MegatronTeacherWorker",
           "megatron_teacher_class", "megatron_dtypes", "megatron_stack_report", "check_megatron_stack"]


def _check_teacher(cfg: TeacherConfig) -> None:
    if cfg.backend != "megatron":
        raise ConfigError([f"mopd.teachers.{cfg.platform}.backend={cfg.backend!r}: expected 'megatron'"], "mopd.teachers config")
    if cfg.dtype not in megatron_dtypes():
        raise ConfigError(
            [f"mopd.teachers.{cfg.platform}.dtype={cfg.dtype!r}: verl's Megatron engine allows {megatron_dtypes()}"]
        )


def megatron_dtypes() -> list[str]:
    """The dtypes verl's ``McoreEngineConfig`` admits here (``bfloat16``, ``float16``; the CPU harness of
    ``verl_mopd.testing.cpu.megatron`` adds ``float32``), asked of verl's own check."""
    from verl.workers.config import McoreEngineConfig

    allowed = []
    for dtype in ("bfloat16", "float16", "float32"):
        try:
            McoreEngineConfig(strategy="megatron", dtype=dtype, tensor_model_parallel_size=2)
        except AssertionError:
            continue
        allowed.append(dtype)
    return allowed


def _run_block(run_config, path: str) -> dict:
    from omegaconf import OmegaConf

    node = OmegaConf.select(run_config, path, default=None)
    if node is None:
        raise ValueError(f"megatron teachers are built like verl's reference model from the run config; it has no {path}")
    # interpolations (the ref block reads actor_rollout_ref.actor) resolved against the whole run
    return OmegaConf.to_container(node, resolve=True)


def teacher_blocks(cfg: TeacherConfig, run_config) -> tuple[dict, dict]:
    """The run's ``actor_rollout_ref.ref`` and ``.model`` blocks with this teacher on top (plain dicts).

    Driver side, no file access: the workers convert them (:func:`worker_config_from_blocks`), as
    verl's ``ActorRolloutRefWorker.init_model`` converts its ref block inside the worker.
    """
    _check_teacher(cfg)
    ref = _run_block(run_config, "actor_rollout_ref.ref")
    if ref.get("strategy") != "megatron":
        raise ValueError(f"backend=megatron teachers need verl's Megatron model engine (model_engine=megatron); "
                         f"actor_rollout_ref.ref.strategy={ref.get('strategy')!r}")
    # the renames verl's init_model applies to its ref block before conversion
    ref["ppo_mini_batch_size"] = _run_block(run_config, "actor_rollout_ref.actor")["ppo_mini_batch_size"]
    ref["ppo_micro_batch_size"] = ref.pop("log_prob_micro_batch_size", None)
    ref["ppo_micro_batch_size_per_gpu"] = ref.pop("log_prob_micro_batch_size_per_gpu", None)
    ref.pop("log_prob_use_dynamic_bsz", None)
    ref.pop("log_prob_max_token_len_per_gpu", None)
    ref["use_dynamic_bsz"] = True  # token-budget micro-batches
    ref["ppo_max_token_len_per_gpu"] = cfg.micro_batch_tokens
    ref["megatron"].update(
        tensor_model_parallel_size=cfg.tensor_model_parallel_size,
        pipeline_model_parallel_size=cfg.pipeline_model_parallel_size,
        virtual_pipeline_model_parallel_size=None,
        context_parallel_size=1,
        expert_model_parallel_size=1,
        expert_tensor_parallel_size=None,
        dynamic_context_parallel=False,
        dtype=cfg.dtype,
        forward_only=True,
        # verl's own (pageable) offload only for weights=pageable; pinned is MegatronTeacherWorker's
        param_offload=resolve_policy(cfg.weights, cfg.placement == "colocated") == "pageable",
        optimizer_offload=False,
    )
    model = _run_block(run_config, "actor_rollout_ref.model")
    # the teacher's own checkpoint and tokenizer, no adapter
    model.update(path=cfg.model_path, tokenizer_path=None, trust_remote_code=cfg.trust_remote_code, lora_rank=0,
                 lora={})
    return ref, model


def worker_config_from_blocks(cfg: TeacherConfig, ref: dict, model: dict):
    """verl ``TrainingWorkerConfig`` from :func:`teacher_blocks` (reads the checkpoint's HF config)."""
    from omegaconf import OmegaConf
    from verl.utils.config import omega_conf_to_dataclass
    from verl.workers.config import MtpConfig, TrainingWorkerConfig

    ref_config = omega_conf_to_dataclass(OmegaConf.create(ref))
    model_config = omega_conf_to_dataclass(OmegaConf.create(model))
    model_config.mtp = MtpConfig(enable=False)  # as verl's ref
    twc = TrainingWorkerConfig(
        model_type="language_model",
        model_config=model_config,
        engine_config=ref_config.engine,
        optimizer_config=ref_config.optim,
        checkpoint_config=ref_config.checkpoint,
    )
    twc.engine_config.use_dynamic_bsz = True
    twc.engine_config.infer_max_token_len_per_gpu = cfg.micro_batch_tokens
    twc.engine_config.infer_micro_batch_size_per_gpu = None
    twc.engine_config.use_remove_padding = model_config.get("use_remove_padding", False)
    return twc


def training_worker_config(cfg: TeacherConfig, run_config):
    """verl ``TrainingWorkerConfig`` of a forward-only teacher, built the way verl builds its ref.

    Args:
        cfg: the teacher (``backend: megatron``).
        run_config: the composed run config (``actor_rollout_ref.ref`` / ``.model`` / ``.actor``,
            model engine ``megatron``). Reads the teacher checkpoint's HF config, not its weights.
    """
    return worker_config_from_blocks(cfg, *teacher_blocks(cfg, run_config))


class MegatronTeacherWorker(FetchOnceWorker, TrainingWorker):
    """verl's ``TrainingWorker`` (forward only) answering the teacher call.

    Registers mesh ``TEACHER_MESH`` with the engine's data-parallel rank; only model-parallel source
    ranks (TP 0, last PP stage) collect, as for verl's own ``train`` mesh. A shard is read from
    TransferQueue by one rank of its model-parallel group and broadcast to the others
    (``verl_mopd.teachers.fetch``), not read by each of the TP x PP ranks.
    """

    def __init__(self, teacher: dict, ref: dict, model: dict):
        cfg = TeacherConfig(**teacher)
        self.weights_policy = resolve_policy(cfg.weights, cfg.placement == "colocated")
        super().__init__(worker_config_from_blocks(cfg, ref, model))
        self._register_dispatch_collect_info(
            TEACHER_MESH,
            dp_rank=self.engine.get_data_parallel_rank(),
            is_collect=self.engine.is_mp_src_rank_with_outputs(),
        )

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def init_model(self):
        self.reset()  # engine.initialize(): build, load the HF weights, offload (forward_only, pageable)
        from verl.utils.device import get_device_id

        # weights=pinned: verl's DDP offload scheme (one pinned buffer per tensor, reused) applied to
        # the forward-only model, whose verl offload would be pageable; resident/pageable: no-op here
        policy = "pinned" if self.weights_policy == "pinned" else "resident"
        self.weights = HostWeights([p for chunk in self.engine.module for p in chunk.parameters()],
                                   get_device_id(), policy)
        self.weights.offload()
        return True

    def fetch_group(self):
        """Megatron's model-parallel group (TP x PP) and its first rank; the broadcast runs on the GPU."""
        import torch
        from megatron.core import parallel_state as mpu
        from verl.utils.device import get_device_id, get_device_name

        group = mpu.get_model_parallel_group()
        if torch.distributed.get_world_size(group=group) == 1:
            return None, self._global_rank(), None
        device = get_device_id()  # an index on a GPU; the CPU platform's device is the string "cpu"
        device = torch.device(device) if isinstance(device, str) else torch.device(get_device_name(), device)
        return group, mpu.get_model_parallel_src_rank(), device

    @register(dispatch_mode=fetch_once_dispatch_mode(TEACHER_MESH), blocking=False)
    def compute_teacher_log_prob(self, shard):
        """``shard``: this data-parallel rank's shard (``DeferredShard``, fetched once per model-parallel
        group; or a TensorDict in the no-padding layout). Returns the stored output's ``KVBatchMeta``
        (or ``teacher_output`` for a TensorDict) on source ranks, None on the others."""
        from verl.utils import tensordict_utils as tu

        started = time.perf_counter()
        data = self.fetch_shard(shard)
        tu.maybe_fix_3d_position_ids(data)
        tu.assign_non_tensor(data, **{k: v for k, v in CALL_INFO.items() if k not in data.keys()})
        if "loss_mask" not in data.keys():  # the engine counts tokens on it; verl stores it = response_mask
            data["loss_mask"] = data["response_mask"]
        self.weights.load()
        try:
            output = self.infer_batch(data)  # verl's TrainingWorker.infer_batch: engine keys, eval mode, offload
        finally:
            self.weights.offload()
        if output is not None:
            output = teacher_output(output["log_probs"], data, started)
        return self.store_output(output, shard, is_collect=output is not None)


def megatron_teacher_class(cfg: TeacherConfig, run_config):
    """``RayClassWithInitArgs`` of the teacher worker for ``RayWorkerGroup``."""
    import ray
    from verl.single_controller.ray import RayClassWithInitArgs

    ref, model = teacher_blocks(cfg, run_config)
    return RayClassWithInitArgs(cls=ray.remote(MegatronTeacherWorker), teacher=dict(cfg), ref=ref, model=model)


# ----------------------------------------------------------------------------------------------
# what verl 0.9.1's Megatron engine imports (verl-mopd check)
# ----------------------------------------------------------------------------------------------


def _probe(module: str) -> tuple[bool, str]:
    try:
        mod = importlib.import_module(module)
    except Exception as exc:  # noqa: BLE001 - any import failure is the answer
        return False, f"{type(exc).__name__}: {exc}".splitlines()[0]
    version = getattr(mod, "__version__", None)
    if version is None:
        try:
            from importlib.metadata import version as dist_version

            version = dist_version({"megatron.core": "megatron-core", "megatron.bridge": "megatron-bridge",
                                    "transformer_engine": "transformer-engine", "flash_attn": "flash-attn"}
                                   .get(module, module))
        except Exception:  # noqa: BLE001
            version = "installed"
    return True, str(version)


def megatron_stack_report(vanilla_mbridge: bool = False) -> list[tuple[str, bool, str]]:
    """``(requirement, ok, detail)`` for each module verl 0.9.1's ``MegatronEngine`` imports.

    ``vanilla_mbridge`` is the engine's ``actor_rollout_ref.actor.megatron.vanilla_mbridge``
    (verl's default False: Megatron-Bridge, ``megatron.bridge``; True: the legacy ``mbridge``,
    which has no Qwen3-VL support in mbridge 0.15).
    """
    import torch

    rows = []
    ok, detail = _probe("megatron.core")
    rows.append(("megatron-core (megatron.core)", ok, detail))
    bridge = "mbridge" if vanilla_mbridge else "megatron.bridge"
    ok, detail = _probe(bridge)
    why = "vanilla_mbridge=true" if vanilla_mbridge else "vanilla_mbridge=false (verl's default)"
    rows.append((f"{'mbridge' if vanilla_mbridge else 'Megatron-Bridge (megatron.bridge)'}, for {why}", ok, detail))
    ok, detail = _probe("transformer_engine.pytorch")
    rows.append(("Transformer Engine (transformer_engine.pytorch), Megatron layer specs and THD attention", ok, detail))
    cuda = torch.cuda.is_available()
    detail = (f"{torch.cuda.device_count()} x {torch.cuda.get_device_name(0)}" if cuda
              else f"none visible (torch {torch.__version__}, CUDA build {torch.version.cuda})")
    rows.append(("CUDA device", cuda, detail))
    from verl_mopd.gpu_stack import PYTHON

    py = f"{sys.version_info.major}.{sys.version_info.minor}"
    rows.append((f"Python {PYTHON} (Megatron-Core 0.18 and Megatron-Bridge wheels need >= 3.12, verl 0.9.1 < 3.13)",
                 py == PYTHON, py))
    return rows


def check_megatron_stack(vanilla_mbridge: bool = False, out=None) -> bool:
    """Print :func:`megatron_stack_report`; True when the Megatron engine can be built here."""
    out = out or sys.stdout
    rows = megatron_stack_report(vanilla_mbridge)
    print("Megatron engine stack (backend: megatron teachers and actor):", file=out)
    for name, ok, detail in rows:
        print(f"  [{'ok' if ok else 'MISSING'}] {name}: {detail}", file=out)
    return all(ok for _, ok, _ in rows)
