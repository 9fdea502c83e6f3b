"""Validate a composed recipe without Ray or GPUs: verl's own checks, then ours.

``validate(config)`` returns ``(problems, warnings)`` as plain sentences. It converts every
section verl converts to dataclasses (``omega_conf_to_dataclass``), runs verl's
``validate_config``, and checks what verl cannot know: the ``mopd`` block, the teachers against
the cluster, the reward gate against the group filter, the paths. ``verl-mopd validate-recipe``
and ``python -m verl_mopd.trainer.main`` call it before anything starts.
"""

from __future__ import annotations

import contextlib
import io
import os
import warnings
from dataclasses import fields as dc_fields
from typing import Any

from omegaconf import DictConfig, OmegaConf

from verl_mopd.config import MOPDGateConfig

#: the reward levels each gate metric takes (verl_mopd.rewards defaults)
METRIC_LEVELS = {"acc": (0.0, 1.0), "rm_scores": (-1.0, -0.5, 1.0), "score": (-1.0, -0.5, 1.0)}
TEACHER_KEYS = ("routing_key", "teachers", "skip_gated", "mask_key", "output_key")


class RecipeError(ValueError):
    def __init__(self, problems: list[str]):
        self.problems = list(problems)
        super().__init__("invalid recipe:\n  - " + "\n  - ".join(self.problems))


def _section(config: DictConfig, path: str):
    return OmegaConf.select(config, path, default=None)


def _convert(config: DictConfig, path: str, problems: list[str]):
    from verl.utils.config import omega_conf_to_dataclass

    node = _section(config, path)
    if node is None:
        return None
    try:
        with contextlib.redirect_stdout(io.StringIO()):
            return omega_conf_to_dataclass(node)
    except Exception as exc:  # noqa: BLE001 - reported as a sentence
        message = str(exc).split("\nfull_key")[0].strip()
        problems.append(f"{path}: {message}")
        return None


def surviving_group_min_mean(levels: tuple[float, ...], n: int, drops_constant_groups: bool) -> float:
    """Smallest group mean that can reach the loss: with the all-equal groups filtered out, the
    lowest mixed group is n-1 rollouts at the lowest level and one at the next level."""
    lo = min(levels)
    if not drops_constant_groups or n < 2:
        return lo
    second = min(x for x in levels if x > lo)
    return ((n - 1) * lo + second) / n


def _check_mopd(config: DictConfig, problems: list[str], warnings: list[str]) -> MOPDGateConfig | None:
    block = _section(config, "mopd")
    if block is None:
        problems.append("mopd: the block is missing (compose the recipe on top of verl_mopd's mopd.yaml)")
        return None
    block = OmegaConf.to_container(block, resolve=True)
    gate_keys = {f.name for f in dc_fields(MOPDGateConfig) if not f.name.startswith("_")}
    allowed = gate_keys | set(TEACHER_KEYS) | {"beta"}
    unknown = sorted(set(block) - allowed)
    if unknown:
        problems.append(f"mopd: unknown key(s) {unknown}; allowed: {sorted(allowed)}")
    beta = block.get("beta")
    if not isinstance(beta, int | float) or isinstance(beta, bool) or beta < 0:
        problems.append(f"mopd.beta={beta!r}: must be a number >= 0 (UI-MOPD uses 0.01)")
    coef = _section(config, "distillation.distillation_loss.distillation_loss_coef")
    if isinstance(beta, int | float) and coef is not None and float(coef) != float(beta):
        problems.append(
            f"distillation.distillation_loss.distillation_loss_coef={coef} differs from mopd.beta={beta}; "
            "set one (mopd.yaml interpolates the coefficient from mopd.beta)"
        )
    try:
        gate = MOPDGateConfig(**{k: v for k, v in block.items() if k in gate_keys})
    except (ValueError, TypeError) as exc:
        problems.append(str(exc))
        return None
    if gate.enable:
        _check_gate_against_filter(config, gate, warnings)
    return gate


