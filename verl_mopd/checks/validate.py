"""The cross-section checks of a composed recipe, without Ray or GPUs: verl's own checks, then ours.

``validate(config)`` returns ``(problems, warnings)`` as plain sentences. It converts every
section verl converts to dataclasses (``omega_conf_to_dataclass``), runs verl's
``validate_config``, and checks what verl cannot know: the ``mopd`` block against the data, the
teachers against the cluster, the reward gate against the group filter (with the levels the
configured reward gives), the quota sampler against the teachers, the paths. The launch callback
(``verl_mopd.checks.launch``, on every hydra launch) and ``verl-mopd validate-recipe``
(``verl_mopd.checks.recipe_cli``) both run it through :func:`validate_composed`.

Validation never runs code from the recipe (``verl_mopd.checks.recipe_safety``: every ``_target_``
and ``pkg://`` search path is checked first); the GPU counts, the async trainers' asserts and the
colocation slots are ``verl_mopd.checks.cluster_checks``.
"""

from __future__ import annotations

import contextlib
import difflib
import io
import math
import os
import re
from typing import TYPE_CHECKING, Any

from omegaconf import DictConfig, OmegaConf

from verl_mopd.checks.cluster_checks import (
    _check_cluster,
    _check_placement_and_mode,
    checkpoint_dir_problems,
    section,
)
from verl_mopd.checks.recipe_safety import code_target_problems
from verl_mopd.errors import ConfigError

if TYPE_CHECKING:
    from verl_mopd.config import MOPDConfig


def _convert(config: DictConfig, path: str, problems: list[str]):
    from verl.utils.config import omega_conf_to_dataclass

    node = section(config, path)
    if node is None:
        return None
    try:
        with contextlib.redirect_stdout(io.StringIO()):
            return omega_conf_to_dataclass(node)
    except Exception as exc:  # noqa: BLE001 - reported as a sentence
        message = str(exc).split("\nfull_key")[0].strip()
        problems.append(f"{path}: {message}")
        return None


def _sentences(exc: Exception) -> list[str]:
    """The lines of a config dataclass's error: each of a ``ConfigError``'s, else the message."""
    return list(exc.errors) if isinstance(exc, ConfigError) else [str(exc)]


def surviving_group_min_mean(levels: tuple[float, ...], n: int, drops_constant_groups: bool) -> float:
    """Smallest group mean that can reach the loss: with the all-equal groups filtered out, the
    lowest mixed group is n-1 rollouts at the lowest level and one at the next level."""
    lo = min(levels)
    if not drops_constant_groups or n < 2:
        return lo
    second = min(x for x in levels if x > lo)
    return ((n - 1) * lo + second) / n


def _check_mopd(config: DictConfig, problems: list[str], warnings: list[str]) -> MOPDConfig | None:
    from verl_mopd.config import MOPDConfig

    block = section(config, "mopd")
    if block is None:  # a plain verl run (e.g. GRPO with our reward) needs none
        users = [f"{key}={section(config, key)}" for key in ("distillation.distillation_loss.loss_mode",
                                                               "trainer.v1.trainer_mode")
                 if str(section(config, key)).startswith("mopd")]
        if users:
            problems.append(f"mopd: the block is missing; {' and '.join(users)} {'needs' if len(users) == 1 else 'need'} "
                            "it (compose the recipe on top of verl_mopd's mopd.yaml)")
        return None
    try:
        mopd_config = MOPDConfig.from_mapping(block)  # unknown and removed keys, every field check
    except ConfigError as exc:
        problems.extend(exc.errors)
        return None
    beta = section(config, "distillation.distillation_loss.distillation_loss_coef")
    if beta is not None and (isinstance(beta, bool) or not isinstance(beta, int | float) or beta < 0):
        problems.append(f"distillation.distillation_loss.distillation_loss_coef={beta!r} (beta): must be a number "
                        ">= 0 (UI-MOPD uses 0.01)")
    if mopd_config.enable:
        problems.extend(p for p in [gate_metric_problem(config)] if p)
        _check_gate_against_filter(config, mopd_config, problems, warnings)
        mode = section(config, "actor_rollout_ref.actor.loss_agg_mode")
        if mopd_config.normalization == "kept" and mode is not None and mode != "token-mean":
            problems.append(
                f"mopd.normalization=kept with actor_rollout_ref.actor.loss_agg_mode={mode}: 'kept' is exact only for "
                "token-mean (the gate scales the kept samples by N_tokens / N_kept_tokens of the step, a token "
                "ratio that is wrong for a per-sequence mean or a sum); use mopd.normalization=all or "
                "loss_agg_mode=token-mean"
            )
    return mopd_config


