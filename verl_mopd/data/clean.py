"""Cleaning rules of Uni-GUI trajectories (UI-MOPD, Uni-GUI section: structural anomalies, actions outside the student's action
space, > 40 steps, query/environment mismatch, subtask judge), as named rules applied in
:data:`RULES` order; a trajectory is dropped by the first rule it fails, so
``input = kept + parse drops + sum(dropped by rule)`` holds for trajectories and for steps. Each
drop carries a ``kind`` (in brackets below) under its rule:

=============== =========================================================================
rule            drops a trajectory when
=============== =========================================================================
structure       it has no steps [no_steps], its indices do not start at 0 [bad_start] or
                are not consecutive [non_consecutive, duplicated_index], or two consecutive
                steps show the same screenshot (same bytes, whatever the file name) and take
                the same action [duplicate_step]
screenshots     a step's screenshot path is refused [refused_path], or the file is not a
                usable image [unusable]: missing, not a regular file, empty, not a PNG/JPEG/
                WEBP image, truncated or corrupt (checked with Pillow, :mod:`.images`)
action_space    a step's action (or bbox) does not normalize, or the action is not in the
                student's action set (the actions its system prompt offers) [the
                :class:`~verl_mopd.rewards.actions.ActionError` reason]
max_steps       it has more than ``max_steps`` (40) steps [too_long]
env_mismatch    its ``env_mismatch`` flag is true [flagged]
subtasks        the judge says a subtask was not completed [not_completed] or lists none
                [no_subtasks]; its verdict is unreadable [unreadable] or leaves out a subtask
                the trajectory lists [uncovered]; or there is no verdict [no_verdict] and
                ``missing_verdict="drop"`` (the default)
=============== =========================================================================

The records they judge are :mod:`verl_mopd.data.schema`.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field, replace
from itertools import pairwise
from typing import Any, Iterable, Mapping, NamedTuple, Sequence

from verl_mopd.data.images import MISSING, ImageIndex
from verl_mopd.data.schema import PARSE, Drop, SchemaError, Step, Trajectory, step_action, step_bbox
from verl_mopd.errors import ConfigError
from verl_mopd.rewards.actions import (
    ACTION_SPECS,
    DEFAULT_PROMPT_ACTIONS,
    PLATFORMS,
    ActionError,
)

RULES = ("structure", "screenshots", "action_space", "max_steps", "env_mismatch", "subtasks")
MAX_STEPS = 40  # UI-MOPD: trajectories longer than 40 steps are dropped
MISSING_VERDICTS = ("drop", "keep", "error")


@dataclass(frozen=True)
class CleanConfig:
    """Which rules run and their thresholds.

    Attributes:
        rules: the enabled rules, a subset of :data:`RULES` (always applied in :data:`RULES` order).
        max_steps: the ``max_steps`` rule's limit (UI-MOPD: 40).
        action_sets: per platform, the student's action set (default: the actions its system
            prompt offers, :data:`~verl_mopd.rewards.actions.DEFAULT_PROMPT_ACTIONS`).
        missing_verdict: what the ``subtasks`` rule does with a trajectory the judge has no verdict
            for: ``"drop"`` (count it under ``subtasks``, kind ``no_verdict``), ``"keep"``, or
            ``"error"`` (stop, naming it). Default ``"drop"``: only judged-complete trajectories
            are kept, as in UI-MOPD.
    """

    rules: tuple[str, ...] = RULES
    max_steps: int = MAX_STEPS
    action_sets: Mapping[str, tuple[str, ...]] = field(default_factory=lambda: dict(DEFAULT_PROMPT_ACTIONS))
    missing_verdict: str = "drop"

    def __post_init__(self):
        errors = []
        unknown = [r for r in self.rules if r not in RULES]
        if unknown:
            errors.append(f"rules={list(self.rules)!r}: unknown {unknown}; allowed {list(RULES)}")
        if isinstance(self.max_steps, bool) or not isinstance(self.max_steps, int) or self.max_steps < 1:
            errors.append(f"max_steps={self.max_steps!r}: must be an integer >= 1")
        for platform, actions in self.action_sets.items():
            if platform not in ACTION_SPECS:
                errors.append(f"action_sets[{platform!r}]: unknown platform; allowed {list(PLATFORMS)}")
                continue
            bad = [a for a in actions if a not in ACTION_SPECS[platform]]
            if bad:
                errors.append(f"action_sets[{platform!r}]: unknown actions {bad}; allowed {list(ACTION_SPECS[platform])}")
        if self.missing_verdict not in MISSING_VERDICTS:
            errors.append(f"missing_verdict={self.missing_verdict!r}: allowed {list(MISSING_VERDICTS)}")
        if errors:
            raise ConfigError(errors, "cleaning config")
        object.__setattr__(self, "rules", tuple(r for r in RULES if r in self.rules))


class Problem(NamedTuple):
    """What a rule found: a short ``kind`` and a one-line ``detail``."""

    kind: str
    detail: str


def _same_screen(a: Step, b: Step, images: ImageIndex | None) -> bool:
    if a.screenshot == b.screenshot:
        return True
    if images is None or a.path_error or b.path_error:
        return False
    ha, hb = images.of(a).sha256, images.of(b).sha256
    return bool(ha) and ha == hb


def check_structure(t: Trajectory, images: ImageIndex | None = None) -> Problem | None:
    """No steps, indices not 0, 1, 2..., or a step repeating the previous screen and action.

    "Same screen" compares the files' bytes (``images``), so a copy under another name counts;
    without ``images`` only the paths are compared.
    """
    if not t.steps:
        return Problem("no_steps", "no steps")
    if t.steps[0].index != 0:
        return Problem("bad_start", f"step indices start at {t.steps[0].index}, not 0")
    for prev, cur in pairwise(t.steps):
        if cur.index != prev.index + 1:
            if cur.index == prev.index:
                return Problem("duplicated_index", f"duplicated step index {cur.index}")
            return Problem("non_consecutive", f"non-consecutive step index {cur.index} after {prev.index}")
        if dict(cur.action) == dict(prev.action) and _same_screen(prev, cur, images):
            return Problem("duplicate_step", f"step {cur.index} repeats step {prev.index} (same screenshot and action)")
    return None


def check_screenshots(t: Trajectory, images: ImageIndex | None = None) -> Problem | None:
    """The first step whose screenshot path was refused or whose file is not a usable image."""
    images = images if images is not None else ImageIndex()
    for s in t.steps:
        info = images.of(s)
        if info.problem:
            kind = "refused_path" if s.path_error else "missing" if info.problem == MISSING else "unusable"
            return Problem(kind, f"step {s.index}: screenshot {s.screenshot!r} {info.problem}")
    return None


def check_action_space(t: Trajectory, allowed: Sequence[str] | None) -> Problem | None:
    for s in t.steps:
        try:
            step_action(t, s, allowed)
            step_bbox(t, s)
        except ActionError as e:
            return Problem(e.reason, f"step {s.index}: {e}")
        except (ValueError, TypeError) as e:  # an argument of a type the normalizer does not expect
            return Problem("bad_value", f"step {s.index}: {type(e).__name__}: {e}")
    return None


def _steps(ts: Iterable[Trajectory]) -> int:
    return sum(t.num_steps for t in ts)


def _progress(it: Iterable, total: int, desc: str, enabled: bool) -> Iterable:
    if not enabled:
        return it
    from tqdm import tqdm

    return tqdm(it, total=total, desc=desc, unit="traj")


def _verdict_problem(t: Trajectory, v: Any) -> Problem | None:
    from verl_mopd.data.judges import UnreadableVerdict

    if isinstance(v, UnreadableVerdict):
        return Problem("unreadable", f"judge verdict unreadable: {v.reason}")
    uncovered = v.uncovered(t.subtasks or ())
    if uncovered:
        return Problem("uncovered", f"the verdict leaves out listed subtasks {uncovered}")
    if not v.subtasks:
        return Problem("no_subtasks", "the judge listed no subtasks")
    failed = [s.subtask for s in v.subtasks if not s.completed]
    return Problem("not_completed", f"subtasks not completed: {failed}") if failed else None


def clean(
    trajectories: Sequence[Trajectory],
    config: CleanConfig | None = None,
    judge: Any = None,
    progress: bool = False,
    images: ImageIndex | None = None,
) -> tuple[list[Trajectory], list[Drop]]:
    """Apply the enabled rules; returns ``(kept, drops)`` with ``len(kept) + len(drops) == len(input)``.

    Args:
        trajectories: the input, in order (the order of ``kept`` follows it); ids must be unique
            (:func:`drop_duplicate_ids`).
        config: rules and thresholds.
        judge: a :class:`verl_mopd.data.judges.SubtaskJudge` (``verdicts(trajectories)``), used by
            the ``subtasks`` rule; default :class:`~verl_mopd.data.judges.OfflineJudge`. It runs
            last, on the survivors of every other rule only (judge calls are the expensive part).
            Kept trajectories carry the judge's verdict in ``judge``.
        images: the screenshots' :class:`~verl_mopd.data.images.ImageIndex` (built on demand
            when None); ``prepare`` scans it in parallel first.
    """
    cfg = config or CleanConfig()
    ids = Counter(t.id for t in trajectories)
    dup_ids = [i for i, n in ids.items() if n > 1]
    if dup_ids:
        raise SchemaError(f"trajectory ids must be unique; repeated: {sorted(dup_ids)[:10]}", "duplicate_id")
    images = images if images is not None else ImageIndex()
    drops: list[Drop] = []
    survivors: list[Trajectory] = []
    for t in _progress(trajectories, len(trajectories), "clean", progress):
        problem = rule = None
        for rule in cfg.rules:
            if rule == "structure":
                problem = check_structure(t, images)
            elif rule == "screenshots":
                problem = check_screenshots(t, images)
            elif rule == "action_space":
                problem = check_action_space(t, cfg.action_sets.get(t.platform))
            elif rule == "max_steps" and t.num_steps > cfg.max_steps:
                problem = Problem("too_long", f"{t.num_steps} steps > max_steps={cfg.max_steps}")
            elif rule == "env_mismatch" and t.env_mismatch:
                problem = Problem("flagged", "env_mismatch flag is set")
            if problem is not None:
                break
        if problem is not None:
            drops.append(Drop(t.id, t.platform, rule, problem.detail, t.num_steps, problem.kind, t.origin))
        else:
            survivors.append(t)
    if "subtasks" not in cfg.rules:
        return survivors, drops
    if judge is None:
        from verl_mopd.data.judges import OfflineJudge

        judge = OfflineJudge()
    verdicts = judge.verdicts(survivors, progress=progress)
    kept: list[Trajectory] = []
    for t, v in zip(survivors, verdicts, strict=True):
        if v is None:
            if cfg.missing_verdict == "error":
                raise ValueError(
                    f"trajectory {t.id!r}: the {type(judge).__name__} has no subtask verdict for it; give verdicts "
                    "in the data ('judge' field), use an online judge (--judge-base-url), set "
                    "missing_verdict='drop'/'keep' (--missing-verdict), or disable the rule (--skip-rule subtasks)"
                )
            if cfg.missing_verdict == "keep":
                kept.append(t)
                continue
            problem = Problem("no_verdict", "no judge verdict")
        else:
            problem = _verdict_problem(t, v)
        if problem is None:
            kept.append(replace(t, judge=v.to_dict()))
        else:
            drops.append(Drop(t.id, t.platform, "subtasks", problem.detail, t.num_steps, problem.kind, t.origin))
    order = {t.id: i for i, t in enumerate(trajectories)}
    drops.sort(key=lambda d: order[d.id])
    return kept, drops


def clean_report(
    trajectories: Sequence[Trajectory], kept: Sequence[Trajectory], drops: Sequence[Drop], config: CleanConfig
) -> dict[str, Any]:
    """The JSON report: counts of trajectories and steps, input / kept / dropped by reason, per platform.

    ``trajectories`` are those given to :func:`clean`; ``drops`` are its drops plus the ``parse``
    drops of reading (input lines that never became one of ``trajectories``, counted as input too).
    Layout::

        {"rules": [enabled rules, in order], "disabled": [...], "max_steps": 40,
         "total": {"input": {"trajectories": N, "steps": S}, "kept": {...},
                   "dropped": {reason: {"trajectories": n, "steps": s}
                               for "parse" and every enabled rule}},
         "platforms": {platform: same as "total"},   # "unknown": parse drops without a platform
         "kinds": {reason: {kind: trajectories}},    # what each reason's drops were
         "balanced": true}       # input == kept + sum(dropped), for trajectories and steps

    Raises AssertionError if the counts do not add up (a bug, never data).
    """
    reasons = (PARSE, *config.rules)
    parsed = [d for d in drops if d.rule == PARSE]

    def block(ts_in, parse_in, ts_kept, ds) -> dict[str, Any]:
        dropped = {r: {"trajectories": 0, "steps": 0} for r in reasons}
        for d in ds:
            dropped[d.rule]["trajectories"] += 1
            dropped[d.rule]["steps"] += d.num_steps
        n_in, steps_in = len(ts_in) + len(parse_in), _steps(ts_in) + sum(d.num_steps for d in parse_in)
        return {
            "input": {"trajectories": n_in, "steps": steps_in},
            "kept": {"trajectories": len(ts_kept), "steps": _steps(ts_kept)},
            "dropped": dropped,
        }

    total = block(trajectories, parsed, kept, drops)
    platforms = {
        p: block(
            [t for t in trajectories if t.platform == p],
            [d for d in parsed if d.platform == p],
            [t for t in kept if t.platform == p],
            [d for d in drops if d.platform == p],
        )
        for p in (*PLATFORMS, "unknown")
        if any(t.platform == p for t in trajectories) or any(d.platform == p for d in parsed)
    }
    for name, b in [("total", total), *platforms.items()]:
        for unit in ("trajectories", "steps"):
            lhs = b["input"][unit]
            rhs = b["kept"][unit] + sum(d[unit] for d in b["dropped"].values())
            assert lhs == rhs, f"{name}: input {unit} {lhs} != kept + dropped {rhs}"
    kinds: dict[str, dict[str, int]] = {}
    for d in drops:
        kinds.setdefault(d.rule, {})
        kinds[d.rule][d.kind] = kinds[d.rule].get(d.kind, 0) + 1
    return {
        "rules": list(config.rules),
        "disabled": [r for r in RULES if r not in config.rules],
        "max_steps": config.max_steps,
        "total": total,
        "platforms": platforms,
        "kinds": {r: kinds[r] for r in reasons if r in kinds},
        "balanced": True,
    }


def format_report(report: Mapping[str, Any]) -> str:
    """A fixed-width table of the report: one row per count, columns total and each platform."""
    cols = ["total", *report["platforms"]]
    blocks = [report["total"], *report["platforms"].values()]
    rows = [("input", lambda b: b["input"])]
    rows += [(f"  dropped: {r}", lambda b, r=r: b["dropped"][r]) for r in report["total"]["dropped"]]
    rows += [("kept", lambda b: b["kept"])]
    head = f"{'':24}" + "".join(f"{c + ' traj':>14}{c + ' steps':>15}" for c in cols)
    lines = [head, "-" * len(head)]
    for label, get in rows:
        lines.append(f"{label:24}" + "".join(f"{get(b)['trajectories']:>14}{get(b)['steps']:>15}" for b in blocks))
    for reason, kinds in report.get("kinds", {}).items():
        lines.append(f"{reason}: " + ", ".join(f"{k} {n}" for k, n in sorted(kinds.items(), key=lambda kv: -kv[1])))
    if report["disabled"]:
        lines.append(f"disabled rules: {', '.join(report['disabled'])}")
    return "\n".join(lines)


__all__ = [
    "MAX_STEPS",
    "MISSING_VERDICTS",
    "RULES",
    "CleanConfig",
    "Problem",
    "check_action_space",
    "check_screenshots",
    "check_structure",
    "clean",
    "clean_report",
    "format_report",
]