def _check_gate_against_filter(config: DictConfig, gate: MOPDGateConfig, warnings: list[str]) -> None:
    levels = METRIC_LEVELS.get(gate.gate_metric)
    if levels is None:
        return
    n = int(_section(config, "actor_rollout_ref.rollout.n") or 1)
    filt = _section(config, "algorithm.filter_groups")
    drops = bool(filt is not None and filt.get("enable", False))
    sampler = _section(config, "trainer.v1.sampler")
    if sampler is not None and str(sampler.get("custom_sampler", {}).get("path") or "").endswith("batching.sampler"):
        # our quota sampler decides: "drop" evicts all-equal groups, "kl_only" keeps the low ones
        drops = (sampler.get("sampler_kwargs", {}) or {}).get("uniform_groups", "drop") == "drop"
    lowest = surviving_group_min_mean(levels, n, drops)
    if lowest > gate.tau_kl:
        why = f"with all-equal groups filtered out and rollout.n={n}, " if drops else ""
        warnings.append(
            f"the reward gate masks every group: {why}the lowest group-mean {gate.gate_metric} that reaches the "
            f"loss is {lowest:.3f} > mopd.tau_kl={gate.tau_kl}, so the KL term is off for every trained sample. "
            "Raise tau_kl, gate on another metric, or keep the all-failure groups for the KL term."
        )
    if gate.tau_kl >= max(levels):
        warnings.append(
            f"mopd.tau_kl={gate.tau_kl} >= the highest {gate.gate_metric} level {max(levels)}: the gate never "
            "masks anything (set mopd.enable=false to say so)"
        )


def _check_teachers(config: DictConfig, problems: list[str]) -> None:
    from verl_mopd.teachers.config import (
        TeacherConfigError,
        TeachersConfig,
        validate_platforms,
        validate_temperature,
    )

    block = _section(config, "mopd")
    teachers_block = {k: v for k, v in OmegaConf.to_container(block, resolve=True).items() if k in TEACHER_KEYS}
    if not teachers_block.get("teachers"):
        if not bool(_section(config, "distillation.enabled")):
            problems.append(
                "mopd.teachers is empty and distillation.enabled=false: configure one teacher per platform "
                "(mopd.teachers.<platform>.model_path, backend)"
            )
        return
    try:
        teachers = TeachersConfig.from_mapping(teachers_block)
    except TeacherConfigError as exc:
        problems.extend(exc.errors)
        return
    problems.extend(validate_temperature(_section(config, "actor_rollout_ref.rollout.temperature")))
    for split_name, key in (("train", "data.train_files"), ("val", "data.val_files")):
        platforms = _data_platforms(_section(config, key), teachers.routing_key, key, problems)
        if platforms is not None:
            problems.extend(validate_platforms(platforms, teachers.platforms, split_name))
    actor_gpus = int(_section(config, "trainer.n_gpus_per_node")) * int(_section(config, "trainer.nnodes"))
    for platform, t in teachers.teachers.items():
        if t.backend != "server" and t.placement == "colocated" and t.world_size > actor_gpus:
            problems.append(
                f"mopd.teachers.{platform}: colocated with the actor but needs {t.world_size} devices "
                f"(n_gpus_per_node*nnodes) while trainer.n_gpus_per_node*trainer.nnodes={actor_gpus}"
            )
        if t.backend != "server" and t.placement == "colocated" and actor_gpus % t.world_size:
            problems.append(
                f"mopd.teachers.{platform}: a colocated teacher's {t.world_size} devices must divide the actor "
                f"pool of {actor_gpus}"
            )
        _check_path(f"mopd.teachers.{platform}.model_path", t.model_path, problems, [])
    if any(t.backend == "server" for t in teachers.teachers.values()) and not bool(
        _section(config, "distillation.enabled")
    ):
        problems.append(
            "mopd.teachers use backend=server (verl's teacher loop) but distillation.enabled=false; "
            "set distillation.enabled=true (verl_mopd.teachers.backends.server builds that block)"
        )


def _data_platforms(files: Any, routing_key: str, key: str, problems: list[str]) -> set[str] | None:
    """The routing-key values in local parquet files (None when the files are not on this machine)."""
    if files is None:
        return None
    paths = [str(f) for f in (files if isinstance(files, list | tuple) else [files])]
    if not all(os.path.isfile(p) for p in paths):
        return None
    import pyarrow.parquet as pq

    values: set[str] = set()
    for path in paths:
        if routing_key not in pq.read_schema(path).names:
            problems.append(
                f"{key}: {path} has no top-level column {routing_key!r} (mopd.routing_key); "
                "verl-mopd prepare writes it"
            )
            return None
        values |= {str(v) for v in pq.read_table(path, columns=[routing_key]).column(0).to_pylist()}
    return values


