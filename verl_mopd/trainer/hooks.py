"""Public MOPD hooks for any verl v1 trainer: the calls our ``mopd_*`` trainers are built from.

A verl 0.9.1 v1 trainer (a subclass of ``PPOTrainerSync``, ``PPOTrainerSeparateAsync`` or
``PPOTrainerColocateAsync`` registered with verl's ``register_trainer``) gets MOPD from four
calls in three of verl's own hooks. ``verl_mopd.trainer.mopd_trainer`` makes exactly these
calls, and so does ``examples/custom_trainer/my_trainer.py``::

    from verl_mopd.trainer import hooks

    def __init__(self, config):
        hooks.set_verl_trainer_mode(config, "sync")                          # before verl's __init__
        super().__init__(config)
        self.mopd_config = hooks.mopd_config_from(config)                    # the mopd block (unknown keys: error)

    def on_init_end(self):                                                    # worker groups exist
        self.mopd_teachers = hooks.setup_teachers_and_loss(self)
        super().on_init_end()

    def _compute_advantage(self, batch, metrics):                             # rewards are stored
        metrics.update(hooks.write_gate_and_teacher_logprobs(self, batch, self.mopd_config, self.mopd_teachers))
        return super()._compute_advantage(batch, metrics)                    # verl's GRPO

Why there: ``_compute_advantage`` is the first driver hook of a step that sees the whole step
batch (whole GRPO groups) after verl has stored rewards (``rm_scores``, reward extras) and
``old_log_probs``, and before the actor update; the workers later shuffle and split micro-batches,
so no loss micro-batch sees a whole group. ``on_init_end`` runs once the actor's worker group and
resource pools exist.

Teachers, one of two systems per run:

- ``mopd.teachers.<routing value>`` (``backend: hf`` / ``megatron``): one verl worker group per
  teacher (``PlatformTeacherGroup``), scored on the driver each step (only samples whose KL is on);
  ``distillation.enabled`` stays false, so the actor is given verl's ``distillation_ppo_loss`` with
  ``loss_mode=mopd_k3`` through ``set_loss_fn``.
- verl's own teacher loop, declared only in verl's block (``distillation.enabled: true``,
  ``distillation.teacher_models``, routed by ``distillation.teacher_key``): inference servers score
  every sample during rollout, and verl's actor worker builds ``distillation_ppo_loss`` from
  ``distillation.distillation_loss`` itself; the trainer only writes the gate.

Why the mode line: verl 0.9.1's ``PPOTrainer`` branches on the *name* in ``trainer.v1.trainer_mode``
(``"sync"`` or not: replay buffer class, refill, checkpoint resume, rollout submission), so a trainer
registered under a name of its own would silently run with the async replay buffer.

The building blocks (``mopd_config_from``, ``distillation_loss_fn``,
``build_worker_teachers``, ``think_end_token_id``, ``score_teachers``, and ``write_reward_gate`` in
``verl_mopd.trainer.gate``) are public too, for trainers that need them apart. Nothing here holds
state. Imports of verl and of our config are deferred to the calls: ``mopd_trainer`` imports this
module while verl's ``verl.trainer.ppo.v1`` package finishes importing (the plugin's hook), when
verl is not yet usable in full.
"""

from __future__ import annotations

import os
from functools import partial
from typing import Any

from omegaconf import DictConfig, OmegaConf, open_dict

from verl_mopd.losses import KL_MASK_KEY, KL_START_KEY, TEACHER_LOGPROBS_KEY

__all__ = [
    "actor_resource_pool",
    "build_worker_teachers",
    "compare_weight_stats",
    "distillation_loss_fn",
    "dump_actor_state",
    "dump_step",
    "engine_weight_stats",
    "mopd_config_from",
    "score_teachers",
    "set_verl_trainer_mode",
    "setup_teachers_and_loss",
    "think_end_token_id",
    "write_gate_and_teacher_logprobs",
]

# -- __init__ ------------------------------------------------------------------------------------

VERL_TRAINER_MODES = ("sync", "separate_async", "colocate_async")


