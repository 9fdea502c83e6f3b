"""Ground truths as verl hands them to the reward: the two layouts, told apart by structure.

- **Ours**: a mapping, or a string that is one whole JSON object:
  ``{"platform", "action": {"action": NAME, ...}, "bbox"?, "bbox2"?, "alternatives"?: [{"action",
  "bbox"?, "bbox2"?}]}``, boxes on the 0-1000 grid as ``[x1, y1, x2, y2]`` or
  ``[[x1, y1], [x2, y2]]``; a box the ground truth does not name is taken from ``extra_info``.
  ``verl-mopd prepare`` writes it as a JSON string.
- **The release's** (github.com/EliSpectre/UI-MOPD): any other string. Its label is its first
  ``<tool_call>...</tool_call>`` block wherever it stands, read as the release reads it
  (:func:`~verl_mopd.rewards.ui_mopd.release_call`); boxes in ``extra_info["bbox"/"bbox2"]``, an
  alternative in ``extra_info["other_label"/"other_bbox"/"other_bbox2"]``.

:func:`ground_truth_layout` decides by the JSON grammar alone, so what a label's text holds (a
``type`` action whose text mentions ``<tool_call>``, a prefix before the release's block) never
changes which reader reads it. Both modes of :func:`~verl_mopd.rewards.score.compute_score` read
both layouts through this module.

The row shapes verl produces: ``ground_truth`` a string (``RLHFDataset`` reads parquet through
``datasets``, which gives Python lists) or, from pandas-based readers (``trainer/main_eval.py``),
a dict whose lists are numpy arrays; ``extra_info`` a dict (``RLHFDataset`` replaces a missing
one by ``{}``) or None (``main_eval`` passes none). :func:`to_plain` makes numpy values plain.

Reading is memoized per ground-truth string (:data:`CACHE_SIZE` strings), since verl scores
every prompt ``rollout.n`` times; a memoized reading is shared, so treat what
:func:`read_ground_truth` returns as read-only.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import lru_cache
from typing import Any, Mapping

from verl_mopd.rewards.actions import (
    ACTION_SPECS,
    GRID_MAX,
    TOOL_NAMES,
    Action,
    ActionError,
    _short,
    normalize_action,
    platform_of_tool,
    to_number,
)
from verl_mopd.rewards.ui_mopd import release_call

CACHE_SIZE = 4096  # ground-truth strings kept read (a step's prompts, several steps over)

Box = tuple[float, float, float, float]


@dataclass(frozen=True)
class Target:
    """One acceptable answer: the action and its boxes (0-1000 grid, ``x1 <= x2``, ``y1 <= y2``)."""

    action: Action
    bbox: Box | None = None
    bbox2: Box | None = None


@dataclass(frozen=True)
class GroundTruth:
    """A ground truth read from either layout (see the module docstring).

    ``primary``: our layout's action dict, or the release's label string. ``bbox``/``bbox2``:
    the boxes as given (ours: the ground truth's own, else ``extra_info``'s; the release's:
    ``extra_info``'s). ``alternatives``: ``(action dict or label string, bbox, bbox2)`` per
    further answer (our ``alternatives``; the release's ``other_label``). ``boxes_from_extra``:
    whether ``bbox``/``bbox2`` are ``extra_info``'s.
    """

    platform: str
    layout: str
    primary: Any
    bbox: Any = None
    bbox2: Any = None
    alternatives: tuple[tuple[Any, Any, Any], ...] = ()
    boxes_from_extra: tuple[bool, bool] = (False, False)


def to_plain(v: Any) -> Any:
    """numpy arrays/scalars (parquet struct columns) -> Python lists/numbers; str and bytes stay."""
    if isinstance(v, dict):
        return {k: to_plain(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [to_plain(x) for x in v]
    if hasattr(v, "tolist") and not isinstance(v, str):
        return to_plain(v.tolist())
    return v


def read_box(value: Any, field_name: str) -> Box | None:
    """``[x1, y1, x2, y2]`` or ``[[x1, y1], [x2, y2]]`` on the 0-1000 grid -> ordered box; None for none.

    Raises ValueError naming ``field_name`` for anything else, off-grid corners included.
    """
    if value is None:
        return None
    if not isinstance(value, list):
        value = to_plain(value)
    if isinstance(value, list) and len(value) == 0:
        return None
    if (
        isinstance(value, list)
        and len(value) == 2
        and all(isinstance(c, list) and len(c) == 2 for c in value)
    ):
        value = [*value[0], *value[1]]
    if not isinstance(value, list) or len(value) != 4:
        raise ValueError(f"{field_name}={value!r}: expected [x1, y1, x2, y2] or [[x1, y1], [x2, y2]]")
    try:
        x1, y1, x2, y2 = (to_number(c, field_name) for c in value)
    except ActionError as e:
        raise ValueError(str(e)) from None
    if not all(
        0.0 <= c <= GRID_MAX for c in (x1, y1, x2, y2)
    ):  # as a coordinate: an off-grid box would match any click
        raise ValueError(f"{field_name}={value!r}: outside the 0-{GRID_MAX} grid")
    return (min(x1, x2), min(y1, y2), max(x1, x2), max(y1, y2))


def box_pairs(box: Box | None) -> list[list[float]] | None:
    """A box as the release writes one, ``[[x1, y1], [x2, y2]]``."""
    return None if box is None else [[box[0], box[1]], [box[2], box[3]]]


def extra_mapping(extra_info: Any) -> Mapping:
    """``extra_info`` as a mapping (``None`` -> ``{}``); ValueError for anything else."""
    if extra_info is None:
        return {}
    if not isinstance(extra_info, Mapping):
        raise ValueError(
            f"extra_info={_short(extra_info)}: expected a dict or None, got {type(extra_info).__name__}"
        )
    return extra_info


_NOT_JSON = object()


def _whole_json_object(s: str) -> Any:
    t = s.strip()
    if t[:1] != "{":
        return _NOT_JSON
    try:
        return json.loads(t)
    except (ValueError, RecursionError):
        return _NOT_JSON


def ground_truth_layout(ground_truth: Any) -> tuple[str, Any]:
    """The layout of a ground truth, by its structure alone: ``("json", value)`` or ``("tool_call", string)``.

    Ours: a mapping (numpy values made plain) or a string that is one whole JSON object
    (decoded). The release's: any other string, returned as it is. Any other value comes back as
    ``("json", value)`` for :func:`read_ground_truth` to refuse by its type.
    """
    if not isinstance(ground_truth, str):
        ground_truth = to_plain(ground_truth)
        if not isinstance(ground_truth, str):
            return "json", ground_truth
    obj = _whole_json_object(ground_truth)
    return ("tool_call", ground_truth) if obj is _NOT_JSON else ("json", obj)


@lru_cache(maxsize=CACHE_SIZE)
def string_layout(s: str) -> str:
    """:func:`ground_truth_layout`'s verdict for a string, memoized: ``"json"`` or ``"tool_call"``."""
    return "tool_call" if _whole_json_object(s) is _NOT_JSON else "json"


def release_label(s: str, where: str = "ground_truth") -> tuple[Any, dict]:
    """``(tool name, arguments)`` of a label string read the release's way; ValueError when it cannot be."""
    try:
        call = release_call(s)
    except (AttributeError, RecursionError):  # the block decodes to a list, a string, ...
        call = None
    if call is None:
        what = "not a readable <tool_call> label"
        if s.strip()[:1] == "{":  # meant as our layout, most likely: say why the JSON did not decode
            try:
                json.loads(s.strip())
            except (ValueError, RecursionError) as e:
                what = f"neither one whole JSON object ({e}) nor a readable <tool_call> label"
        raise ValueError(f"{where}={s[:200]!r}: {what}")
    return call


def _read_ours(gt: Any) -> GroundTruth:
    if not isinstance(gt, dict):
        raise ValueError(
            f"ground_truth is a {type(gt).__name__}; expected a dict, a JSON object string or a <tool_call> string"
        )
    platform = gt.get("platform")
    if not isinstance(platform, str) or platform not in ACTION_SPECS:
        raise ValueError(f"ground_truth.platform={platform!r}: allowed {list(ACTION_SPECS)}")
    action = gt.get("action")
    if not isinstance(action, dict):
        raise ValueError(f"ground_truth.action={action!r}: expected {{'action': NAME, ...args}}")
    raw_alts = gt.get("alternatives")
    if raw_alts is not None and not isinstance(raw_alts, list):
        raise ValueError(
            f"ground_truth.alternatives={_short(raw_alts)}: expected a list of {{'action': {{...}}, 'bbox'?: ...}}"
        )
    alts = []
    for i, alt in enumerate(raw_alts or ()):
        if not isinstance(alt, dict) or not isinstance(alt.get("action"), dict):
            raise ValueError(
                f"ground_truth.alternatives[{i}]={alt!r}: expected {{'action': {{...}}, 'bbox'?: ...}}"
            )
        alts.append((alt["action"], alt.get("bbox"), alt.get("bbox2")))
    return GroundTruth(
        platform,
        "json",
        action,
        gt.get("bbox"),
        gt.get("bbox2"),
        tuple(alts),
        ("bbox" not in gt, "bbox2" not in gt),
    )


def _read_release(s: str) -> GroundTruth:
    name = release_label(s)[0]
    platform = platform_of_tool(name) if isinstance(name, str) else None
    if platform is None:
        raise ValueError(f"ground_truth tool name={name!r}: allowed {list(TOOL_NAMES.values())}")
    return GroundTruth(platform, "tool_call", s, boxes_from_extra=(True, True))


def _read_alone(ground_truth: Any) -> GroundTruth:
    layout, value = ground_truth_layout(ground_truth)
    return _read_release(value) if layout == "tool_call" else _read_ours(value)


_read_string = lru_cache(maxsize=CACHE_SIZE)(_read_alone)


def _with_extra(gt: GroundTruth, extra: Mapping) -> GroundTruth:
    """What ``extra_info`` adds: the boxes the ground truth leaves to it; ``other_label`` (release layout)."""
    from_bbox, from_bbox2 = gt.boxes_from_extra
    bbox = extra.get("bbox") if from_bbox else gt.bbox
    bbox2 = extra.get("bbox2") if from_bbox2 else gt.bbox2
    alts = gt.alternatives
    if gt.layout == "tool_call" and extra.get("other_label"):
        alts = ((extra["other_label"], extra.get("other_bbox"), extra.get("other_bbox2")),)
    if bbox is gt.bbox and bbox2 is gt.bbox2 and alts is gt.alternatives:
        return gt
    return GroundTruth(gt.platform, gt.layout, gt.primary, bbox, bbox2, alts, gt.boxes_from_extra)


def adds_nothing(gt: GroundTruth, extra: Mapping) -> bool:
    """True when ``extra_info`` changes nothing in ``gt`` (read without it)."""
    from_bbox, from_bbox2 = gt.boxes_from_extra
    return not (
        (from_bbox and extra.get("bbox") is not None)
        or (from_bbox2 and extra.get("bbox2") is not None)
        or (gt.layout == "tool_call" and extra.get("other_label"))
    )


def read_ground_truth(ground_truth: Any, extra_info: Mapping | None = None) -> GroundTruth:
    """Read either layout (see the module docstring); raises ValueError naming the field when it cannot.

    ``extra_info`` must be a dict or None. The reading of a string may be shared (memoized): do
    not mutate it.
    """
    extra = extra_mapping(extra_info)
    gt = _read_string(ground_truth) if isinstance(ground_truth, str) else _read_alone(ground_truth)
    return _with_extra(gt, extra)


def _target(platform: str, label: Any, bbox: Any, bbox2: Any, where: str) -> Target:
    if isinstance(label, str):  # a label string, read the release's way
        label = release_label(label, where)[1]
    elif not isinstance(label, Mapping):
        raise ValueError(f"{where}={_short(label)}: expected an action object or a <tool_call> string")
    try:
        action = normalize_action(platform, label)
    except ActionError as e:
        raise ValueError(f"{where}.action: {e}") from None
    return Target(action, read_box(bbox, f"{where}.bbox"), read_box(bbox2, f"{where}.bbox2"))


def strict_targets(gt: GroundTruth) -> list[Target]:
    """The primary answer and the alternatives as validated :class:`Target`s."""
    targets = [_target(gt.platform, gt.primary, gt.bbox, gt.bbox2, "ground_truth")]
    for i, (label, b1, b2) in enumerate(gt.alternatives):
        targets.append(_target(gt.platform, label, b1, b2, f"alternatives[{i}]"))
    return targets


@lru_cache(maxsize=CACHE_SIZE)
def _string_targets(s: str) -> tuple[str, tuple[Target, ...]]:
    gt = _read_string(s)
    return gt.platform, tuple(strict_targets(gt))


def targets_of(ground_truth: Any, extra: Mapping) -> tuple[str, tuple[Target, ...] | list[Target]]:
    """``(platform, strict_targets(read_ground_truth(ground_truth, extra)))``, memoized per string."""
    if isinstance(ground_truth, str) and adds_nothing(_read_string(ground_truth), extra):
        return _string_targets(ground_truth)
    gt = read_ground_truth(ground_truth, extra)
    return gt.platform, strict_targets(gt)


__all__ = [
    "CACHE_SIZE",
    "Box",
    "GroundTruth",
    "Target",
    "adds_nothing",
    "box_pairs",
    "extra_mapping",
    "ground_truth_layout",
    "read_box",
    "read_ground_truth",
    "release_label",
    "strict_targets",
    "string_layout",
    "targets_of",
    "to_plain",
]
