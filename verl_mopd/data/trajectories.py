"""Uni-GUI trajectory schema, normalization to the Qwen3-VL action format, and the cleaning rules.

Schema (JSONL, one trajectory a line; paths relative to the JSONL file's folder or absolute)::

    {"id": "traj-0001",                      # unique
     "platform": "desktop" | "mobile",
     "instruction": "Open the terminal and ...",
     "screen_size": [1920, 1080],            # pixels; needed only for coords="pixel"
     "coords": "pixel" | "unit" | "grid",    # how step coordinates are given (default "pixel"):
                                             #   pixel = absolute pixels of screen_size,
                                             #   unit  = 0-1 fractions (pyautogui/AgentNet),
                                             #   grid  = Qwen3-VL's 0-1000 grid
     "steps": [{"index": 0,                  # consecutive integers
                "screenshot": "imgs/0.png",  # the screen the action is taken on
                "action": {"action": "left_click", "coordinate": [18, 491]},
                "thought": "The terminal icon is ...",      # optional reasoning
                "description": "Click the terminal icon",   # optional, shown in later steps' history
                "bbox": [5, 473, 31, 509],   # optional target box, same coords as the action
                "screen_size": [1080, 2400]  # optional per-step override
               }, ...],
     "subtasks": ["open terminal", ...],     # optional decomposition given to the judge
     "judge": {"subtasks": [{"subtask": "open terminal", "completed": true}], "model": "..."},
                                             # optional verdict (written by the judge, read offline)
     "env_mismatch": false,                  # optional: the query does not fit the environment
     "source": "agentnet",                   # optional: becomes the parquet's data_source
     "meta": {...}}                          # optional, carried through untouched

``action`` is the platform's native tool vocabulary: a Qwen3-VL ``computer_use`` / ``mobile_use``
``arguments`` dict whose coordinates are in ``coords`` space; action-name aliases (``tap``,
``hotkey``...) are accepted and resolved by :func:`verl_mopd.rewards.actions.normalize_action`.
Readers (:mod:`verl_mopd.data.readers`) turn public formats into this schema and keep actions they
cannot map under their own name, so that the ``action_space`` rule counts them instead of a reader
dropping them.

Cleaning (UI-MOPD, Uni-GUI section: structural anomalies, actions outside the student's action
space, > 40 steps, query/environment mismatch, subtask judge), as named rules applied in
:data:`RULES` order; a trajectory is dropped by the first rule it fails, so
``input = kept + sum(dropped by rule)`` holds for trajectories and for steps:

=============== =========================================================================
rule            drops a trajectory when
=============== =========================================================================
structure       it has no steps, its step indices are not consecutive (gaps, duplicated or
                unordered indices), or two consecutive steps repeat the same screenshot and
                action (a duplicated step)
screenshots     a step's screenshot file does not exist
action_space    a step's action (or bbox) does not normalize, or the action is not in the
                student's action set (the actions its system prompt offers)
max_steps       it has more than ``max_steps`` (40) steps
env_mismatch    its ``env_mismatch`` flag is true
subtasks        the subtask judge says a subtask was not completed (or gave no verdict)
=============== =========================================================================
"""

from __future__ import annotations

import json
import math
import os
from collections import Counter
from dataclasses import dataclass, field, replace
from typing import Any, Iterable, Iterator, Mapping, Sequence

from verl_mopd.rewards.actions import (
    ACTION_SPECS,
    DEFAULT_PROMPT_ACTIONS,
    GRID_MAX,
    PLATFORMS,
    Action,
    ActionError,
    normalize_action,
    to_grid,
)

COORDS = ("pixel", "unit", "grid")
RULES = ("structure", "screenshots", "action_space", "max_steps", "env_mismatch", "subtasks")
MAX_STEPS = 40  # UI-MOPD: trajectories longer than 40 steps are dropped


class SchemaError(ValueError):
    """A trajectory record that does not follow the schema; the message names the field."""


# ----------------------------------------------------------------------------- schema


@dataclass(frozen=True)
class Step:
    """One step: the screen (``screenshot``) and the action taken on it, in native coordinates."""

    index: int
    screenshot: str
    action: Mapping[str, Any]
    thought: str = ""
    description: str = ""
    bbox: tuple[float, float, float, float] | None = None
    screen_size: tuple[int, int] | None = None