def set_verl_trainer_mode(config: DictConfig, verl_mode: str) -> str:
    """Set ``trainer.v1.trainer_mode`` to the verl mode the trainer subclasses; returns the name it had.

    Call it in ``__init__`` before verl's: verl's ``PPOTrainer`` reads the mode by name (see the
    module docstring). verl's TaskRunner has already picked the registered class by then.
    """
    if verl_mode not in VERL_TRAINER_MODES:
        raise ValueError(
            f"verl_mode={verl_mode!r}: verl 0.9.1's v1 trainer modes are {list(VERL_TRAINER_MODES)}"
        )
    registered = config.trainer.v1.trainer_mode
    with open_dict(config):
        config.trainer.v1.trainer_mode = verl_mode
    return registered


# -- config readers ------------------------------------------------------------------------------


def mopd_config_from(config: DictConfig):
    """The run's whole ``mopd`` block as ``verl_mopd.config.MOPDConfig`` (the gate and the teachers).

    Unknown and removed keys are errors naming the key (``MOPDConfig.from_mapping``), on every
    launch path: our trainers call this in ``__init__``, whichever entry point started them.
    """
    from verl_mopd.config import MOPDConfig

    return MOPDConfig.from_mapping(config.get("mopd", None))


def distillation_loss_fn(config: DictConfig):
    """verl's ``distillation_ppo_loss`` bound to the run's actor and distillation configs.

    What verl's ``ActorRolloutRefWorker`` builds when ``distillation.enabled`` is true; given to
    the actor with ``set_loss_fn`` when teachers run as worker groups (``distillation.enabled``
    false, so verl starts no teacher servers). Through
    ``verl_mopd.verl_loss.distillation_ppo_loss_on_any_micro_batch``, verl's function plus a
    micro-batch of padding rows only. Picklable: a module-level partial.
    """
    from verl.utils.config import omega_conf_to_dataclass
    from verl.workers.config import DistillationConfig, DistillationLossConfig

    from verl_mopd.verl_loss import MOPD_LOSS_MODE, distillation_ppo_loss_on_any_micro_batch

    actor_config = omega_conf_to_dataclass(config.actor_rollout_ref.actor)
    loss_config = omega_conf_to_dataclass(config.distillation.distillation_loss)
    if not isinstance(loss_config, DistillationLossConfig) or loss_config.loss_mode != MOPD_LOSS_MODE:
        raise ValueError(
            f"worker-backend teachers need distillation.distillation_loss.loss_mode={MOPD_LOSS_MODE}, got "
            f"{getattr(loss_config, 'loss_mode', loss_config)!r}"
        )
    distillation_config = DistillationConfig(enabled=False, distillation_loss=loss_config)
    return partial(distillation_ppo_loss_on_any_micro_batch, config=actor_config, distillation_config=distillation_config)


def think_end_token_id(tokenizer, mopd_config) -> int | None:
    """Id of ``mopd_config.think_end_token`` in the student's tokenizer with ``kl_skip_thought``, else None."""
    if not mopd_config.kl_skip_thought:
        return None
    token = mopd_config.think_end_token
    token_id = tokenizer.convert_tokens_to_ids(token)
    if token_id is None or token_id == getattr(tokenizer, "unk_token_id", None):
        raise ValueError(f"mopd.think_end_token={token!r} is not a single token of the student's tokenizer")
    return int(token_id)


# -- on_init_end ---------------------------------------------------------------------------------


def actor_resource_pool(trainer):
    """The actor's ``RayResourcePool`` (where ``placement: colocated`` teachers go)."""
    from verl.trainer.ppo.utils import Role

    for role in (Role.ActorRolloutRef, Role.ActorRollout, Role.Actor):
        if role in trainer.role_worker_mapping:
            return trainer.resource_pool_manager.get_resource_pool(role)
    raise RuntimeError(f"no actor role in {list(trainer.role_worker_mapping)}")