def _check_sampler(config: DictConfig, problems: list[str]) -> None:
    """Our quota sampler's kwargs (BatchingConfig), and its domains against the teachers."""
    sampler = _section(config, "trainer.v1.sampler")
    path = str((sampler or {}).get("custom_sampler", {}).get("path") or "")
    if not path.endswith("verl_mopd.batching.sampler"):
        return
    from verl_mopd.batching.sampler import BatchingConfig

    kwargs = OmegaConf.to_container(sampler.get("sampler_kwargs") or {}, resolve=True)
    try:
        batching = BatchingConfig.from_sampler_kwargs(kwargs)
    except (ValueError, TypeError) as exc:
        problems.append(str(exc))
        return
    teachers = _section(config, "mopd.teachers")
    if teachers and set(batching.quota.shares) != set(teachers):
        problems.append(
            f"trainer.v1.sampler.sampler_kwargs.quota.shares has domains {sorted(batching.quota.shares)} but "
            f"mopd.teachers has {sorted(teachers)}: give every platform a share"
        )


def _check_path(key: str, value: Any, problems: list[str], warnings: list[str]) -> None:
    if value is None or (isinstance(value, str) and not value.strip()):
        problems.append(f"{key} is not set: give a path")
        return
    values = list(value) if isinstance(value, list | tuple) else [value]
    for v in values:
        v = str(v)
        if "/" in v and not v.startswith(("hf://", "s3://", "gs://", "hdfs://")) and not os.path.exists(v):
            warnings.append(f"{key}={v} does not exist on this machine (fine if it exists on the cluster)")


def validate(config: DictConfig) -> tuple[list[str], list[str]]:
    """All problems (the run would fail or be wrong) and warnings (probably not what you want)."""
    from verl.trainer.distillation.losses import DISTILLATION_LOSS_REGISTRY
    from verl.trainer.ppo.utils import need_critic, need_reference_policy
    from verl.utils.config import validate_config

    from verl_mopd.plugin import register

    register()
    problems: list[str] = []
    warnings: list[str] = []

    loss_mode = _section(config, "distillation.distillation_loss.loss_mode")
    if loss_mode not in DISTILLATION_LOSS_REGISTRY:
        problems.append(
            f"distillation.distillation_loss.loss_mode={loss_mode!r} is not a registered distillation loss; "
            f"registered: {sorted(DISTILLATION_LOSS_REGISTRY)}"
        )
    else:
        for path in ("actor_rollout_ref.actor", "actor_rollout_ref.rollout", "algorithm", "distillation"):
            _convert(config, path, problems)
        if need_critic(config):
            _convert(config, "critic", problems)
        if not problems:
            try:
                with contextlib.redirect_stdout(io.StringIO()):
                    validate_config(config, need_reference_policy(config), need_critic(config))
            except (AssertionError, ValueError) as exc:
                problems.append(f"verl validate_config: {exc}")

    gate = _check_mopd(config, problems, warnings)
    if gate is not None:
        _check_teachers(config, problems)
        _check_placement_and_mode(config, problems)
    _check_sampler(config, problems)
    for key in ("actor_rollout_ref.model.path", "data.train_files", "data.val_files"):
        _check_path(key, _section(config, key), problems, warnings)
    return problems, warnings


def _check_placement_and_mode(config: DictConfig, problems: list[str]) -> None:
    """What verl checks only once the trainer and its pools exist: the separate-async trainer's
    constructor asserts, and the number of processes sharing each GPU of the actor's pool."""
    _check_separate_async(config, problems)
    _check_colocated_slots(config, problems)


