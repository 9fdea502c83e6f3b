"""Teachers served by verl's own teacher loop: read from verl's ``distillation`` block, declared only there.

verl 0.9.1 runs inference-server teachers (SGLang/vLLM ``prompt_logprobs``) inside the agent loop
when ``distillation.enabled`` is true, one per ``distillation.teacher_models.<name>``, routed per
sample by the ``distillation.teacher_key`` column (``verl/experimental/teacher_loop``). We add
nothing to that loop; validation only needs to know which routing values it serves, to check them
against the data and the sampler's quotas as it checks ``mopd.teachers``.

:func:`loop_teachers` reads them the way verl's ``DistillationConfig._resolve_teacher_models``
does (``verl/workers/config/distillation.py``), from the raw block so that it still answers when
verl's own conversion of the block fails (verl reports that failure itself):

- one entry: the ``teacher_model`` default serves every sample (verl sets its key to ``default``);
- several: verl drops ``teacher_model`` and keys the rest by their ``key`` field.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

__all__ = ["ROUTES_EVERY_SAMPLE", "LoopTeacher", "loop_teachers"]

#: the routing value :func:`loop_teachers` gives verl's single teacher (verl's own key for it)
ROUTES_EVERY_SAMPLE = "default"


@dataclass(frozen=True)
class LoopTeacher:
    """One ``distillation.teacher_models.<name>`` entry, as validation needs it.

    ``trust_remote_code`` is the student's (``actor_rollout_ref.model.trust_remote_code``): verl's
    teacher entry has none of its own.
    """

    name: str
    model_path: str
    trust_remote_code: bool = False

    @property
    def model_path_key(self) -> str:
        """The config key of ``model_path``, as errors name it."""
        return f"distillation.teacher_models.{self.name}.model_path"


def loop_teachers(distillation: Mapping[str, Any] | None, *, trust_remote_code: bool = False) -> dict[str, LoopTeacher]:
    """``{routing value: LoopTeacher}`` of the teachers verl's loop serves (empty when it is off).

    Args:
        distillation: the run's ``distillation`` section, resolved (a mapping; ``None`` = absent).
        trust_remote_code: the student's, given to every teacher (:class:`LoopTeacher`).

    Returns:
        ``{}`` when ``distillation.enabled`` is false; ``{"default": teacher}``
        (:data:`ROUTES_EVERY_SAMPLE`) for verl's single ``teacher_model``, which scores every sample
        whatever its routing value; otherwise one entry per ``teacher_models.<name>`` except
        ``teacher_model``, keyed by its ``key`` (an entry without one is keyed ``<name>?``; verl
        refuses it when it converts the block).
    """
    if not distillation or not bool(distillation.get("enabled", False)):
        return {}
    models = {name: m for name, m in dict(distillation.get("teacher_models") or {}).items() if isinstance(m, Mapping)}
    if len(models) == 1 and "teacher_model" in models:
        entry = models["teacher_model"]
        return {ROUTES_EVERY_SAMPLE: LoopTeacher("teacher_model", str(entry.get("model_path")), trust_remote_code)}
    models.pop("teacher_model", None)
    return {str(m["key"]) if m.get("key") is not None else f"{name}?":
            LoopTeacher(str(name), str(m.get("model_path")), trust_remote_code) for name, m in models.items()}