def build_worker_teachers(trainer):
    """The ``PlatformTeacherGroup`` of the run's ``mopd.teachers`` (``hf`` / ``megatron``, models
    loaded), or None without any (verl's teacher loop, ``distillation.teacher_models``, or none).

    Raises ``ConfigError`` before any weights load when a teacher's tokenizer or vision
    config differs from the student's (``verl_mopd.teachers.config.compare_with_student``)."""
    teachers = mopd_config_from(trainer.config)
    if not teachers.teachers:
        return None
    from verl_mopd.teachers.group import PlatformTeacherGroup
    from verl_mopd.errors import ConfigError
    from verl_mopd.teachers.config import compare_with_student

    # the teachers score the student's token ids and pixel patches: refuse a mismatch before any
    # weights load (tokenizers and config.json only)
    model = trainer.config.actor_rollout_ref.model
    errors = compare_with_student(teachers.teachers, model.path,
                                  student_tokenizer_path=model.get("tokenizer_path") or None,
                                  trust_remote_code=bool(model.get("trust_remote_code", False)))
    if errors:
        raise ConfigError(errors, "mopd.teachers config")
    colocated = any(t.placement == "colocated" for t in teachers.teachers.values())
    return PlatformTeacherGroup.build(teachers, use_gpu=trainer.config.trainer.device != "cpu",
                                      colocated_pool=actor_resource_pool(trainer) if colocated else None,
                                      run_config=trainer.config)


def setup_teachers_and_loss(trainer):
    """``on_init_end``: build the worker-backend teachers and give the actor the MOPD loss.

    With worker teachers the actor gets :func:`distillation_loss_fn` through verl's
    ``set_loss_fn`` (``distillation.enabled`` is false, so verl's worker would otherwise train
    with its plain PPO loss). With verl's teacher loop nothing is changed: ``distillation.enabled`` is
    true and verl's worker already builds ``distillation_ppo_loss`` from
    ``distillation.distillation_loss``. Without teachers there is no teacher KL to add.

    Returns:
        the teacher group, or None (pass it to :func:`write_gate_and_teacher_logprobs`).
    """
    group = build_worker_teachers(trainer)
    if group is not None:
        trainer.actor_rollout_wg.set_loss_fn(distillation_loss_fn(trainer.config))
    return group


# -- _compute_advantage --------------------------------------------------------------------------


def write_gate_and_teacher_logprobs(trainer, batch, mopd_config, teachers=None) -> dict[str, Any]:
    """Per step, before verl's advantage: store the reward gate, then the worker teachers' log-probs.

    1. ``write_reward_gate``: ``reward_gate`` over the whole step batch (groups by
       ``mopd_config.group_key``, verl's ``uid``) on ``mopd_config.gate_metric``, stored per sample
       as ``mopd_kl_mask`` (and ``mopd_kl_start`` with ``kl_skip_thought``) in TransferQueue, where
       the loss reads it.
    2. With a teacher group: ``score_teachers`` scores the samples whose KL is on, each with the
       teacher of its routing value, and stores ``teacher_logprobs`` in verl's layout.

    Args:
        trainer: the verl v1 trainer (its ``tokenizer`` is read only with ``kl_skip_thought``).
        batch: verl's ``KVBatchMeta`` of the step.
        mopd_config: the run's ``MOPDConfig`` (:func:`mopd_config_from`).
        teachers: the group from :func:`setup_teachers_and_loss`, or None.

    Returns:
        the gate's and the teachers' metrics, for verl's tracking.
    """
    from verl.trainer.ppo.v1 import trainer_base  # its TransferQueue client, the one verl's code uses

    from verl_mopd.trainer.gate import write_reward_gate

    tq = trainer_base.tq
    token_id = think_end_token_id(trainer.tokenizer, mopd_config) if mopd_config.kl_skip_thought else None
    # a response of this length without </think> was cut off inside its thought: no KL on it
    limit = OmegaConf.select(trainer.config, "actor_rollout_ref.rollout.response_length") if token_id is not None else None
    metrics = write_reward_gate(batch, mopd_config, tq=tq, think_end_token_id=token_id, max_response_length=limit)
    if teachers is not None:
        metrics.update(score_teachers(teachers, batch, tq))
    return metrics