#: how a recipe names verl-mopd's own reward function (``reward.custom_reward_function.path``)
OUR_REWARD_PATHS = ("pkg://verl_mopd.rewards.score", "pkg://verl_mopd.rewards")


def reward_extra_keys(config: DictConfig) -> tuple[str, ...] | None:
    """The numeric ``reward_extra_info`` keys the configured reward produces: those of verl-mopd's
    ``compute_score`` (verl's reward managers store every key it returns). None when the reward is
    another function: its keys are known only once it runs, and validation runs no recipe code."""
    fn = section(config, "reward.custom_reward_function") or {}
    path = str(fn.get("path") or "").replace(os.sep, "/")
    ours = path in OUR_REWARD_PATHS or path.endswith(("verl_mopd/rewards/score.py", "verl_mopd/rewards/__init__.py"))
    source = section(config, "reward.reward_manager.source")
    if not ours or fn.get("name") != "compute_score" or source not in (None, "register"):
        return None
    from verl_mopd.rewards.score import NUMERIC_KEYS

    return NUMERIC_KEYS


def metric_problem(config: DictConfig, key: str, value: Any, extra: tuple[str, ...]) -> str | None:
    """``key=value`` names neither one of ``extra`` nor a reward extra the configured reward produces
    (:func:`reward_extra_keys`): one line with the nearest allowed name and every allowed one; None
    when fine or unknowable."""
    produced = reward_extra_keys(config)
    if produced is None:
        return None
    allowed = [*extra, *produced]
    if value in allowed:
        return None
    fn = section(config, "reward.custom_reward_function")
    close = difflib.get_close_matches(str(value), allowed, n=1, cutoff=0.6)
    hint = f"did you mean {close[0]}? " if close else ""
    return (f"{key}={value!r}: the configured reward ({fn.get('path')}:{fn.get('name')}) does not produce it; "
            f"{hint}allowed: {', '.join(allowed)}")


def gate_metric_problem(config: DictConfig) -> str | None:
    """``mopd.gate_metric`` the configured reward cannot produce (checked only while the gate is on)."""
    block = section(config, "mopd")
    if block is None or not block.get("enable", True):
        return None
    return metric_problem(config, "mopd.gate_metric", block.get("gate_metric", "acc"), ("rm_scores",))


def gate_metric_levels(config: DictConfig, metric: str, problems: list[str], warnings: list[str]) -> tuple[float, ...] | None:
    """The values ``metric`` takes per sample, read from the configured reward: ``acc`` is 0 or 1;
    ``rm_scores`` and ``score`` take the levels of verl-mopd's ``compute_score`` with the recipe's
    ``reward_kwargs`` (:func:`verl_mopd.rewards.score.reward_levels`, which also refuses bad kwargs
    here, before Ray). None, with a warning saying the check is skipped, for another reward, whose
    levels are known only once it runs; None for any other metric."""
    if metric == "acc":
        return (0.0, 1.0)
    if metric not in ("rm_scores", "score"):
        return None
    fn = section(config, "reward.custom_reward_function") or {}
    if reward_extra_keys(config) is None:
        warnings.append(
            f"the reward gate is not checked against the group filter: mopd.gate_metric={metric} takes the levels of "
            f"the configured reward ({fn.get('path')}:{fn.get('name')}), which are known only once it runs "
            "(verl-mopd's compute_score is the one reward whose levels are read from the config)"
        )
        return None
    from verl_mopd.rewards.score import reward_levels

    kwargs = OmegaConf.to_container(fn.get("reward_kwargs") or {}, resolve=True)
    try:
        return reward_levels(**kwargs)
    except (ValueError, TypeError) as exc:
        problems.extend(f"reward.custom_reward_function.reward_kwargs: {e}" for e in _sentences(exc))
        return None