@dataclass(frozen=True)
class Trajectory:
    """One task demonstration. See the module docstring for the JSON layout."""

    id: str
    platform: str
    instruction: str
    steps: tuple[Step, ...]
    screen_size: tuple[int, int] | None = None
    coords: str = "pixel"
    subtasks: tuple[str, ...] | None = None
    judge: Mapping[str, Any] | None = None
    env_mismatch: bool | None = None
    source: str = ""
    meta: Mapping[str, Any] = field(default_factory=dict)

    @property
    def num_steps(self) -> int:
        return len(self.steps)


def _need(d: Mapping, key: str, types: type | tuple[type, ...], where: str) -> Any:
    if key not in d:
        raise SchemaError(f"{where}: missing required field {key!r}")
    v = d[key]
    if isinstance(v, bool) or not isinstance(v, types):
        raise SchemaError(f"{where}.{key}={_short(v)}: expected {_type_names(types)}")
    return v


def _type_names(types: type | tuple[type, ...]) -> str:
    ts = types if isinstance(types, tuple) else (types,)
    return " or ".join(t.__name__ for t in ts)


def _short(v: Any, n: int = 80) -> str:
    r = repr(v)
    return r if len(r) <= n else r[: n - 3] + "..."


def _size(v: Any, where: str) -> tuple[int, int] | None:
    if v is None:
        return None
    if (
        not isinstance(v, (list, tuple))
        or len(v) != 2
        or not all(isinstance(x, (int, float)) and not isinstance(x, bool) and x > 0 for x in v)
    ):
        raise SchemaError(f"{where}={_short(v)}: expected [width, height] in pixels, both > 0")
    return (int(v[0]), int(v[1]))


def _box(v: Any, where: str) -> tuple[float, float, float, float] | None:
    """``[x1, y1, x2, y2]`` or ``[[x1, y1], [x2, y2]]``; ``None`` / ``[]`` for no box."""
    if v is None or (isinstance(v, (list, tuple)) and len(v) == 0):
        return None
    if isinstance(v, (list, tuple)) and len(v) == 2 and all(isinstance(c, (list, tuple)) and len(c) == 2 for c in v):
        v = [*v[0], *v[1]]
    if (
        not isinstance(v, (list, tuple))
        or len(v) != 4
        or not all(isinstance(c, (int, float)) and not isinstance(c, bool) and math.isfinite(c) for c in v)
    ):
        raise SchemaError(f"{where}={_short(v)}: expected [x1, y1, x2, y2] or [[x1, y1], [x2, y2]]")
    x1, y1, x2, y2 = (float(c) for c in v)
    return (min(x1, x2), min(y1, y2), max(x1, x2), max(y1, y2))


def step_from_dict(d: Mapping[str, Any], base_dir: str = "", where: str = "step") -> Step:
    if not isinstance(d, Mapping):
        raise SchemaError(f"{where}={_short(d)}: expected an object")
    index = _need(d, "index", int, where)
    shot = _need(d, "screenshot", str, where)
    action = _need(d, "action", Mapping, where)
    for key in ("thought", "description"):
        if d.get(key) is not None and not isinstance(d[key], str):
            raise SchemaError(f"{where}.{key}={_short(d[key])}: expected a string")
    return Step(
        index=index,
        screenshot=shot if os.path.isabs(shot) or not base_dir else os.path.join(base_dir, shot),
        action=dict(action),
        thought=d.get("thought") or "",
        description=d.get("description") or "",
        bbox=_box(d.get("bbox"), f"{where}.bbox"),
        screen_size=_size(d.get("screen_size"), f"{where}.screen_size"),
    )


