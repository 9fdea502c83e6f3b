"""Which teachers run together, and where their weights live between steps: decided up front.

:func:`plan_teachers` is a pure function of the teachers' configs, their sizes and a few numbers of
the run (GPU memory, SGLang's memory fraction, whether the actor offloads). It returns a
:class:`TeacherPlan`:

- ``waves``: the colocated teachers (the actor's GPUs) dispatched together: a teacher joins a wave
  while the wave's weights and activations fit on one GPU beside what stays there, else it starts
  the next one. ``PlatformTeacherGroup`` dispatches the ``dedicated`` teachers (their own GPUs)
  first, then each wave whole before it waits on any of it.
- ``weights``: each colocated teacher's weights between steps (``TeacherConfig.weights``):
  ``resident`` (stay on the GPUs: they must fit beside SGLang's share during rollout),
  ``pinned`` (a pinned host buffer allocated once and reused every step) or ``pageable`` (verl's
  forward-only way: ``param.data.to("cpu")`` into fresh pageable memory every step). ``auto`` is the
  fastest that fits: ``resident``, else ``pinned``.
- ``problems``: an explicit choice that cannot fit (``verl-mopd validate-recipe`` refuses it).

The memory model, per GPU, every term named (``docs/teachers.md`` states it with the paper's numbers):

    teacher phase (SGLang asleep, actor offloaded):
        RESERVE + sum(resident weights) + sum over a wave (weights if not resident + activations) <= GPU
    rollout phase:
        RESERVE + sum(resident weights) + gpu_memory_utilization * GPU <= GPU

with ``weights = parameters x dtype bytes / (TP x PP)``, ``activations = micro_batch_tokens x
ACTIVATION_BYTES_PER_TOKEN``. When the actor keeps its weights on the GPUs (no ``param_offload``)
its footprint is not modelled: colocated teachers then run in turn and ``auto`` is ``pinned``.
A teacher whose size is unknown (``params_b`` unset and no local ``config.json``) is treated the same way.
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping
from dataclasses import dataclass, field

from verl_mopd.teachers.config import TeacherConfig

__all__ = ["GPU_BYTES", "RESERVE_BYTES", "ACTIVATION_BYTES_PER_TOKEN", "DTYPE_BYTES", "TeacherPlan",
           "teacher_weight_bytes", "plan_teachers", "checkpoint_params", "run_plan", "plan_lines"]

#: one H100 80 GB (SXM/PCIe), as ``torch.cuda.mem_get_info`` reports it
GPU_BYTES = 79.6 * 2**30
#: CUDA context, NCCL buffers and allocator slack that stay on a GPU in every phase
RESERVE_BYTES = 3 * 2**30
#: forward-only activation peak per micro-batch token on one GPU: one layer's activations
#: (~34 x hidden bytes at bf16 / TP) and the fp32 log-prob outputs, rounded up for hidden <= 8192
ACTIVATION_BYTES_PER_TOKEN = 64 * 2**10
DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}

GIB = 2**30


def teacher_weight_bytes(cfg: TeacherConfig, params: float) -> float:
    """Bytes of one teacher's weights on each of its GPUs: ``params x dtype bytes / (TP x PP)``."""
    return params * DTYPE_BYTES[cfg.dtype] / (cfg.tensor_model_parallel_size * cfg.pipeline_model_parallel_size)


@dataclass
class TeacherPlan:
    """What :func:`plan_teachers` decided. ``per_gpu``: ``{platform: (weight bytes, activation bytes)}``
    per GPU (None when the size is unknown); ``lines``: the decision in words."""

    waves: list[list[str]]
    weights: dict[str, str]
    per_gpu: dict[str, tuple[float, float] | None] = field(default_factory=dict)
    problems: list[str] = field(default_factory=list)
    lines: list[str] = field(default_factory=list)

    def together(self) -> bool:
        """True when some wave holds more than one colocated teacher."""
        return any(len(w) > 1 for w in self.waves)