def _check_gate_against_filter(config: DictConfig, mopd_config: MOPDConfig, problems: list[str],
                               warnings: list[str]) -> None:
    levels = gate_metric_levels(config, mopd_config.gate_metric, problems, warnings)
    if levels is None:
        return
    n = int(section(config, "actor_rollout_ref.rollout.n") or 1)
    filt = section(config, "algorithm.filter_groups")
    drops = bool(filt is not None and filt.get("enable", False))
    sampler = section(config, "trainer.v1.sampler")
    if sampler is not None and str(sampler.get("custom_sampler", {}).get("path") or "").endswith("batching.sampler"):
        # our quota sampler decides: "drop" evicts all-equal groups, "kl_only" keeps the low ones
        drops = (sampler.get("sampler_kwargs", {}) or {}).get("uniform_groups", "drop") == "drop"
    lowest = surviving_group_min_mean(levels, n, drops)
    if lowest > mopd_config.tau_kl:
        why = f"with all-equal groups filtered out and rollout.n={n}, " if drops else ""
        warnings.append(
            f"the reward gate masks every group: {why}the lowest group-mean {mopd_config.gate_metric} that reaches the "
            f"loss is {lowest:.3f} > mopd.tau_kl={mopd_config.tau_kl}, so the KL term is off for every trained sample. "
            "Raise tau_kl, gate on another metric, or keep the all-failure groups for the KL term."
        )
    if mopd_config.tau_kl >= max(levels):
        warnings.append(
            f"mopd.tau_kl={mopd_config.tau_kl} >= the highest {mopd_config.gate_metric} level {max(levels)}: the gate never "
            "masks anything (set mopd.enable=false to say so)"
        )


def run_teachers(config: DictConfig, mopd_config: MOPDConfig) -> dict[str, Any]:
    """``{routing value: teacher}`` of every teacher the run has, wherever it is declared: the
    worker teachers of ``mopd.teachers`` (``TeacherConfig``), or verl's own teacher loop
    (``distillation.teacher_models``, ``verl_mopd.teachers.verl_loop.LoopTeacher``)."""
    from verl_mopd.teachers.verl_loop import loop_teachers

    if mopd_config.teachers:
        return dict(mopd_config.teachers)
    block = section(config, "distillation")
    distillation = None
    if block is not None:
        try:
            distillation = OmegaConf.to_container(block, resolve=True)
        except Exception:  # noqa: BLE001 - a broken interpolation: verl's own conversion of the block reports it
            distillation = OmegaConf.to_container(block, resolve=False)
    trust = bool(section(config, "actor_rollout_ref.model.trust_remote_code"))
    return loop_teachers(distillation, trust_remote_code=trust)