def score_teachers(group, batch, tq) -> dict:
    """Score a step's stored samples with their platforms' teachers; ``teacher_logprobs`` is stored
    for every sample in the layout verl's distillation loss reads.

    The gate ``mopd_kl_mask`` is already stored, so gated-off samples go to no teacher. The driver
    hands each teacher group a ``KVBatchMeta`` of its rows; the workers fetch their shards (images
    included) from TransferQueue and store their results themselves
    (``PlatformTeacherGroup.score_transfer_queue``), as verl's own ``compute_log_prob`` does.
    """
    return group.score_transfer_queue(batch, tq)


# -- diagnostics -----------------------------------------------------------------------------------

#: a folder: with it set, the ``mopd_*`` trainers write every step's samples there (:func:`dump_step`)
STEP_DUMP_ENV = "VERL_MOPD_STEP_DUMP"
#: the per-sample fields :func:`dump_step` reads (those a sample lacks are skipped by TransferQueue)
DUMP_FIELDS = ("uid", "input_ids", "responses", "response_mask", "old_log_probs", "rollout_log_probs",
               TEACHER_LOGPROBS_KEY, KL_MASK_KEY, KL_START_KEY, "rollout_is_weights", "advantages", "rm_scores",
               "multi_modal_inputs")


def dump_step(batch, tq, folder: str, *, routing_key: str = "platform", step: int | None = None) -> str:
    """Diagnostic: save every sample of a step as verl's actor will read it, after the advantages.

    ``verl-mopd smoke`` sets ``VERL_MOPD_STEP_DUMP`` and recomputes the teachers' log-probs and the
    loss's K3 from these rows. Per sample (response-aligned tensors of length ``r``): ``key``,
    ``padding``, ``platform``, ``uid``, ``input_ids`` (prompt + response), ``student`` (verl's
    ``old_log_probs``), ``rollout`` (the rollout engine's ``rollout_log_probs``), ``teacher`` (the stored
    ``teacher_logprobs`` cut to the response, as verl's loss reads them), ``gate`` (``mopd_kl_mask``),
    ``kl_start``, ``rollout_is_weights``, ``advantages``, ``score`` (the summed ``rm_scores``) and
    ``multi_modal_inputs``. Returns the file written
    (``step_<N>.pt``, or a timestamped name without ``step``).
    """
    import time

    import torch

    fields = [routing_key, *DUMP_FIELDS]
    data = tq.kv_batch_get(keys=batch.keys, partition_id=batch.partition_id, select_fields=fields)
    have = set(data.keys())
    column = {name: (list(data[name]) if name in (routing_key, "uid", "multi_modal_inputs") else data[name].unbind(0))
              for name in fields if name in have}
    rows = []
    for i, key in enumerate(batch.keys):
        seq, resp = column["input_ids"][i], column["responses"][i]
        p, r = len(seq) - len(resp), len(resp)

        def response(name, i=i, r=r):
            return column[name][i][:r].clone() if name in column else None

        teacher = column[TEACHER_LOGPROBS_KEY][i][p - 1 : p - 1 + r, 0].clone() if TEACHER_LOGPROBS_KEY in column else None
        rows.append({
            "key": key,
            "padding": bool(batch.tags and batch.tags[i].get("is_padding", False)),
            "platform": str(column[routing_key][i]) if routing_key in column else None,
            "uid": str(column["uid"][i]) if "uid" in column else None,
            "input_ids": seq.clone(),
            "response_mask": response("response_mask"),
            "student": response("old_log_probs"),
            "rollout": response("rollout_log_probs"),
            "teacher": teacher,
            "gate": float(column[KL_MASK_KEY][i]) if KL_MASK_KEY in column else None,
            "kl_start": int(column[KL_START_KEY][i]) if KL_START_KEY in column else None,
            "rollout_is_weights": response("rollout_is_weights"),
            "advantages": response("advantages"),
            "score": float(column["rm_scores"][i].sum()) if "rm_scores" in column else None,
            "multi_modal_inputs": column["multi_modal_inputs"][i] if "multi_modal_inputs" in column else None,
        })
    os.makedirs(folder, exist_ok=True)
    path = os.path.join(folder, f"step_{step}.pt" if step is not None else f"step_{time.time_ns()}.pt")
    torch.save({"step": step, "rows": rows}, path)
    return path


