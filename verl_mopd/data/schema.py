"""Uni-GUI trajectory records: the schema, JSONL reading and writing, normalization to the Qwen3-VL action format.

Schema (JSONL, one trajectory a line)::

    {"id": "traj-0001",                      # unique
     "platform": "desktop" | "mobile",
     "instruction": "Open the terminal and ...",
     "screen_size": [1920, 1080],            # pixels; needed only for coords="pixel"
     "coords": "pixel" | "unit" | "grid",    # how step coordinates are given (default "pixel"):
                                             #   pixel = absolute pixels of screen_size,
                                             #   unit  = 0-1 fractions (pyautogui/AgentNet),
                                             #   grid  = Qwen3-VL's 0-1000 grid
     "steps": [{"index": 0,                  # 0, 1, 2, ...
                "screenshot": "imgs/0.png",  # the screen the action is taken on (see "Paths")
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
     "meta": {...}}                          # optional object, carried through untouched

Paths: a relative ``screenshot`` joins the JSONL file's folder (the data root). Every path,
relative or absolute, is resolved with its symlinks and must land under the data root or under
an allowed root (``roots``, ``--image-root``); a path that does not is refused (the step's
``path_error``) and never opened (:mod:`verl_mopd.data.images`).

``action`` is the platform's native tool vocabulary: a Qwen3-VL ``computer_use`` / ``mobile_use``
``arguments`` dict whose coordinates are in ``coords`` space; action-name aliases (``tap``,
``hotkey``...) are accepted and resolved by :func:`verl_mopd.rewards.actions.normalize_action`.
Readers (:mod:`verl_mopd.data.readers`) turn public formats into this schema and keep actions they
cannot map under their own name, so that the ``action_space`` rule counts them instead of a reader
dropping them.

Reading never stops at a bad line: a line that is not UTF-8, not JSON, not an object, does not
follow the schema, or repeats an earlier id is a ``parse`` drop naming ``file:line`` (given a
``drops`` list; without one the first bad line raises :class:`SchemaError`).

The cleaning rules are :mod:`verl_mopd.data.clean`.
"""

from __future__ import annotations

import codecs
import json
import math
import os
import stat
from dataclasses import dataclass, field, replace
from typing import Any, Iterable, Iterator, Mapping, Sequence

from verl_mopd.data.images import DataRoots
from verl_mopd.files import atomic_write, json_line
from verl_mopd.rewards.actions import (
    GRID_MAX,
    PLATFORMS,
    Action,
    ActionError,
    normalize_action,
    to_grid,
)

COORDS = ("pixel", "unit", "grid")
PARSE = "parse"  # the drop reason of an input line that never became a trajectory


class SchemaError(ValueError):
    """An input line or record that does not follow the schema; the message names the place and field.

    ``kind``: ``not_utf8``, ``not_json``, ``not_object``, ``schema`` or ``duplicate_id``.
    """

    def __init__(self, message: str, kind: str = "schema"):
        super().__init__(message)
        self.kind = kind


# ----------------------------------------------------------------------------- schema


@dataclass(frozen=True)
class Step:
    """One step: the screen (``screenshot``) and the action taken on it, in native coordinates.

    ``screenshot`` is the resolved path, or, when ``path_error`` is set, the path as given: it was
    refused (outside the data roots) and nothing may open it.
    """

    index: int
    screenshot: str
    action: Mapping[str, Any]
    thought: str = ""
    description: str = ""
    bbox: tuple[float, float, float, float] | None = None
    screen_size: tuple[int, int] | None = None
    path_error: str | None = None


@dataclass(frozen=True)
class Trajectory:
    """One task demonstration. See the module docstring for the JSON layout.

    ``origin`` (``"file:line"``, set by the readers) is where it was read; not part of the schema.
    """

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
    origin: str = field(default="", compare=False)

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


def _optional(d: Mapping, key: str, ok, expected: str, where: str) -> Any:
    """``d[key]`` when absent/null or ``ok(value)``; else a SchemaError naming it and ``expected``."""
    v = d.get(key)
    if v is not None and not ok(v):
        raise SchemaError(f"{where}.{key}={_short(v)}: expected {expected}")
    return v


def _strings(v: Any) -> bool:
    return isinstance(v, list) and all(isinstance(s, str) for s in v)


def _number(x: Any) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


def _size(v: Any, where: str) -> tuple[int, int] | None:
    if v is None:
        return None
    if not isinstance(v, (list, tuple)) or len(v) != 2 or not all(_number(x) and x >= 1 for x in v):
        raise SchemaError(f"{where}={_short(v)}: expected [width, height] in pixels, both >= 1")
    return (int(v[0]), int(v[1]))