def _check_teachers(config: DictConfig, mopd_config: MOPDConfig, problems: list[str], warnings: list[str],
                    head: bool = False) -> None:
    from verl_mopd.teachers.config import validate_platforms, validate_temperature
    from verl_mopd.teachers.verl_loop import ROUTES_EVERY_SAMPLE

    if mopd_config.teachers and bool(section(config, "distillation.enabled")):
        problems.append(
            f"mopd.teachers {mopd_config.platforms} run as worker groups, and distillation.enabled=true starts verl's "
            "teacher loop too: one teacher system per run. Keep mopd.teachers (hf/megatron) with "
            "distillation.enabled=false, or declare the teachers only in distillation.teacher_models"
        )
        return
    teachers = run_teachers(config, mopd_config)  # mopd.teachers, else verl's loop
    loop = {} if mopd_config.teachers else teachers
    if not teachers:
        problems.append(
            "no teacher: mopd.teachers is empty and distillation.enabled=false: configure one teacher per platform "
            "(mopd.teachers.<platform>.model_path, backend) or verl's teacher loop (distillation.enabled=true, "
            "distillation.teacher_models)"
        )
        return
    problems.extend(validate_temperature(section(config, "actor_rollout_ref.rollout.temperature")))
    if loop and list(loop) != [ROUTES_EVERY_SAMPLE]:
        key = section(config, "distillation.teacher_key")
        if key != mopd_config.routing_key:
            problems.append(
                f"distillation.teacher_key={key!r} but mopd.routing_key={mopd_config.routing_key!r}: verl's teacher loop "
                "routes by one column and the gate, the metrics and the quotas by the other; set "
                "distillation.teacher_key: ${mopd.routing_key}"
            )
    if list(teachers) != [ROUTES_EVERY_SAMPLE]:  # verl's single teacher scores every sample
        for split_name, key in (("train", "data.train_files"), ("val", "data.val_files")):
            platforms = _data_platforms(section(config, key), mopd_config.routing_key, key, problems)
            if platforms is not None:
                problems.extend(validate_platforms(platforms, teachers, split_name, mopd_config.routing_key))
    actor_gpus = int(section(config, "trainer.n_gpus_per_node")) * int(section(config, "trainer.nnodes"))
    for platform, t in mopd_config.teachers.items():
        if t.placement == "colocated" and t.world_size > actor_gpus:
            problems.append(
                f"mopd.teachers.{platform}: colocated with the actor but needs {t.world_size} devices "
                f"(n_gpus_per_node*nnodes) while trainer.n_gpus_per_node*trainer.nnodes={actor_gpus}"
            )
        if t.placement == "colocated" and actor_gpus % t.world_size:
            problems.append(
                f"mopd.teachers.{platform}: a colocated teacher's {t.world_size} devices must divide the actor "
                f"pool of {actor_gpus}"
            )
        longest = _longest_sequence(config)
        if t.backend == "megatron" and longest is not None and t.micro_batch_tokens < longest:
            problems.append(
                f"mopd.teachers.{platform}.micro_batch_tokens={t.micro_batch_tokens} is below the longest sequence, "
                f"data.max_prompt_length + data.max_response_length = {longest}: verl's Megatron engine packs "
                "micro-batches of at most micro_batch_tokens tokens and asserts every sequence fits "
                f"(verl.utils.seqlen_balancing); set it >= {longest}"
            )
    if mopd_config.teachers:  # which colocated teachers run together, where their weights wait (teachers.placement)
        from verl_mopd.teachers.placement import run_plan

        problems.extend(run_plan(config, mopd_config.teachers).problems)
    for t in teachers.values():
        _check_path(t.model_path_key, t.model_path, problems, warnings, head)
    _check_teachers_match_student(config, teachers, problems, warnings, in_workers=bool(mopd_config.teachers))


def _longest_sequence(config: DictConfig) -> int | None:
    prompt, response = section(config, "data.max_prompt_length"), section(config, "data.max_response_length")
    if isinstance(prompt, int) and isinstance(response, int):
        return prompt + response
    return None


def _check_teachers_match_student(config: DictConfig, teachers: dict[str, Any], problems: list[str],
                                  warnings: list[str], *, in_workers: bool) -> None:
    """Each teacher's tokenizer (vocabulary, special ids) and ``config.json`` (image token ids,
    ``vision_config`` patch sizes) against the student's, for the checkpoints that are local folders
    here (tokenizers and configs only, no weights). ``in_workers``: the teachers are ``hf``/``megatron``
    workers, which the trainer compares again when it builds them
    (``verl_mopd.trainer.hooks.build_worker_teachers``); verl's teacher loop is compared only here."""
    from verl_mopd.teachers.config import compare_with_student

    later = ("the trainer compares it when it builds the teachers" if in_workers
             else "verl's teacher loop is not compared at run time")
    student = section(config, "actor_rollout_ref.model.path")
    tokenizer = section(config, "actor_rollout_ref.model.tokenizer_path")
    if not (isinstance(student, str) and os.path.isdir(student)) or (tokenizer and not os.path.isdir(str(tokenizer))):
        warnings.append(
            f"teacher tokenizers and vision configs not compared with the student's: actor_rollout_ref.model.path="
            f"{student}{f' (tokenizer_path={tokenizer})' if tokenizer else ''} is not a local folder here; {later}"
        )
        return
    local = {p: t for p, t in teachers.items() if os.path.isdir(t.model_path)}
    for t in sorted((t for p, t in teachers.items() if p not in local), key=lambda t: t.model_path_key):
        warnings.append(f"{t.model_path_key.removesuffix('.model_path')}: tokenizer and vision config not compared "
                        f"with the student's (model_path={t.model_path} is not a local folder here; {later})")
    if local:
        problems.extend(compare_with_student(
            local, student, student_tokenizer_path=tokenizer or None,
            trust_remote_code=bool(section(config, "actor_rollout_ref.model.trust_remote_code"))))


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
        try:
            names = pq.read_schema(path).names
        except Exception as exc:  # noqa: BLE001 - ArrowInvalid and friends, reported with the file
            problems.append(f"{key}: {path} is not a readable parquet file ({str(exc).splitlines()[0]})")
            return None
        if routing_key not in names:
            problems.append(
                f"{key}: {path} has no top-level column {routing_key!r} (mopd.routing_key); "
                "verl-mopd prepare writes it"
            )
            return None
        values |= {str(v) for v in pq.read_table(path, columns=[routing_key]).column(0).to_pylist()}
    return values