#: set by ``verl-mopd smoke``: the CPU harness's hf rollout logs each weight sync there
#: (``verl_mopd.testing.cpu.rollout``), and the ``mopd_*`` trainers call :func:`dump_actor_state` after each
ROLLOUT_SYNC_LOG_ENV = "VERL_MOPD_ROLLOUT_SYNC_LOG"
#: the file :func:`dump_actor_state` appends to, in the ``VERL_MOPD_STEP_DUMP`` folder
ACTOR_STATE_FILE = "actor_state.jsonl"
#: relative tolerance of :func:`compare_weight_stats` (float64 sums of the same fp32 values in another order)
WEIGHT_STATS_TOLERANCE = 1e-9


def weight_stats(tensor) -> list[float]:
    """A layout-free checksum of one weight: ``[numel, sum, sum |w|, sum w^2]`` in float64.

    A TP shard, a fused or a transposed copy holds the same elements, so the stats of the pieces add up to
    the whole's (up to float64 rounding): an actor's parameters can be compared with a rollout's weights of
    another layout (Megatron's fused QKV against transformers' q/k/v) without converting names or shapes.
    """
    import torch

    x = tensor.detach().to("cpu", torch.float64).reshape(-1)
    return [float(x.numel()), float(x.sum()), float(x.abs().sum()), float((x * x).sum())]


def add_stats(stats) -> list[float]:
    """The elementwise sum of :func:`weight_stats` lists (the checksum of their weights together)."""
    total = [0.0, 0.0, 0.0, 0.0]
    for one in stats:
        total = [a + b for a, b in zip(total, one, strict=True)]
    return total


def engine_weight_stats(engine) -> dict:
    """One rank's view of a verl training engine's own parameters (not its export for the rollout).

    verl's FSDP engines (``engine.module``, one module): every parameter whole (a DTensor is gathered with
    ``full_tensor()``, a collective: call it on every rank). verl's Megatron engines (``engine.module``, a list
    of model chunks): this rank's shard of each parameter, with ``sharded`` true for those split over TP
    (Megatron's ``tensor_model_parallel`` attribute) and the rank's TP / DP / PP / CP coordinates, for
    :func:`combine_weight_stats`.

    Returns:
        ``{"layout": "full" | "megatron", "tp_rank", "dp_rank", "pp_rank", "cp_rank",
        "params": {name: [*weight_stats, sharded]}}``.
    """
    modules = engine.module if isinstance(engine.module, list | tuple) else [engine.module]
    megatron = isinstance(engine.module, list | tuple)
    record = {"layout": "megatron" if megatron else "full", "tp_rank": 0, "dp_rank": 0, "pp_rank": 0, "cp_rank": 0}
    if megatron:
        from megatron.core import parallel_state as mpu

        record.update(tp_rank=mpu.get_tensor_model_parallel_rank(), dp_rank=mpu.get_data_parallel_rank(),
                      pp_rank=mpu.get_pipeline_model_parallel_rank(), cp_rank=mpu.get_context_parallel_rank())
    params = {}
    for chunk, module in enumerate(modules):
        for name, parameter in module.named_parameters():
            tensor = parameter.full_tensor() if hasattr(parameter, "full_tensor") else parameter
            key = f"{chunk}.{name}" if len(modules) > 1 else name
            params[key] = [*weight_stats(tensor), bool(getattr(parameter, "tensor_model_parallel", False))]
    record["params"] = params
    return record


def combine_weight_stats(records: list[dict]) -> dict[str, list[float]]:
    """The whole model's per-parameter stats from every rank's :func:`engine_weight_stats`.

    ``full`` layout: the first record (each rank holds every parameter whole). ``megatron``: of the DP and
    CP rank-0 replica, a TP-split parameter is the sum over the TP ranks' shards, a TP-replicated one is
    TP rank 0's (names are prefixed with the PP rank; they are the engine's own names, not HF's).
    """
    if not records:
        raise ValueError("no rank reported its parameters")
    if records[0]["layout"] == "full":
        return {name: values[:4] for name, values in records[0]["params"].items()}
    combined: dict[str, list[float]] = {}
    for record in records:
        if record["dp_rank"] or record["cp_rank"]:
            continue
        for name, (*values, sharded) in record["params"].items():
            if not sharded and record["tp_rank"]:
                continue
            key = f"pp{record['pp_rank']}.{name}"
            combined[key] = add_stats([combined.get(key, [0.0] * 4), values])
    return combined