def trajectory_from_dict(d: Mapping[str, Any], base_dir: str = "", where: str = "trajectory") -> Trajectory:
    """Validate one JSON record; relative screenshot paths are joined to ``base_dir``."""
    if not isinstance(d, Mapping):
        raise SchemaError(f"{where}={_short(d)}: expected an object")
    tid = _need(d, "id", (str, int), where)
    where = f"{where}[id={tid!r}]"
    platform = _need(d, "platform", str, where)
    if platform not in PLATFORMS:
        raise SchemaError(f"{where}.platform={platform!r}: allowed {list(PLATFORMS)}")
    coords = d.get("coords", "pixel")
    if coords not in COORDS:
        raise SchemaError(f"{where}.coords={coords!r}: allowed {list(COORDS)}")
    steps = _need(d, "steps", list, where)
    subtasks = d.get("subtasks")
    if subtasks is not None and (not isinstance(subtasks, list) or not all(isinstance(s, str) for s in subtasks)):
        raise SchemaError(f"{where}.subtasks={_short(subtasks)}: expected a list of strings")
    judge = d.get("judge")
    if judge is not None and not isinstance(judge, Mapping):
        raise SchemaError(f"{where}.judge={_short(judge)}: expected an object")
    mismatch = d.get("env_mismatch")
    if mismatch is not None and not isinstance(mismatch, bool):
        raise SchemaError(f"{where}.env_mismatch={_short(mismatch)}: expected true, false or null")
    return Trajectory(
        id=str(tid),
        platform=platform,
        instruction=_need(d, "instruction", str, where),
        steps=tuple(step_from_dict(s, base_dir, f"{where}.steps[{i}]") for i, s in enumerate(steps)),
        screen_size=_size(d.get("screen_size"), f"{where}.screen_size"),
        coords=coords,
        subtasks=tuple(subtasks) if subtasks is not None else None,
        judge=dict(judge) if judge is not None else None,
        env_mismatch=mismatch,
        source=str(d.get("source") or ""),
        meta=dict(d.get("meta") or {}),
    )


def trajectory_to_dict(t: Trajectory) -> dict[str, Any]:
    """The JSON record of ``t`` (screenshot paths as stored, i.e. resolved)."""
    out: dict[str, Any] = {"id": t.id, "platform": t.platform, "instruction": t.instruction, "coords": t.coords}
    if t.screen_size is not None:
        out["screen_size"] = list(t.screen_size)
    steps = []
    for s in t.steps:
        sd: dict[str, Any] = {"index": s.index, "screenshot": s.screenshot, "action": dict(s.action)}
        if s.thought:
            sd["thought"] = s.thought
        if s.description:
            sd["description"] = s.description
        if s.bbox is not None:
            sd["bbox"] = list(s.bbox)
        if s.screen_size is not None:
            sd["screen_size"] = list(s.screen_size)
        steps.append(sd)
    out["steps"] = steps
    for key in ("subtasks", "judge", "env_mismatch"):
        v = getattr(t, key)
        if v is not None:
            out[key] = list(v) if key == "subtasks" else v
    if t.source:
        out["source"] = t.source
    if t.meta:
        out["meta"] = dict(t.meta)
    return out


def read_jsonl(path: str) -> Iterator[Trajectory]:
    """Trajectories of a JSONL file; a bad line raises :class:`SchemaError` naming ``path:line``."""
    base = os.path.dirname(os.path.abspath(path))
    with open(path, encoding="utf-8") as f:
        for lineno, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except ValueError as e:
                raise SchemaError(f"{path}:{lineno}: not JSON ({e})") from None
            yield trajectory_from_dict(record, base, where=f"{path}:{lineno}")


def write_jsonl(trajectories: Iterable[Trajectory], path: str) -> int:
    """Write atomically (temp file + rename); returns the number written."""
    tmp = f"{path}.tmp"
    n = 0
    with open(tmp, "w", encoding="utf-8") as f:
        for t in trajectories:
            f.write(json.dumps(trajectory_to_dict(t), ensure_ascii=False) + "\n")
            n += 1
    os.replace(tmp, path)
    return n


# ----------------------------------------------------------------------------- normalization


def screen_size_of(t: Trajectory, s: Step) -> tuple[int, int]:
    """The step's screen size: the step's own, the trajectory's, else read from the screenshot header."""
    if s.screen_size is not None:
        return s.screen_size
    if t.screen_size is not None:
        return t.screen_size
    from PIL import Image

    try:
        with Image.open(s.screenshot) as im:
            return im.size
    except OSError as e:
        raise ActionError("no_screen_size", f"screen_size unknown and the screenshot is unreadable: {e}", "screen_size")