#: the quota sampler class each trainer mode runs (verl: ReplayBuffer for sync, ReplayBufferAsync else)
QUOTA_SAMPLERS = {"sync": "QuotaReplayBuffer", "async": "QuotaReplayBufferAsync"}


def _check_sampler(config: DictConfig, mopd_config: MOPDConfig | None, problems: list[str]) -> None:
    """Our quota sampler: its kwargs (BatchingConfig), its domains against the teachers, and what it
    cannot serve (docs/batching.md, "Differences from verl's samplers")."""
    sampler = section(config, "trainer.v1.sampler")
    custom = (sampler or {}).get("custom_sampler", {}) or {}
    path = str(custom.get("path") or "")
    if not path.endswith("verl_mopd.batching.sampler"):
        return
    from verl_mopd.batching.sampler import BatchingConfig

    kwargs = OmegaConf.to_container(sampler.get("sampler_kwargs") or {}, resolve=True)
    try:
        batching = BatchingConfig.from_sampler_kwargs(kwargs)
    except (ValueError, TypeError) as exc:
        problems.extend(f"trainer.v1.sampler.sampler_kwargs: {e}" for e in _sentences(exc))
        return
    if mopd_config is not None and batching.domain_key != mopd_config.routing_key:
        written = "domain_key" in kwargs
        problems.append(
            f"trainer.v1.sampler.sampler_kwargs.domain_key={batching.domain_key!r}"
            f"{'' if written else ' (its default)'} but mopd.routing_key={mopd_config.routing_key!r}: the quotas would count "
            "one column while the teachers, the gate and the metrics read the other; set "
            "domain_key: ${mopd.routing_key}"
        )
    from verl.trainer.ppo.v1.replay_buffer import FILTER_GROUPS_REWARD_METRIC

    problems.extend(p for p in [metric_problem(config, "trainer.v1.sampler.sampler_kwargs.filter_metric",
                                               batching.filter_metric, (FILTER_GROUPS_REWARD_METRIC,))] if p)
    mode = str(section(config, "trainer.v1.trainer_mode"))
    kind = "sync" if mode.removeprefix("mopd_") == "sync" else "async"
    name = custom.get("name")
    if name != QUOTA_SAMPLERS[kind]:
        allowed = f"allowed with trainer.v1.trainer_mode={mode}: {QUOTA_SAMPLERS[kind]}"
        what = ("not a sampler of verl_mopd.batching.sampler" if name not in QUOTA_SAMPLERS.values()
                else f"the {'async' if kind == 'sync' else 'sync'} trainers' sampler")
        problems.append(f"trainer.v1.sampler.custom_sampler.name={name}: {what}; {allowed}")
    n = section(config, "actor_rollout_ref.rollout.n")
    if isinstance(n, int) and n < batching.min_valid_samples:
        problems.append(
            f"actor_rollout_ref.rollout.n={n}: the quota sampler cannot serve groups of fewer than "
            f"min_valid_samples={batching.min_valid_samples} valid rollouts (GRPO needs a std), so every group "
            f"would be dropped and no batch could fill; allowed: n >= {batching.min_valid_samples}, or verl's own "
            "sampler (no trainer.v1.sampler.custom_sampler) for n = 1"
        )
    if kind == "sync":
        filt = section(config, "algorithm.filter_groups")
        exact = bool(filt is not None and filt.get("enable", False)) or bool(
            (sampler or {}).get("sync_refill_failed_groups", False))
        gen = section(config, "data.gen_batch_size") or section(config, "data.train_batch_size")
        if not exact and gen != 1:
            problems.append(
                f"data.gen_batch_size={section(config, 'data.gen_batch_size')} (so verl draws prompts {gen} at a "
                "time) with the sync quota sampler and algorithm.filter_groups.enable=false: the sampler refills "
                "any number of prompts, and verl's _next_train_batch refuses a count that is not a multiple of "
                "it; allowed: algorithm.filter_groups.enable=true (verl then draws one prompt at a time) or "
                "data.gen_batch_size=1"
            )
    from verl_mopd.teachers.verl_loop import ROUTES_EVERY_SAMPLE

    teachers = set(run_teachers(config, mopd_config)) - {ROUTES_EVERY_SAMPLE} if mopd_config is not None else set()
    if teachers and set(batching.quota.shares) != teachers:
        problems.append(
            f"trainer.v1.sampler.sampler_kwargs.quota.shares has domains {sorted(batching.quota.shares)} but "
            f"the teachers serve {sorted(teachers)}: give every {mopd_config.routing_key} value a share"
        )


