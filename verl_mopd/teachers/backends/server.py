"""``server`` backend: the same ``mopd.teachers`` block, served by verl's built-in teacher loop.

verl 0.9.1 already runs inference-server teachers (SGLang/vLLM ``prompt_logprobs``) inside the
agent loop, routed per sample by ``distillation.teacher_key`` (``experimental/teacher_loop``).
This module only translates our block into verl's ``distillation.*`` config; the result is
validated by constructing verl's own ``DistillationConfig`` dataclasses (``workers/config/distillation.py``).
"""

from __future__ import annotations

from typing import Any

from verl_mopd.config import MOPDConfig
from verl_mopd.errors import ConfigError

__all__ = ["to_distillation_config", "to_hydra_overrides", "build_verl_distillation_config",
           "verl_teacher_inference_defaults"]


def verl_teacher_inference_defaults() -> dict[str, Any]:
    """verl's default ``distillation.teacher_models.teacher_model.inference`` block
    (``verl/trainer/config/distillation/distillation.yaml``), interpolations kept (rollout name, dtype,
    prompt/response length and temperature follow ``actor_rollout_ref.rollout``)."""
    from importlib import resources

    from omegaconf import OmegaConf

    path = resources.files("verl.trainer.config") / "distillation" / "distillation.yaml"
    return OmegaConf.to_container(OmegaConf.load(path).teacher_models.teacher_model.inference, resolve=False)


def to_distillation_config(teachers: MOPDConfig, inference_defaults: dict | None = None) -> dict[str, Any]:
    """The ``distillation`` block (minus ``distillation_loss``) for ``backend=server`` teachers.

    Every teacher becomes ``teacher_models.<platform>`` with ``key=<platform>``, and
    ``teacher_key`` is our ``routing_key``. verl runs all server teachers in one distillation
    pool of ``n_gpus_per_node x nnodes`` whose size must equal the sum of the teachers'
    ``num_replicas * tp * pp``: each teacher's ``nnodes`` adds to the pool, so all teachers must
    share ``n_gpus_per_node``. A single teacher is written as verl's ``teacher_model`` entry
    (verl then routes everything to it).
    """
    errors = []
    not_server = sorted(p for p, c in teachers.teachers.items() if c.backend != "server")
    if not_server:
        errors.append(f"mopd.teachers {not_server}: backend is not 'server'; only server teachers map to verl's loop")
    per_node = {c.n_gpus_per_node for c in teachers.teachers.values()}
    if len(per_node) > 1:
        errors.append(
            f"mopd.teachers.*.n_gpus_per_node differ ({sorted(per_node)}): verl's distillation pool has one "
            "n_gpus_per_node for all server teachers"
        )
    if errors:
        raise ConfigError(errors, "mopd.teachers config")
    models = {}
    for platform, c in teachers.teachers.items():
        # verl drops its own `teacher_model` entry (and its inference defaults) when several teachers
        # are configured, so every entry starts from that block, interpolations included
        inference = {**verl_teacher_inference_defaults(), **(inference_defaults or {}), **dict(c.inference)}
        inference.update(tensor_model_parallel_size=c.tensor_model_parallel_size,
                         pipeline_model_parallel_size=c.pipeline_model_parallel_size,
                         data_parallel_size=1)
        if "dtype" not in c.inference and "dtype" not in (inference_defaults or {}):
            inference["dtype"] = c.dtype
        models[platform] = {"key": platform, "model_path": c.model_path, "num_replicas": c.data_parallel_size,
                            "inference": inference}
    if len(models) == 1:
        models = {"teacher_model": next(iter(models.values()))}
    return {
        "enabled": True,
        "n_gpus_per_node": per_node.pop(),
        "nnodes": sum(c.nnodes for c in teachers.teachers.values()),
        "teacher_key": teachers.routing_key,
        "teacher_models": models,
    }


def _flatten(prefix: str, value) -> list[tuple[str, Any]]:
    if isinstance(value, dict):
        return [kv for k, v in value.items() for kv in _flatten(f"{prefix}.{k}", v)]
    return [(prefix, value)]


def to_hydra_overrides(teachers: MOPDConfig) -> list[str]:
    """The same translation as CLI overrides on verl's ``ppo_trainer`` (``+`` for new teacher entries)."""
    block = to_distillation_config(teachers)
    out = []
    for key, value in _flatten("distillation", block):
        new = key.startswith("distillation.teacher_models.") and not key.startswith(
            "distillation.teacher_models.teacher_model."
        )
        text = "null" if value is None else (str(value).lower() if isinstance(value, bool) else str(value))
        out.append(f"{'+' if new else ''}{key}={text}")
    return out


def build_verl_distillation_config(teachers: MOPDConfig, *, rollout, distillation_loss: dict | None = None,
                                   inference_defaults: dict | None = None):
    """verl's ``DistillationConfig`` from our block: runs verl's own validation (pool sizes, keys).

    ``rollout``: the run's ``actor_rollout_ref.rollout`` block (or a dict with at least ``name``,
    ``prompt_length``, ``response_length``), which verl's inference defaults interpolate.
    """
    from omegaconf import OmegaConf
    from verl.utils.config import omega_conf_to_dataclass
    from verl.workers.config import DistillationConfig

    block = to_distillation_config(teachers, inference_defaults)
    models = block["teacher_models"]
    # verl pops its default `teacher_model` entry when several teachers are configured
    if "teacher_model" not in models:
        models = {"teacher_model": {"key": None, "model_path": None, "num_replicas": 0}, **models}
    typed = {}
    for name, m in models.items():
        typed[name] = {"_target_": "verl.workers.config.DistillationTeacherModelConfig", **m,
                       "inference": {"_target_": "verl.workers.config.RolloutConfig", **m.get("inference", {})}}
    cfg = {**block, "teacher_models": typed, "_target_": "verl.workers.config.DistillationConfig",
           "distillation_loss": {"_target_": "verl.workers.config.DistillationLossConfig",
                                 **(distillation_loss or {"loss_mode": "k3", "use_policy_gradient": False})}}
    rollout = OmegaConf.to_container(rollout, resolve=True) if OmegaConf.is_config(rollout) else dict(rollout)
    root = {"distillation": cfg, "actor_rollout_ref": {"rollout": rollout}}
    # as verl's v1 trainer does: `omega_conf_to_dataclass(config.distillation)` (hydra instantiate)
    out = omega_conf_to_dataclass(OmegaConf.create(root).distillation)
    assert isinstance(out, DistillationConfig)
    return out