def _to_grid_point(t: Trajectory, s: Step, value: Any, name: str) -> list[float]:
    if not isinstance(value, (list, tuple)) or len(value) != 2:
        raise ActionError("bad_type", f"{name}={_short(value)}: expected [x, y]", name)
    x, y = value
    if not all(isinstance(c, (int, float)) and not isinstance(c, bool) and math.isfinite(c) for c in (x, y)):
        raise ActionError("bad_type", f"{name}={_short(value)}: expected two finite numbers", name)
    if t.coords == "grid":
        return [x, y]
    if t.coords == "unit":
        if not (0 <= x <= 1 and 0 <= y <= 1):
            raise ActionError("out_of_screen", f"{name}={_short(value)}: outside the 0-1 unit square", name)
        return [round(x * GRID_MAX), round(y * GRID_MAX)]
    w, h = screen_size_of(t, s)
    try:
        return list(to_grid(x, y, w, h))
    except ValueError as e:
        raise ActionError("out_of_screen", f"{name}={_short(value)}: {e}", name) from None


def step_action(t: Trajectory, s: Step, allowed: Sequence[str] | None = None) -> Action:
    """The step's action on the 0-1000 grid as a validated :class:`Action`.

    Raises :class:`ActionError` (``reason`` ``not_in_action_set`` when it is a valid platform
    action outside ``allowed``).
    """
    args = dict(s.action)
    for name in ("coordinate", "coordinate2"):
        if args.get(name) is not None:
            args[name] = _to_grid_point(t, s, args[name], name)
    action = normalize_action(t.platform, args)
    if allowed is not None and action.action not in allowed:
        raise ActionError(
            "not_in_action_set",
            f"action={action.action!r} is outside the student's {t.platform} action set {list(allowed)}",
            "action",
        )
    return action


def step_bbox(t: Trajectory, s: Step) -> list[float] | None:
    """The step's box ``[x1, y1, x2, y2]`` on the 0-1000 grid, or None."""
    if s.bbox is None:
        return None
    x1, y1 = _to_grid_point(t, s, [s.bbox[0], s.bbox[1]], "bbox")
    x2, y2 = _to_grid_point(t, s, [s.bbox[2], s.bbox[3]], "bbox")
    for v in (x1, y1, x2, y2):
        if not 0 <= v <= GRID_MAX:
            raise ActionError("out_of_grid", f"bbox={list(s.bbox)!r}: outside the 0-{GRID_MAX} grid", "bbox")
    return [x1, y1, x2, y2]


# ----------------------------------------------------------------------------- cleaning


@dataclass(frozen=True)
class CleanConfig:
    """Which rules run and their thresholds.

    Attributes:
        rules: the enabled rules, a subset of :data:`RULES` (always applied in :data:`RULES` order).
        max_steps: the ``max_steps`` rule's limit (UI-MOPD: 40).
        action_sets: per platform, the student's action set (default: the actions its system
            prompt offers, :data:`~verl_mopd.rewards.actions.DEFAULT_PROMPT_ACTIONS`).
        missing_verdict: what the ``subtasks`` rule does with a trajectory the judge has no verdict
            for: ``"error"`` (stop, naming it), ``"drop"`` (count it under ``subtasks``) or ``"keep"``.
    """

    rules: tuple[str, ...] = RULES
    max_steps: int = MAX_STEPS
    action_sets: Mapping[str, tuple[str, ...]] = field(default_factory=lambda: dict(DEFAULT_PROMPT_ACTIONS))
    missing_verdict: str = "error"

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
        if self.missing_verdict not in ("error", "drop", "keep"):
            errors.append(f"missing_verdict={self.missing_verdict!r}: allowed ['error', 'drop', 'keep']")
        if errors:
            raise ValueError("invalid cleaning config: " + "; ".join(errors))
        object.__setattr__(self, "rules", tuple(r for r in RULES if r in self.rules))


@dataclass(frozen=True)
class Drop:
    """Why a trajectory was dropped: the rule and a one-line detail naming the step and field."""

    id: str
    platform: str
    rule: str
    detail: str
    num_steps: int