#: ``org/name``: what a model path that is a Hugging Face Hub id looks like (and a relative one-slash path)
_HUB_ID = re.compile(r"[A-Za-z0-9][\w.-]*/[\w.-]+")


def _check_path(key: str, value: Any, problems: list[str], warnings: list[str], head: bool = False) -> None:
    """A local path missing here: a warning on a laptop ("fine if it exists on the cluster"); with ``head`` (this is
    the cluster's head node, where the run starts: ``validate-recipe --head``) an error, except for a model path
    that reads as a Hugging Face Hub id (``org/name``), which stays a warning."""
    if value is None or (isinstance(value, str) and not value.strip()):
        problems.append(f"{key} is not set: give a path")
        return
    values = list(value) if isinstance(value, list | tuple) else [value]
    for v in values:
        v = str(v)
        if "/" in v and not v.startswith(("hf://", "s3://", "gs://", "hdfs://")) and not os.path.exists(v):
            if not head:
                warnings.append(f"{key}={v} does not exist on this machine (fine if it exists on the cluster)")
            elif key.endswith(("model_path", "model.path")) and _HUB_ID.fullmatch(v):
                warnings.append(f"{key}={v} does not exist on this machine, the head node: fine only if it is a "
                                "Hugging Face Hub id")
            else:
                problems.append(f"{key}={v} does not exist on this machine, the cluster's head node (--head), "
                                "where the run starts")


# ---------------------------------------------------------------- run numbers


def _finite(config: DictConfig, key: str) -> Any:
    value = section(config, key)
    if isinstance(value, int | float) and not isinstance(value, bool) and not math.isfinite(value):
        return value
    return None


def _check_run_numbers(config: DictConfig, problems: list[str], warnings: list[str]) -> None:
    """Values that pass the dataclasses but make the run NaN or stall on the cluster."""
    key = "distillation.distillation_loss.distillation_loss_coef"  # mopd.tau_kl's is MOPDConfig's own check
    bad = _finite(config, key)
    if bad is not None:
        problems.append(f"{key}={bad}: must be a finite number")
    if section(config, "distillation.distillation_loss.loss_mode") == "mopd_k3":
        above = section(config, "distillation.distillation_loss.k3_linear_above")
        if isinstance(above, int | float) and math.isinf(above):
            warnings.append(
                "distillation.distillation_loss.k3_linear_above=inf: the plain K3, whose gradient e^d - 1 is "
                "unbounded where the student is far below the teacher (the default 3.0 keeps it bounded)"
            )