def plan_teachers(teachers: Mapping[str, TeacherConfig], params: Mapping[str, float | None], *,
                  rollout_fraction: float | None, actor_offloaded: bool, gpu_bytes: float = GPU_BYTES,
                  reserve_bytes: float = RESERVE_BYTES,
                  activation_bytes_per_token: float = ACTIVATION_BYTES_PER_TOKEN) -> TeacherPlan:
    """Waves and weight policies for ``teachers`` (module docstring).

    Args:
        teachers: ``{platform: TeacherConfig}`` in config order.
        params: ``{platform: parameter count}`` (None: unknown).
        rollout_fraction: ``actor_rollout_ref.rollout.gpu_memory_utilization`` (None: no colocated rollout).
        actor_offloaded: the actor's parameters leave the GPUs outside its own phases (``param_offload``).
    """
    colocated = [p for p, c in teachers.items() if c.placement == "colocated"]
    dedicated = [p for p, c in teachers.items() if c.placement != "colocated"]
    per_gpu: dict[str, tuple[float, float] | None] = {}
    for p, c in teachers.items():
        n = params.get(p)
        per_gpu[p] = None if n is None else (teacher_weight_bytes(c, n), c.micro_batch_tokens * activation_bytes_per_token)
    problems: list[str] = []
    weights: dict[str, str] = {}
    for p in dedicated:
        choice = teachers[p].weights
        if choice not in ("auto", "resident"):
            problems.append(f"mopd.teachers.{p}.weights={choice!r}: a dedicated teacher owns its GPUs and keeps its "
                            "weights there; only colocated teachers leave them (allowed here: 'auto', 'resident')")
        weights[p] = "resident"
    known = actor_offloaded and all(per_gpu[p] is not None for p in colocated)

    def weight(p):
        return per_gpu[p][0]

    def teacher_phase(resident: list[str], wave: list[str]) -> float:
        return (reserve_bytes + sum(weight(p) for p in resident)
                + sum((0 if p in resident else weight(p)) + per_gpu[p][1] for p in wave))

    def rollout_phase(resident: list[str]) -> float:
        return reserve_bytes + sum(weight(p) for p in resident) + (rollout_fraction or 0.0) * gpu_bytes

    # weights: explicit choices first, then auto teachers resident while the rollout phase and each
    # teacher's own call still fit
    resident = [p for p in colocated if teachers[p].weights == "resident"]
    for p in colocated:
        choice = teachers[p].weights
        if choice != "auto":
            weights[p] = choice
            continue
        if known and rollout_phase(resident + [p]) <= gpu_bytes and all(
                teacher_phase(resident + [p], [q]) <= gpu_bytes for q in colocated):
            resident.append(p)
            weights[p] = "resident"
        else:
            weights[p] = "pinned"
    if resident and not known:
        why = ("the actor keeps its weights on the GPUs (no param_offload), a footprint this plan does not model"
               if not actor_offloaded else "the size of " + ", ".join(p for p in colocated if per_gpu[p] is None)
               + " is unknown (set mopd.teachers.<platform>.params_b or use a local checkpoint)")
        problems.append(f"mopd.teachers.{resident[0]}.weights='resident': cannot be checked to fit: {why}")
    elif resident and rollout_phase(resident) > gpu_bytes:
        problems.append(
            f"mopd.teachers.{'/'.join(resident)}.weights='resident': {sum(weight(p) for p in resident) / GIB:.1f} GiB of "
            f"resident teacher weights per GPU + gpu_memory_utilization {rollout_fraction} x {gpu_bytes / GIB:.1f} GiB + "
            f"{reserve_bytes / GIB:.1f} GiB reserve = {rollout_phase(resident) / GIB:.1f} GiB > {gpu_bytes / GIB:.1f} GiB "
            f"during rollout; lower actor_rollout_ref.rollout.gpu_memory_utilization to "
            f"{math.floor((gpu_bytes - reserve_bytes - sum(weight(p) for p in resident)) / gpu_bytes * 100) / 100} "
            "or choose 'pinned'")

    # waves: first fit, in config order
    waves: list[list[str]] = []
    if known:
        current: list[str] = []
        for p in colocated:
            if current and teacher_phase(resident, current + [p]) > gpu_bytes:
                waves.append(current)
                current = []
            current.append(p)
        if current:
            waves.append(current)
        for p in colocated:
            if teacher_phase(resident, [p]) > gpu_bytes:
                problems.append(f"mopd.teachers.{p}: {teacher_phase(resident, [p]) / GIB:.1f} GiB per GPU during its "
                                f"call (weights, activations, resident teachers, reserve) > {gpu_bytes / GIB:.1f} GiB")
    else:
            waves = [[p] for p in colocated]

    plan = TeacherPlan(waves=waves, weights=weights, per_gpu=per_gpu, problems=problems)
    plan.lines = _describe(plan, teachers, resident, known, actor_offloaded, rollout_fraction, gpu_bytes,
                           teacher_phase, rollout_phase)
    return plan