def check_structure(t: Trajectory) -> str | None:
    if not t.steps:
        return "no steps"
    for prev, cur in zip(t.steps, t.steps[1:]):
        if cur.index != prev.index + 1:
            kind = "duplicated" if cur.index == prev.index else "non-consecutive"
            return f"{kind} step index {cur.index} after {prev.index}"
        if cur.screenshot == prev.screenshot and dict(cur.action) == dict(prev.action):
            return f"step {cur.index} duplicates step {prev.index} (same screenshot and action)"
    return None


def check_screenshots(t: Trajectory) -> str | None:
    for s in t.steps:
        if not os.path.isfile(s.screenshot):
            return f"step {s.index}: screenshot {s.screenshot!r} does not exist"
    return None


def check_action_space(t: Trajectory, allowed: Sequence[str] | None) -> str | None:
    for s in t.steps:
        try:
            step_action(t, s, allowed)
            step_bbox(t, s)
        except (ActionError, ValueError) as e:
            return f"step {s.index}: {e}"
    return None


def _steps(ts: Iterable[Trajectory]) -> int:
    return sum(t.num_steps for t in ts)


def _progress(it: Iterable, total: int, desc: str, enabled: bool) -> Iterable:
    if not enabled:
        return it
    from tqdm import tqdm

    return tqdm(it, total=total, desc=desc, unit="traj")


def clean(
    trajectories: Sequence[Trajectory],
    config: CleanConfig | None = None,
    judge: Any = None,
    progress: bool = False,
) -> tuple[list[Trajectory], list[Drop]]:
    """Apply the enabled rules; returns ``(kept, drops)`` with ``len(kept) + len(drops) == len(input)``.

    Args:
        trajectories: the input, in order (the order of ``kept`` follows it).
        config: rules and thresholds.
        judge: a :class:`verl_mopd.data.judges.SubtaskJudge` (``verdicts(trajectories)``), used by
            the ``subtasks`` rule; default :class:`~verl_mopd.data.judges.OfflineJudge`. It runs
            last, on the survivors of every other rule only (judge calls are the expensive part).
            Kept trajectories carry the judge's verdict in ``judge``.
    """
    cfg = config or CleanConfig()
    ids = Counter(t.id for t in trajectories)
    dup_ids = [i for i, n in ids.items() if n > 1]
    if dup_ids:
        raise SchemaError(f"trajectory ids must be unique; repeated: {sorted(dup_ids)[:10]}")
    drops: list[Drop] = []
    survivors: list[Trajectory] = []
    for t in _progress(trajectories, len(trajectories), "clean", progress):
        detail = rule = None
        for rule in cfg.rules:
            if rule == "structure":
                detail = check_structure(t)
            elif rule == "screenshots":
                detail = check_screenshots(t)
            elif rule == "action_space":
                detail = check_action_space(t, cfg.action_sets.get(t.platform))
            elif rule == "max_steps":
                detail = f"{t.num_steps} steps > max_steps={cfg.max_steps}" if t.num_steps > cfg.max_steps else None
            elif rule == "env_mismatch":
                detail = "env_mismatch flag is set" if t.env_mismatch else None
            if detail is not None:
                break
        if detail is not None:
            drops.append(Drop(t.id, t.platform, rule, detail, t.num_steps))
        else:
            survivors.append(t)
    if "subtasks" not in cfg.rules:
        return survivors, drops
    if judge is None:
        from verl_mopd.data.judges import OfflineJudge

        judge = OfflineJudge()
    verdicts = judge.verdicts(survivors, progress=progress)
    kept: list[Trajectory] = []
    for t, v in zip(survivors, verdicts):
        if v is None:
            if cfg.missing_verdict == "error":
                raise ValueError(
                    f"trajectory {t.id!r}: the {type(judge).__name__} has no subtask verdict for it; give verdicts "
                    "in the data ('judge' field), use an online judge (--judge-base-url), set "
                    "missing_verdict='drop'/'keep' (--missing-verdict), or disable the rule (--skip-rule subtasks)"
                )
            if cfg.missing_verdict == "drop":
                drops.append(Drop(t.id, t.platform, "subtasks", "no judge verdict", t.num_steps))
            else:
                kept.append(t)
            continue
        failed = [s.subtask for s in v.subtasks if not s.completed]
        if failed or not v.subtasks:
            what = f"subtasks not completed: {failed}" if failed else "the judge listed no subtasks"
            drops.append(Drop(t.id, t.platform, "subtasks", what, t.num_steps))
        else:
            kept.append(replace(t, judge=v.to_dict()))
    order = {t.id: i for i, t in enumerate(trajectories)}
    drops.sort(key=lambda d: order[d.id])
    return kept, drops