def validate(config: DictConfig, *, head: bool = False) -> tuple[list[str], list[str]]:
    """All problems (the run would fail or be wrong) and warnings (probably not what you want).

    ``head``: this machine is the cluster's head node, where the run starts, so a local path (the student, the
    data, each teacher) must exist here; elsewhere a missing path is a warning (``_check_path``)."""
    from verl.trainer.distillation.losses import DISTILLATION_LOSS_REGISTRY
    from verl.trainer.ppo.utils import need_critic, need_reference_policy
    from verl.utils.config import validate_config

    from verl_mopd.verl_loss import register_loss

    register_loss()
    problems: list[str] = code_target_problems(config)
    warnings: list[str] = []
    if problems or not _check_cluster(config, problems):  # nothing below may run recipe code or divide by None
        return problems, warnings

    loss_mode = section(config, "distillation.distillation_loss.loss_mode")
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
            except (AssertionError, ValueError, TypeError) as exc:
                problems.append(f"verl validate_config: {exc}")

    mopd_config = _check_mopd(config, problems, warnings)
    if mopd_config is not None:
        _check_teachers(config, mopd_config, problems, warnings, head)
        _check_placement_and_mode(config, problems)
    _check_sampler(config, mopd_config, problems)
    _check_run_numbers(config, problems, warnings)
    problems.extend(checkpoint_dir_problems(config))
    for key in ("actor_rollout_ref.model.path", "data.train_files", "data.val_files"):
        _check_path(key, section(config, key), problems, warnings, head)
    return problems, warnings


def is_sft_recipe(config: DictConfig) -> bool:
    """Stage-1 recipes run verl's SFT trainer (no rollout, no mopd block)."""
    return section(config, "actor_rollout_ref") is None and section(config, "data.messages_key") is not None


def validate_sft(config: DictConfig, *, head: bool = False) -> tuple[list[str], list[str]]:
    """Stage-1 (verl SFT trainer) recipes: convert verl's dataclasses, check paths (``head``: as :func:`validate`)
    and GPU counts."""
    problems: list[str] = code_target_problems(config)
    warnings: list[str] = []
    if problems:
        return problems, warnings
    sections = ["engine", "optim", "checkpoint"]
    model_path = section(config, "model.path")
    if model_path and os.path.exists(str(model_path)):
        sections.append("model")  # HFModelConfig reads the checkpoint's config.json
    for path in sections:
        _convert(config, path, problems)
    for key in ("model.path", "data.train_files"):
        _check_path(key, section(config, key), problems, warnings, head)
    problems.extend(checkpoint_dir_problems(config))
    engine = section(config, "engine")
    gpus = int(section(config, "trainer.n_gpus_per_node") or 0) * int(section(config, "trainer.nnodes") or 0)
    if engine is not None and gpus:
        mp = int(engine.get("tensor_model_parallel_size", 1)) * int(engine.get("pipeline_model_parallel_size", 1))
        mp *= int(engine.get("context_parallel_size", 1))
        if gpus % mp:
            problems.append(
                f"engine TP*PP*CP={mp} does not divide trainer.n_gpus_per_node*trainer.nnodes={gpus}"
            )
    return problems, warnings


def _not_a_trainer_config(config: DictConfig) -> str | None:
    missing = [k for k in ("data", "actor_rollout_ref", "critic", "algorithm", "trainer") if k not in config]
    if not missing:
        return None
    return (f"not a verl trainer config: no {', '.join(missing)} section; a recipe lists verl's ppo_trainer "
            "(or verl_mopd's mopd_base) in its defaults")


def validate_composed(config: DictConfig, *, head: bool = False) -> tuple[list[str], list[str]]:
    """``(problems, warnings)`` of any composed recipe: a stage-1 SFT recipe (:func:`validate_sft`), a
    config that is no trainer config (one problem), or a trainer recipe (:func:`validate`). What
    ``verl-mopd validate-recipe`` and the launch callback (``verl_mopd.checks.launch``) both run."""
    if is_sft_recipe(config):
        return validate_sft(config, head=head)
    not_trainer = _not_a_trainer_config(config)
    if not_trainer:
        return [not_trainer], []
    return validate(config, head=head)