def _box(v: Any, where: str) -> tuple[float, float, float, float] | None:
    """``[x1, y1, x2, y2]`` or ``[[x1, y1], [x2, y2]]``; ``None`` / ``[]`` for no box."""
    if v is None or (isinstance(v, (list, tuple)) and len(v) == 0):
        return None
    if isinstance(v, (list, tuple)) and len(v) == 2 and all(isinstance(c, (list, tuple)) and len(c) == 2 for c in v):
        v = [*v[0], *v[1]]
    if not isinstance(v, (list, tuple)) or len(v) != 4 or not all(_number(c) for c in v):
        raise SchemaError(f"{where}={_short(v)}: expected [x1, y1, x2, y2] or [[x1, y1], [x2, y2]]")
    x1, y1, x2, y2 = (float(c) for c in v)
    return (min(x1, x2), min(y1, y2), max(x1, x2), max(y1, y2))


def _data_roots(base_dir: str | DataRoots, roots: Sequence[str] = ()) -> DataRoots | None:
    if isinstance(base_dir, DataRoots):
        return base_dir
    return DataRoots.of(base_dir, roots) if base_dir else None


def step_from_dict(d: Mapping[str, Any], base_dir: str | DataRoots = "", where: str = "step") -> Step:
    """One step record; ``base_dir`` (a folder or :class:`DataRoots`) resolves and confines the
    screenshot path (no ``base_dir``: the path is taken as given, unchecked)."""
    if not isinstance(d, Mapping):
        raise SchemaError(f"{where}={_short(d)}: expected an object")
    index = _need(d, "index", int, where)
    shot = _need(d, "screenshot", str, where)
    action = _need(d, "action", Mapping, where)
    for key in ("thought", "description"):
        _optional(d, key, lambda v: isinstance(v, str), "a string", where)
    roots = _data_roots(base_dir)
    path, problem = roots.resolve(shot) if roots is not None else (shot, None)
    return Step(
        index=index,
        screenshot=path,
        action=dict(action),
        thought=d.get("thought") or "",
        description=d.get("description") or "",
        bbox=_box(d.get("bbox"), f"{where}.bbox"),
        screen_size=_size(d.get("screen_size"), f"{where}.screen_size"),
        path_error=problem,
    )