def clean_report(
    trajectories: Sequence[Trajectory], kept: Sequence[Trajectory], drops: Sequence[Drop], config: CleanConfig
) -> dict[str, Any]:
    """The JSON report: counts of trajectories and steps, input / kept / dropped by rule, per platform.

    Layout::

        {"rules": [enabled rules, in order], "disabled": [...], "max_steps": 40,
         "total": {"input": {"trajectories": N, "steps": S}, "kept": {...},
                   "dropped": {rule: {"trajectories": n, "steps": s} for every enabled rule}},
         "platforms": {platform: same as "total"},
         "balanced": true}       # input == kept + sum(dropped), for trajectories and steps

    Raises AssertionError if the counts do not add up (a bug, never data).
    """

    def block(ts_in, ts_kept, ds) -> dict[str, Any]:
        dropped = {r: {"trajectories": 0, "steps": 0} for r in config.rules}
        for d in ds:
            dropped[d.rule]["trajectories"] += 1
            dropped[d.rule]["steps"] += d.num_steps
        return {
            "input": {"trajectories": len(ts_in), "steps": _steps(ts_in)},
            "kept": {"trajectories": len(ts_kept), "steps": _steps(ts_kept)},
            "dropped": dropped,
        }

    total = block(trajectories, kept, drops)
    platforms = {
        p: block(
            [t for t in trajectories if t.platform == p],
            [t for t in kept if t.platform == p],
            [d for d in drops if d.platform == p],
        )
        for p in PLATFORMS
        if any(t.platform == p for t in trajectories)
    }
    for name, b in [("total", total), *platforms.items()]:
        for unit in ("trajectories", "steps"):
            lhs = b["input"][unit]
            rhs = b["kept"][unit] + sum(d[unit] for d in b["dropped"].values())
            assert lhs == rhs, f"{name}: input {unit} {lhs} != kept + dropped {rhs}"
    return {
        "rules": list(config.rules),
        "disabled": [r for r in RULES if r not in config.rules],
        "max_steps": config.max_steps,
        "total": total,
        "platforms": platforms,
        "balanced": True,
    }


def format_report(report: Mapping[str, Any]) -> str:
    """A fixed-width table of the report: one row per count, columns total and each platform."""
    cols = ["total", *report["platforms"]]
    blocks = [report["total"], *report["platforms"].values()]
    rows = [("input", lambda b: b["input"])]
    rows += [(f"  dropped: {r}", lambda b, r=r: b["dropped"][r]) for r in report["rules"]]
    rows += [("kept", lambda b: b["kept"])]
    head = f"{'':24}" + "".join(f"{c + ' traj':>14}{c + ' steps':>15}" for c in cols)
    lines = [head, "-" * len(head)]
    for label, get in rows:
        lines.append(f"{label:24}" + "".join(f"{get(b)['trajectories']:>14}{get(b)['steps']:>15}" for b in blocks))
    if report["disabled"]:
        lines.append(f"disabled rules: {', '.join(report['disabled'])}")
    return "\n".join(lines)


__all__ = [
    "COORDS",
    "MAX_STEPS",
    "RULES",
    "CleanConfig",
    "Drop",
    "SchemaError",
    "Step",
    "Trajectory",
    "check_action_space",
    "check_screenshots",
    "check_structure",
    "clean",
    "clean_report",
    "format_report",
    "read_jsonl",
    "screen_size_of",
    "step_action",
    "step_bbox",
    "step_from_dict",
    "trajectory_from_dict",
    "trajectory_to_dict",
    "write_jsonl",
]
