"""Cluster checks of a composed recipe: GPU counts, the separate-async trainer's asserts, colocation
slots and the checkpoint folder, i.e. what verl checks only once the trainer and its pools exist.
Used by ``verl_mopd.checks.validate``.
"""

from __future__ import annotations

import math
import os
import warnings

from omegaconf import DictConfig, OmegaConf


def section(config: DictConfig, path: str):
    """``config`` at the dotted ``path``, or None."""
    return OmegaConf.select(config, path, default=None)


def _positive_int(config: DictConfig, key: str, problems: list[str]) -> int | None:
    value = section(config, key)
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        problems.append(f"{key}={value!r}: must be a positive integer")
        return None
    return value


def _check_cluster(config: DictConfig, problems: list[str]) -> bool:
    """GPU counts and the rollout's parallel layout; False when they are unusable (the checks that
    divide by them must not run)."""
    if section(config, "trainer") is None:
        return True
    n_gpus = _positive_int(config, "trainer.n_gpus_per_node", problems)
    nnodes = _positive_int(config, "trainer.nnodes", problems)
    if n_gpus is None or nnodes is None:
        return False
    rollout = section(config, "actor_rollout_ref.rollout")
    if rollout is None:
        return True
    sizes = {}
    for name in ("tensor_model_parallel_size", "data_parallel_size", "pipeline_model_parallel_size"):
        if rollout.get(name) is not None:
            sizes[name] = _positive_int(config, f"actor_rollout_ref.rollout.{name}", problems)
    if any(v is None for v in sizes.values()):
        return False
    replica = math.prod(sizes.values())
    separate = int(rollout.get("nnodes") or 0) > 0
    pool_key = (
        "actor_rollout_ref.rollout.n_gpus_per_node*nnodes" if separate else "trainer.n_gpus_per_node*trainer.nnodes"
    )
    pool = int(rollout.get("n_gpus_per_node") or 0) * int(rollout.get("nnodes")) if separate else n_gpus * nnodes
    if pool % replica:
        problems.append(
            f"actor_rollout_ref.rollout TP*DP*PP={replica} ({sizes}) does not divide {pool_key}={pool}: every "
            "rollout replica needs that many GPUs and the pool must split into whole replicas"
        )
    return True


def checkpoint_dir_problems(config: DictConfig) -> list[str]:
    """``trainer.default_local_dir`` must be absolute when the job spans more than one node: every
    Megatron rank writes its checkpoint shards there and the driver its ``data.pt`` (and our
    ``batching_state.json``, ``mopd_held_prompts.pt``), each resolving a relative path against its
    own working directory on its own node, so the checkpoint would be scattered and unresumable."""
    folder = section(config, "trainer.default_local_dir")
    nodes = section(config, "trainer.nnodes")
    rollout_nodes = section(config, "actor_rollout_ref.rollout.nnodes") or 0
    if not isinstance(nodes, int) or not isinstance(rollout_nodes, int) or folder is None:
        return []
    total = nodes + rollout_nodes  # a separate rollout pool adds nodes
    if total > 1 and not os.path.isabs(str(folder)):
        return [
            f"trainer.default_local_dir={folder} is relative, but the job runs on {total} nodes: each node would "
            "write its checkpoint shards under its own working directory; set it to an absolute folder on storage "
            "every node mounts (the recipes read CKPT_DIR: CKPT_DIR=/mnt/ckpt)"
        ]
    return []


def _check_placement_and_mode(config: DictConfig, problems: list[str]) -> None:
    """What verl checks only once the trainer and its pools exist: the separate-async trainer's
    constructor asserts, and the number of processes sharing each GPU of the actor's pool."""
    _check_separate_async(config, problems)
    _check_colocated_slots(config, problems)


def _check_separate_async(config: DictConfig, problems: list[str]) -> None:
    """``verl.trainer.ppo.v1.trainer_separate_async.PPOTrainerSeparateAsync.__init__``'s asserts."""
    mode = str(section(config, "trainer.v1.trainer_mode"))
    if mode not in ("separate_async", "mopd_separate_async"):
        return
    train, mini = section(config, "data.train_batch_size"), section(config, "actor_rollout_ref.actor.ppo_mini_batch_size")
    sync = section(config, "trainer.v1.separate_async.parameter_sync_step")
    if train != sync * mini:
        problems.append(
            f"trainer.v1.trainer_mode={mode} needs data.train_batch_size == trainer.v1.separate_async.parameter_sync_step"
            f" * actor_rollout_ref.actor.ppo_mini_batch_size, got {train} != {sync} * {mini} (verl's separate-async "
            f"trainer asserts it); e.g. set trainer.v1.separate_async.parameter_sync_step={train // mini if mini else 1}"
        )
    for key in ("nnodes", "n_gpus_per_node"):
        if not (section(config, f"actor_rollout_ref.rollout.{key}") or 0) > 0:
            problems.append(
                f"trainer.v1.trainer_mode={mode} runs the rollout on its own pool: set actor_rollout_ref.rollout.{key} > 0 "
                f"(got {section(config, f'actor_rollout_ref.rollout.{key}')})"
            )
    backend = section(config, "actor_rollout_ref.rollout.checkpoint_engine.backend")
    if backend == "naive":
        problems.append(
            f"trainer.v1.trainer_mode={mode}: actor_rollout_ref.rollout.checkpoint_engine.backend=naive cannot send "
            "weights to a separate rollout pool; use nccl (or nixl, mooncake)"
        )
    if bool(section(config, "reward.reward_model.enable")) and not bool(
        section(config, "reward.reward_model.enable_resource_pool")
    ):
        problems.append(
            f"trainer.v1.trainer_mode={mode}: a colocated reward model is not supported (the standalone rollout never "
            "pauses); set reward.reward_model.enable_resource_pool=true"
        )


def _check_colocated_slots(config: DictConfig, problems: list[str]) -> None:
    """verl's global pool gives every process 1 / ``ResourcePoolManager.max_colocate_count`` of a GPU;
    one process too many and Ray waits on the placement forever, without an error."""
    from verl.single_controller.ray.base import ResourcePoolManager
    from verl.trainer.ppo.utils import need_critic

    slots = ResourcePoolManager.__dataclass_fields__["max_colocate_count"].default
    users = ["actor/rollout"]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # verl warns on every call; validate() has already reported it
        critic = need_critic(config)
    if critic:
        users.append("critic")
    if bool(section(config, "reward.reward_model.enable")) and not bool(
        section(config, "reward.reward_model.enable_resource_pool")
    ):
        users.append("reward model")
    block = section(config, "mopd.teachers")  # an empty DictConfig is falsy: no `or {}`
    teachers = OmegaConf.to_container(block, resolve=True) if block is not None else {}
    users += [f"teacher {p}" for p, t in teachers.items()
              if isinstance(t, dict) and t.get("placement") == "colocated"]
    if len(users) > slots:
        problems.append(
            f"the actor's resource pool runs {slots} processes per GPU (verl's ResourcePoolManager.max_colocate_count) "
            f"but {len(users)} share it: {users}; give a teacher placement: dedicated or the reward model its own pool "
            "(reward.reward_model.enable_resource_pool=true)"
        )