def trajectory_from_dict(
    d: Any, base_dir: str | DataRoots = "", where: str = "trajectory", roots: Sequence[str] = ()
) -> Trajectory:
    """Validate one JSON record. Relative screenshot paths join ``base_dir``; with a ``base_dir``,
    every path must resolve under it or under one of ``roots`` (see the module docstring)."""
    if not isinstance(d, Mapping):
        raise SchemaError(f"{where}={_short(d)}: expected a JSON object", "not_object")
    data_roots = _data_roots(base_dir, roots)
    tid = _need(d, "id", (str, int), where)
    where = f"{where}[id={tid!r}]"
    platform = _need(d, "platform", str, where)
    if platform not in PLATFORMS:
        raise SchemaError(f"{where}.platform={platform!r}: allowed {list(PLATFORMS)}")
    coords = d.get("coords", "pixel")
    if not isinstance(coords, str) or coords not in COORDS:
        raise SchemaError(f"{where}.coords={_short(coords)}: allowed {list(COORDS)}")
    steps = _need(d, "steps", list, where)
    subtasks = _optional(d, "subtasks", _strings, "a list of strings", where)
    judge = _optional(d, "judge", lambda v: isinstance(v, Mapping), "an object", where)
    mismatch = _optional(d, "env_mismatch", lambda v: isinstance(v, bool), "true, false or null", where)
    meta = _optional(d, "meta", lambda v: isinstance(v, Mapping), "an object", where)
    source = _optional(d, "source", lambda v: isinstance(v, str), "a string", where)
    return Trajectory(
        id=str(tid),
        platform=platform,
        instruction=_need(d, "instruction", str, where),
        steps=tuple(step_from_dict(s, data_roots or "", f"{where}.steps[{i}]") for i, s in enumerate(steps)),
        screen_size=_size(d.get("screen_size"), f"{where}.screen_size"),
        coords=coords,
        subtasks=tuple(subtasks) if subtasks is not None else None,
        judge=dict(judge) if judge is not None else None,
        env_mismatch=mismatch,
        source=source or "",
        meta=dict(meta or {}),
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


# ----------------------------------------------------------------------------- reading


@dataclass(frozen=True)
class Drop:
    """Why a trajectory (or an input line, rule ``parse``) was dropped.

    ``kind`` refines the rule (module docstring); ``detail`` is one line naming the step and field;
    ``where`` is the ``file:line`` it was read from, when known.
    """

    id: str
    platform: str
    rule: str
    detail: str
    num_steps: int
    kind: str = ""
    where: str = ""


def iter_jsonl(path: str) -> Iterator[tuple[str, Any]]:
    """``("file:line", value)`` for each non-blank line. A line that is not UTF-8 or not JSON gives
    a :class:`SchemaError` naming it in place of the value; reading goes on after it."""
    with open(path, "rb") as f:
        for lineno, raw in enumerate(f, 1):
            where = f"{path}:{lineno}"
            if lineno == 1 and raw.startswith(codecs.BOM_UTF8):
                raw = raw[len(codecs.BOM_UTF8) :]
            if not raw.strip():
                continue
            try:
                text = raw.decode("utf-8")
            except UnicodeDecodeError as e:
                at = f"byte 0x{raw[e.start]:02x} at column {e.start + 1}"
                yield where, SchemaError(f"{where}: not UTF-8 ({at})", "not_utf8")
                continue
            try:
                value = json.loads(text)
                if "\\u" in text:  # an escaped lone surrogate decodes, then cannot be written back as UTF-8
                    json.dumps(value, ensure_ascii=False).encode("utf-8")
            except UnicodeEncodeError:
                message = f"{where}: a string holds an unpaired UTF-16 surrogate (\\ud800-\\udfff)"
                yield where, SchemaError(message, "not_utf8")
            except (ValueError, RecursionError) as e:
                yield where, SchemaError(f"{where}: not JSON ({type(e).__name__}: {str(e)[:200]})", "not_json")
            else:
                yield where, value


def parse_drop(where: str, error: Exception, record: Any = None, *, id_key: str = "id", steps_key: str = "steps",
               platform: str | None = None, id_prefix: str = "") -> Drop:  # fmt: skip
    """The ``parse`` drop of a line that did not become a trajectory; id, platform and step count
    are taken from the record where it has them (else the id is ``where``, the platform "unknown")."""
    rec = record if isinstance(record, Mapping) else {}
    rid = rec.get(id_key)
    tid = f"{id_prefix}{rid}" if isinstance(rid, (str, int)) and not isinstance(rid, bool) else where
    if platform is None:
        p = rec.get("platform")
        platform = p if isinstance(p, str) and p in PLATFORMS else "unknown"
    steps = rec.get(steps_key)
    return Drop(tid, platform, PARSE, str(error), len(steps) if isinstance(steps, list) else 0,
                getattr(error, "kind", "schema"), where)  # fmt: skip


def read_jsonl(path: str, drops: list[Drop] | None = None, roots: Sequence[str] = ()) -> Iterator[Trajectory]:
    """Trajectories of a JSONL file in our schema; screenshots confined to the file's folder and ``roots``.

    A bad line raises :class:`SchemaError` naming ``path:line``, or, given ``drops``, is appended
    there as a ``parse`` drop and reading goes on.
    """
    data_roots = DataRoots.of(os.path.dirname(os.path.abspath(path)), roots)
    for where, record in iter_jsonl(path):
        try:
            if isinstance(record, SchemaError):
                raise record
            t = trajectory_from_dict(record, data_roots, where=where)
        except SchemaError as e:
            if drops is None:
                raise
            drops.append(parse_drop(where, e, None if isinstance(record, SchemaError) else record))
            continue
        yield replace(t, origin=where)


def drop_duplicate_ids(trajectories: Iterable[Trajectory], drops: list[Drop]) -> Iterator[Trajectory]:
    """The first trajectory of each id; every later one becomes a ``parse`` drop naming the first."""
    first: dict[str, str] = {}
    for t in trajectories:
        if t.id in first:
            at = t.origin or "input"
            detail = f"{at}: id {t.id!r} was already read at {first[t.id] or 'an earlier record'}"
            drops.append(Drop(t.id, t.platform, PARSE, detail, t.num_steps, "duplicate_id", t.origin))
            continue
        first[t.id] = t.origin
        yield t


def write_jsonl(trajectories: Iterable[Trajectory], path: str) -> int:
    """Write atomically (temp file + rename; no temp file is left on failure); returns the number written."""
    n = 0
    with atomic_write(path) as f:
        for t in trajectories:
            f.write(json_line(trajectory_to_dict(t)))
            n += 1
    return n


# ----------------------------------------------------------------------------- normalization


def screen_size_of(t: Trajectory, s: Step) -> tuple[int, int]:
    """The step's screen size: the step's own, the trajectory's, else read from the screenshot header."""
    if s.screen_size is not None:
        return s.screen_size
    if t.screen_size is not None:
        return t.screen_size
    if s.path_error:
        raise ActionError("no_screen_size", f"screen_size unknown and the screenshot {s.path_error}", "screen_size")
    from PIL import Image

    try:
        if not stat.S_ISREG(os.stat(s.screenshot).st_mode):  # a FIFO or device would block the open
            raise ValueError("not a regular file")
        with Image.open(s.screenshot) as im:
            return im.size
    except Exception as e:  # untrusted file: any decoder error means "unreadable"
        raise ActionError(
            "no_screen_size", f"screen_size unknown and the screenshot is unreadable: {e}", "screen_size"
        ) from None


def _to_grid_point(t: Trajectory, s: Step, value: Any, name: str) -> list[float]:
    if not isinstance(value, (list, tuple)) or len(value) != 2:
        raise ActionError("bad_type", f"{name}={_short(value)}: expected [x, y]", name)
    x, y = value
    if not (_number(x) and _number(y)):
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


__all__ = [
    "COORDS",
    "PARSE",
    "Drop",
    "SchemaError",
    "Step",
    "Trajectory",
    "drop_duplicate_ids",
    "iter_jsonl",
    "parse_drop",
    "read_jsonl",
    "screen_size_of",
    "step_action",
    "step_bbox",
    "step_from_dict",
    "trajectory_from_dict",
    "trajectory_to_dict",
    "write_jsonl",
]