def _describe(plan, teachers, resident, known, actor_offloaded, rollout_fraction, gpu_bytes, teacher_phase,
              rollout_phase) -> list[str]:
    lines = []
    for p, c in teachers.items():
        size = plan.per_gpu[p]
        where = f"{c.placement}, weights {plan.weights[p]}"
        if size is None:
            lines.append(f"teacher {p}: {where}; size unknown")
        else:
            lines.append(f"teacher {p}: {where}; {size[0] / GIB:.1f} GiB weights + {size[1] / GIB:.1f} GiB activations per GPU")
    dedicated = [p for p, c in teachers.items() if c.placement != "colocated"]
    if dedicated:
        lines.append(f"teachers on their own GPUs, in flight together with everything: {', '.join(dedicated)}")
    for i, wave in enumerate(plan.waves):
        mem = f" ({teacher_phase(resident, wave) / GIB:.1f} of {gpu_bytes / GIB:.1f} GiB per GPU)" if known else ""
        lines.append(f"colocated teachers wave {i + 1}: {' + '.join(wave)} dispatched together{mem}" if len(wave) > 1
                     else f"colocated teachers wave {i + 1}: {wave[0]} alone{mem}")
    colocated = [p for p, c in teachers.items() if c.placement == "colocated"]
    if len(colocated) > 1 and not known:
        why = "the actor keeps its weights on the GPUs" if not actor_offloaded else "a teacher's size is unknown"
        lines.append(f"colocated teachers run in turn: {why}")
    if resident and known and rollout_fraction is not None:
        lines.append(f"rollout with resident teachers: {rollout_phase(resident) / GIB:.1f} of {gpu_bytes / GIB:.1f} GiB "
                     f"per GPU (gpu_memory_utilization {rollout_fraction})")
    return lines


def checkpoint_params(path: str, trust_remote_code: bool = False) -> int | None:
    """Parameter count of a local checkpoint from its ``config.json`` (the model built on the meta
    device with verl's class choice, no weights read); None when ``path`` is not a local folder."""
    if not os.path.isfile(os.path.join(path, "config.json")):
        return None
    import torch
    from transformers import AutoConfig
    from verl.utils.model import get_hf_auto_model_class

    cfg = AutoConfig.from_pretrained(path, trust_remote_code=trust_remote_code)
    with torch.device("meta"):
        model = get_hf_auto_model_class(cfg).from_config(cfg, trust_remote_code=trust_remote_code)
    return sum(p.numel() for p in model.parameters())


def run_plan(config, teachers: Mapping[str, TeacherConfig]) -> TeacherPlan:
    """:func:`plan_teachers` for a composed run config: sizes from ``params_b`` or local checkpoints,
    SGLang's fraction from ``actor_rollout_ref.rollout.gpu_memory_utilization``, the actor's offload from
    its Megatron or FSDP ``param_offload``."""
    from omegaconf import OmegaConf

    def get(key):
        return OmegaConf.select(config, key, default=None)

    params = {p: (c.params_b * 1e9 if c.params_b is not None else checkpoint_params(c.model_path, c.trust_remote_code))
              for p, c in teachers.items()}
    strategy = get("actor_rollout_ref.actor.strategy")
    offload = get("actor_rollout_ref.actor.megatron.param_offload") if strategy == "megatron" else get(
        "actor_rollout_ref.actor.fsdp_config.param_offload")
    fraction = get("actor_rollout_ref.rollout.gpu_memory_utilization")
    return plan_teachers(teachers, params, rollout_fraction=None if fraction is None else float(fraction),
                         actor_offloaded=bool(offload))


def plan_lines(config) -> list[str]:
    """:func:`run_plan`'s decision in words for a composed run config (``verl-mopd validate-recipe``
    prints them); nothing when the run has no ``mopd.teachers`` or the block is invalid (reported elsewhere)."""
    from omegaconf import OmegaConf

    from verl_mopd.config import MOPDConfig

    block = OmegaConf.select(config, "mopd", default=None)
    if block is None:
        return []
    try:
        mopd = MOPDConfig.from_mapping(OmegaConf.to_container(block, resolve=True))
        return run_plan(config, mopd.teachers).lines if mopd.teachers else []
    except Exception:  # noqa: BLE001 - validate() reports a broken block
        return []