def _check_separate_async(config: DictConfig, problems: list[str]) -> None:
    """``verl.trainer.ppo.v1.trainer_separate_async.PPOTrainerSeparateAsync.__init__``'s asserts."""
    mode = str(_section(config, "trainer.v1.trainer_mode"))
    if mode not in ("separate_async", "mopd_separate_async"):
        return
    train, mini = _section(config, "data.train_batch_size"), _section(config, "actor_rollout_ref.actor.ppo_mini_batch_size")
    sync = _section(config, "trainer.v1.separate_async.parameter_sync_step")
    if train != sync * mini:
        problems.append(
            f"trainer.v1.trainer_mode={mode} needs data.train_batch_size == trainer.v1.separate_async.parameter_sync_step"
            f" * actor_rollout_ref.actor.ppo_mini_batch_size, got {train} != {sync} * {mini} (verl's separate-async "
            f"trainer asserts it); e.g. set trainer.v1.separate_async.parameter_sync_step={train // mini if mini else 1}"
        )
    for key in ("nnodes", "n_gpus_per_node"):
        if not (_section(config, f"actor_rollout_ref.rollout.{key}") or 0) > 0:
            problems.append(
                f"trainer.v1.trainer_mode={mode} runs the rollout on its own pool: set actor_rollout_ref.rollout.{key} > 0 "
                f"(got {_section(config, f'actor_rollout_ref.rollout.{key}')})"
            )
    backend = _section(config, "actor_rollout_ref.rollout.checkpoint_engine.backend")
    if backend == "naive":
        problems.append(
            f"trainer.v1.trainer_mode={mode}: actor_rollout_ref.rollout.checkpoint_engine.backend=naive cannot send "
            "weights to a separate rollout pool; use nccl (or nixl, mooncake)"
        )
    if bool(_section(config, "reward.reward_model.enable")) and not bool(
        _section(config, "reward.reward_model.enable_resource_pool")
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
    if bool(_section(config, "reward.reward_model.enable")) and not bool(
        _section(config, "reward.reward_model.enable_resource_pool")
    ):
        users.append("reward model")
    teachers = OmegaConf.to_container(_section(config, "mopd.teachers") or {}, resolve=True)
    users += [f"teacher {p}" for p, t in teachers.items()
              if isinstance(t, dict) and t.get("placement") == "colocated" and t.get("backend", "hf") != "server"]
    if len(users) > slots:
        problems.append(
            f"the actor's resource pool runs {slots} processes per GPU (verl's ResourcePoolManager.max_colocate_count) "
            f"but {len(users)} share it: {users}; give a teacher placement: dedicated or the reward model its own pool "
            "(reward.reward_model.enable_resource_pool=true)"
        )


def compose_recipe(path: str, overrides: list[str] | None = None) -> DictConfig:
    """Compose a recipe YAML (with its hydra defaults and searchpath) plus overrides, as hydra would."""
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    path = os.path.abspath(path)
    if not os.path.isfile(path) or not path.endswith((".yaml", ".yml")):
        raise FileNotFoundError(f"recipe {path} is not a YAML file")
    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=os.path.dirname(path), version_base=None):
        return compose(config_name=os.path.splitext(os.path.basename(path))[0], overrides=list(overrides or []))


def is_sft_recipe(config: DictConfig) -> bool:
    """Stage-1 recipes run verl's SFT trainer (no rollout, no mopd block)."""
    return _section(config, "actor_rollout_ref") is None and _section(config, "data.messages_key") is not None


def validate_sft(config: DictConfig) -> tuple[list[str], list[str]]:
    """Stage-1 (verl SFT trainer) recipes: convert verl's dataclasses, check paths and GPU counts."""
    problems: list[str] = []
    warnings: list[str] = []
    sections = ["engine", "optim", "checkpoint"]
    model_path = _section(config, "model.path")
    if model_path and os.path.exists(str(model_path)):
        sections.append("model")  # HFModelConfig reads the checkpoint's config.json
    for path in sections:
        _convert(config, path, problems)
    for key in ("model.path", "data.train_files"):
        _check_path(key, _section(config, key), problems, warnings)
    engine = _section(config, "engine")
    gpus = int(_section(config, "trainer.n_gpus_per_node") or 0) * int(_section(config, "trainer.nnodes") or 0)
    if engine is not None and gpus:
        mp = int(engine.get("tensor_model_parallel_size", 1)) * int(engine.get("pipeline_model_parallel_size", 1))
        mp *= int(engine.get("context_parallel_size", 1))
        if gpus % mp:
            problems.append(
                f"engine TP*PP*CP={mp} does not divide trainer.n_gpus_per_node*trainer.nnodes={gpus}"
            )
    return problems, warnings


def validate_recipe_cli(path: str, overrides: list[str], print_config: bool = False) -> int:
    """``verl-mopd validate-recipe``: 0 when valid, 1 when not; problems printed in plain words."""
    import sys

    try:
        config = compose_recipe(path, overrides)
    except Exception as exc:  # noqa: BLE001 - composition errors are user errors
        print(f"{path}: cannot compose: {exc}", file=sys.stderr)
        return 1
    problems, warnings = (validate_sft if is_sft_recipe(config) else validate)(config)
    if print_config:
        print(OmegaConf.to_yaml(config, resolve=True))
    for w in warnings:
        print(f"WARNING: {w}", file=sys.stderr)
    for p in problems:
        print(f"ERROR: {p}", file=sys.stderr)
    print(f"{path}: {'valid' if not problems else f'{len(problems)} problem(s)'}", file=sys.stderr)
    return 0 if not problems else 1