def compare_weight_stats(actor: dict[str, list[float]], rollout: dict[str, list[float]],
                         tolerance: float = WEIGHT_STATS_TOLERANCE) -> tuple[bool, str]:
    """The actor's parameters (:func:`combine_weight_stats`) against the rollout's (``{name: weight_stats}``).

    Parameters of the same name and size are compared one by one; the others (another layout: Megatron's
    names) together, through the sums of their stats. Equal when the element counts are equal and each sum
    differs by at most ``tolerance`` times the sum of |w| (sum, sum |w|) or of w^2 (sum w^2).
    """
    def differs(a: list[float], b: list[float]) -> bool:
        scale_abs, scale_sq = max(a[2], b[2], 1e-30), max(a[3], b[3], 1e-30)
        return (a[0] != b[0] or abs(a[1] - b[1]) > tolerance * scale_abs or abs(a[2] - b[2]) > tolerance * scale_abs
                or abs(a[3] - b[3]) > tolerance * scale_sq)

    named = [n for n in actor if n in rollout and actor[n][0] == rollout[n][0]]
    wrong = [n for n in named if differs(actor[n], rollout[n])]
    rest_actor = add_stats(v for n, v in actor.items() if n not in named)
    rest_rollout = add_stats(v for n, v in rollout.items() if n not in named)
    rest_wrong = differs(rest_actor, rest_rollout)
    detail = (f"{len(named)} tensors by name ({len(wrong)} differ{': ' + ', '.join(wrong[:3]) if wrong else ''}); "
              f"the other {len(actor) - len(named)} actor / {len(rollout) - len(named)} rollout tensors together: "
              f"{rest_actor[0]:.0f} / {rest_rollout[0]:.0f} elements, sum w^2 {rest_actor[3]:.9g} / {rest_rollout[3]:.9g} "
              f"(relative {abs(rest_actor[3] - rest_rollout[3]) / max(rest_actor[3], rest_rollout[3], 1e-30):.1e})")
    return not wrong and not rest_wrong and bool(actor) and bool(rollout), detail


def _actor_weight_stats_on_worker(instance) -> dict | None:
    """Run in a verl actor worker process (``__ray_call__``): :func:`engine_weight_stats` of its actor's engine."""
    workers = list(getattr(instance, "worker_dict", {}).values()) or [instance]
    for worker in workers:
        engine = getattr(getattr(worker, "actor", None), "engine", None)
        if engine is not None:
            return engine_weight_stats(engine)
    return None


def dump_actor_state(trainer, folder: str) -> str:
    """Diagnostic: append the actor's own parameters' :func:`weight_stats` (per parameter, after the step's
    update; the engine's state, not the tensors sent to the rollout) to ``<folder>/actor_state.jsonl``, one
    line ``{"global_steps", "params"}`` per call. ``verl-mopd smoke`` compares each line with the rollout's
    weights after the weight sync of the same ``global_steps`` (:func:`compare_weight_stats`).

    Every actor rank runs :func:`engine_weight_stats` at once, through Ray's ``__ray_call__`` on verl's
    worker handles, as verl's own vLLM replica queries its workers (``vllm_async_server.launch_servers``);
    at once, because an FSDP ``full_tensor()`` is a collective.
    """
    import json

    import ray

    handles = trainer.actor_rollout_wg.workers
    records = [r for r in ray.get([h.__ray_call__.remote(_actor_weight_stats_on_worker) for h in handles])
               if r is not None]
    os.makedirs(folder, exist_ok=True)
    path = os.path.join(folder, ACTOR_STATE_FILE)
    with open(path, "a", encoding="utf-8") as f:
        f.write(json.dumps({"global_steps": trainer.global_steps, "params": combine_weight_stats(records)}) + "\n")
    return path
