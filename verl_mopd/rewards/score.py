"""Partial-match task reward of UI-MOPD: fully correct +1.0, parseable but wrong -0.5, unparseable -1.0.

``compute_score`` is verl's custom reward function (``custom_reward_function.path/name``, its
keyword arguments from ``custom_reward_function.reward_kwargs``; verl 0.9.1 calls it from
``experimental/reward_loop/reward_manager/naive.py`` with ``data_source, solution_str,
ground_truth, extra_info`` and merges the ``reward_kwargs`` in, see
``trainer/ppo/reward.py::get_custom_reward_fn``). It returns the same keys for every sample,
because verl stacks each key across the batch (``agent_loop.py``: ``np.array([info[key] ...])``).

Two modes:

- ``mode="strict"`` (default): our alias-aware rules below.
- ``mode="ui_mopd"``: the public UI-MOPD release's reward, rule by rule (:mod:`.ui_mopd`).

"Fully correct" in strict mode, per action family (defaults from Qwen2.5-VL's AndroidControl
evaluation, also used by InfiGUI-R1: box enlarged x1.2, else distance <= 0.04 of the screen;
swipes shorter than 0.04 have no direction; text by normalized equality or edit similarity
>= 0.8, as AgentNetBench/OpenCUA; presets for AITW, OS-Atlas, GUI-R1, AgentNetBench in
:data:`PRESETS`):

- point (clicks, mouse_move, long_press): the point inside the ground-truth box when one is
  given (optionally also accepting the distance rule), else within ``point_tolerance`` of the
  ground-truth point on the normalized grid;
- swipe, and left_click_drag with ``coordinate2``: same direction (dominant axis and sign) and
  the start point matching; a drag given by its end point only compares that end point;
- scroll/hscroll: same sign of ``pixels``; type/answer/open/ask_user: normalized text;
- key: same set of canonical keys (order-insensitive, aliases resolved); mobile key and
  system_button: canonical name; terminate: status; wait: the action alone.

A different action, or any argument off, is partial; unparseable or invalid for the platform
is invalid. The three levels and every tolerance are :class:`ScoreConfig` fields.
"""

from __future__ import annotations

import json
import math
import unicodedata
from collections import Counter
from dataclasses import dataclass, field, fields, replace
from functools import lru_cache
from typing import Any, Iterable, Mapping

from rapidfuzz.distance import Levenshtein

from verl_mopd.rewards.actions import (
    ACTION_SPECS,
    GRID_MAX,
    TOOL_NAMES,
    Action,
    ActionError,
    _short,
    normalize_action,
    normalize_key,
    platform_of_tool,
    to_number,
)
from verl_mopd.rewards.parse import ParseConfig, ParseError, extract_call, parse_action
from verl_mopd.rewards.ui_mopd import label_string, release_parse, release_reward, release_thought_length

MODES = ("strict", "ui_mopd")
LEVELS = ("correct", "partial", "invalid")
_BAD_TRUTH = ("raise", "invalid")
# keyword arguments verl's reward managers may pass on their own; accepted and unused
_VERL_KWARGS = frozenset({"reward_router_address", "reward_model_tokenizer"})


@dataclass(frozen=True)
class ScoreConfig:
    """Reward levels and tolerances of strict mode. Distances are fractions of the screen
    (the 0-1000 grid divided by 1000).

    Attributes:
        correct, partial, invalid: the three reward levels.
        use_bbox: judge points by the ground-truth box when one is given.
        bbox_scale: box enlarged about its centre by this factor before the inside test.
        point_tolerance: distance rule radius (Euclidean, normalized grid).
        point_or_distance: with a box, also accept points within ``point_tolerance``.
        swipe_min_length: swipes (and two-point drags) shorter than this have no direction.
        swipe_check_end: also require a swipe's end to match (``bbox2``, else distance).
        scroll_check_point: also require a scroll's point to match when the truth has one.
        text_edit_similarity: accept ``1 - levenshtein / max_len >= this`` (None: off).
        text_f1: accept token F1 >= this (None: off).
        text_case_sensitive: compare text with case (default: case-folded).
        bad_truth: ``"raise"`` a ValueError naming the field for an unreadable ground truth
            (or an ``extra_info`` that is not a dict), or score the row ``"invalid"`` (reason
            ``invalid:ground_truth`` / ``invalid:extra_info``); ``"invalid"`` never raises on a
            malformed row, whatever is malformed in it.
    """

    correct: float = 1.0
    partial: float = -0.5
    invalid: float = -1.0
    use_bbox: bool = True
    bbox_scale: float = 1.2
    point_tolerance: float = 0.04
    point_or_distance: bool = False
    swipe_min_length: float = 0.04
    swipe_check_end: bool = False
    scroll_check_point: bool = False
    text_edit_similarity: float | None = 0.8
    text_f1: float | None = None
    text_case_sensitive: bool = False
    bad_truth: str = "raise"

    def __post_init__(self):
        errors = []
        for name in ("correct", "partial", "invalid", "bbox_scale", "point_tolerance", "swipe_min_length"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
                errors.append(f"{name}={v!r}: must be a finite number")
        if not errors and not (self.correct > self.partial >= self.invalid):
            errors.append(
                f"correct={self.correct}, partial={self.partial}, invalid={self.invalid}: need correct > partial >= invalid"
            )
        if not errors and (self.bbox_scale <= 0 or self.point_tolerance < 0 or self.swipe_min_length < 0):
            errors.append("bbox_scale must be > 0, point_tolerance and swipe_min_length >= 0")
        for name in ("text_edit_similarity", "text_f1"):
            v = getattr(self, name)
            if v is not None and (isinstance(v, bool) or not isinstance(v, (int, float)) or not 0 < v <= 1):
                errors.append(f"{name}={v!r}: must be None or in (0, 1]")
        if self.bad_truth not in _BAD_TRUTH:
            errors.append(f"bad_truth={self.bad_truth!r}: allowed {list(_BAD_TRUTH)}")
        if errors:
            raise ValueError("invalid reward config: " + "; ".join(errors))

    def level_score(self, level: str) -> float:
        return {"correct": self.correct, "partial": self.partial, "invalid": self.invalid}[level]


# Named presets for published evaluators (point rule, text rule): the evaluator is named above each.
PRESETS: Mapping[str, dict[str, Any]] = {
    # Qwen2.5-VL AndroidControl eval (also InfiGUI-R1): box x1.2, else 0.04; AgentNet-style text.
    "default": {},
    # AITW (Rawles et al. 2023): element box enlarged x1.4, or within 0.14.
    "aitw": {"bbox_scale": 1.4, "point_tolerance": 0.14, "point_or_distance": True, "text_edit_similarity": None},
    # OS-Atlas / UI-TARS evaluation: within 14% of the screen; text F1 > 0.5.
    "os_atlas": {"use_bbox": False, "point_tolerance": 0.14, "text_edit_similarity": None, "text_f1": 0.5},
    # GUI-R1 reward: inside the box, or within 140 of 1000; token F1 >= 0.5.
    "gui_r1": {
        "bbox_scale": 1.0,
        "point_tolerance": 0.14,
        "point_or_distance": True,
        "text_edit_similarity": None,
        "text_f1": 0.5,
    },
    # AgentNetBench (OpenCUA): in the box or within 0.0141; edit similarity >= 0.8.
    "agentnet": {"bbox_scale": 1.0, "point_tolerance": 0.0141, "point_or_distance": True},
}

_SCORE_FIELDS = frozenset(f.name for f in fields(ScoreConfig))
_PARSE_FIELDS = frozenset(f.name for f in fields(ParseConfig))


@lru_cache(maxsize=64)
def _configs(items: tuple[tuple[str, Any], ...]) -> tuple[ScoreConfig, ParseConfig]:
    kwargs = dict(items)
    preset = kwargs.pop("preset", "default")
    if preset not in PRESETS:
        raise ValueError(f"preset={preset!r}: allowed {list(PRESETS)}")
    unknown = set(kwargs) - _SCORE_FIELDS - _PARSE_FIELDS - _VERL_KWARGS
    if unknown:
        raise ValueError(
            f"unknown reward_kwargs {sorted(unknown)}; allowed: "
            f"{sorted(_SCORE_FIELDS | _PARSE_FIELDS | {'mode', 'preset'})}"
        )
    score_cfg = ScoreConfig(**{**PRESETS[preset], **{k: v for k, v in kwargs.items() if k in _SCORE_FIELDS}})
    parse_cfg = ParseConfig(**{k: v for k, v in kwargs.items() if k in _PARSE_FIELDS})
    return score_cfg, parse_cfg


def make_configs(**reward_kwargs: Any) -> tuple[ScoreConfig, ParseConfig]:
    """``(ScoreConfig, ParseConfig)`` from flat reward kwargs (``preset`` plus any field of either)."""
    try:
        return _configs(tuple(sorted(reward_kwargs.items())))
    except TypeError:  # unhashable values (e.g. OmegaConf lists): build uncached
        return _configs.__wrapped__(tuple(sorted(reward_kwargs.items())))


# ----------------------------------------------------------------------------- ground truth

Box = tuple[float, float, float, float]


@dataclass(frozen=True)
class Target:
    """One acceptable answer: the action and its boxes (0-1000 grid, ``x1 <= x2``, ``y1 <= y2``)."""

    action: Action
    bbox: Box | None = None
    bbox2: Box | None = None


@dataclass(frozen=True)
class GroundTruth:
    """A ground truth read from either layout.

    ``labels``: ``(tool-call label string, box dict)`` per answer, primary first, in the
    release's terms (what ``mode="ui_mopd"`` scores). ``raw``: our layout's action dicts, for
    strict mode; ``layout``: ``"json"`` or ``"tool_call"``.
    """

    platform: str
    layout: str
    primary: Any  # label string (release) or action dict (ours)
    bbox: Any = None
    bbox2: Any = None
    alternatives: tuple[tuple[Any, Any, Any], ...] = ()  # (label or action dict, bbox, bbox2)


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
    if isinstance(value, list) and len(value) == 2 and all(isinstance(c, list) and len(c) == 2 for c in value):
        value = [*value[0], *value[1]]
    if not isinstance(value, list) or len(value) != 4:
        raise ValueError(f"{field_name}={value!r}: expected [x1, y1, x2, y2] or [[x1, y1], [x2, y2]]")
    try:
        x1, y1, x2, y2 = (to_number(c, field_name) for c in value)
    except ActionError as e:
        raise ValueError(str(e)) from None
    if not all(0.0 <= c <= GRID_MAX for c in (x1, y1, x2, y2)):  # as a coordinate: an off-grid box would match any click
        raise ValueError(f"{field_name}={value!r}: outside the 0-{GRID_MAX} grid")
    return (min(x1, x2), min(y1, y2), max(x1, x2), max(y1, y2))


def _box_pairs(box: Box | None) -> list[list[float]] | None:
    return None if box is None else [[box[0], box[1]], [box[2], box[3]]]


def extra_mapping(extra_info: Any) -> Mapping:
    """``extra_info`` as a mapping (``None`` -> ``{}``); ValueError for anything else."""
    if extra_info is None:
        return {}
    if not isinstance(extra_info, Mapping):
        raise ValueError(f"extra_info={_short(extra_info)}: expected a dict or None, got {type(extra_info).__name__}")
    return extra_info


def _release_label(s: str, where: str = "ground_truth") -> dict:
    """A ``<tool_call>`` label string read the release's way; ValueError when it cannot be."""
    try:
        label = release_parse(s) if "</tool_call>" in s else None
    except (AttributeError, TypeError, RecursionError):  # the body decodes to a list, a string, ...
        label = None
    if label is None:
        raise ValueError(f"{where}={s[:200]!r}: not a readable <tool_call> label")
    return label


def read_ground_truth(ground_truth: Any, extra_info: Mapping | None = None) -> GroundTruth:
    """Read either layout; raises ValueError naming the field when it cannot.

    Ours: a dict or JSON string ``{"platform", "action": {"action": NAME, ...}, "bbox"?,
    "bbox2"?, "alternatives"?: [{"action", "bbox"?, "bbox2"?}]}``. The release's: a
    ``<tool_call>`` string, boxes in ``extra_info["bbox"/"bbox2"]``, an alternative in
    ``extra_info["other_label"/"other_bbox"/"other_bbox2"]``. ``extra_info`` must be a dict or None.
    """
    extra = extra_mapping(extra_info)
    gt = ground_truth
    if isinstance(gt, str):
        s = gt.strip()
        if "<tool_call>" in s:
            label = _release_label(s)
            name = label.get("name")
            platform = platform_of_tool(name) if isinstance(name, str) else None
            if platform is None:
                raise ValueError(f"ground_truth tool name={name!r}: allowed {list(TOOL_NAMES.values())}")
            alts = ()
            if extra.get("other_label"):
                alts = ((extra["other_label"], extra.get("other_bbox"), extra.get("other_bbox2")),)
            return GroundTruth(platform, "tool_call", s, extra.get("bbox"), extra.get("bbox2"), alts)
        try:
            gt = json.loads(s)
        except (ValueError, RecursionError):
            raise ValueError(f"ground_truth={s[:200]!r}: neither JSON nor a <tool_call> string") from None
    if not isinstance(gt, dict):
        raise ValueError(f"ground_truth is a {type(gt).__name__}; expected a dict, JSON string or <tool_call>")
    platform = gt.get("platform")
    if not isinstance(platform, str) or platform not in ACTION_SPECS:
        raise ValueError(f"ground_truth.platform={platform!r}: allowed {list(ACTION_SPECS)}")
    action = gt.get("action")
    if not isinstance(action, dict):
        raise ValueError(f"ground_truth.action={action!r}: expected {{'action': NAME, ...args}}")
    raw_alts = to_plain(gt.get("alternatives"))
    if raw_alts is not None and not isinstance(raw_alts, list):
        raise ValueError(f"ground_truth.alternatives={_short(raw_alts)}: expected a list of {{'action': {{...}}, 'bbox'?: ...}}")
    alts = []
    for i, alt in enumerate(raw_alts or ()):
        if not isinstance(alt, dict) or not isinstance(alt.get("action"), dict):
            raise ValueError(f"ground_truth.alternatives[{i}]={alt!r}: expected {{'action': {{...}}, 'bbox'?: ...}}")
        alts.append((alt["action"], alt.get("bbox"), alt.get("bbox2")))
    bbox = gt["bbox"] if "bbox" in gt else extra.get("bbox")
    bbox2 = gt["bbox2"] if "bbox2" in gt else extra.get("bbox2")
    return GroundTruth(platform, "json", action, bbox, bbox2, tuple(alts))


def _target(platform: str, label: Any, bbox: Any, bbox2: Any, where: str) -> Target:
    if isinstance(label, str):  # a release label string
        call = extract_call(label)
        if isinstance(call, ParseError):
            raise ValueError(f"{where}: {call.message}")
        label = call["arguments"]
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


# ----------------------------------------------------------------------------- strict matching


def _dist(a: tuple[float, float], b: tuple[float, float]) -> float:
    return math.hypot(a[0] - b[0], a[1] - b[1]) / 1000.0


def _in_scaled_box(p: tuple[float, float], box: Box, scale: float) -> bool:
    cx, cy = (box[0] + box[2]) / 2, (box[1] + box[3]) / 2
    hw, hh = (box[2] - box[0]) * scale / 2, (box[3] - box[1]) * scale / 2
    return cx - hw <= p[0] <= cx + hw and cy - hh <= p[1] <= cy + hh


def point_match(pred: tuple[float, float] | None, truth: tuple[float, float] | None, box: Box | None, cfg: ScoreConfig) -> bool:
    """Inside the (enlarged) box when one is given, else within ``point_tolerance`` of ``truth``."""
    if truth is None and (box is None or not cfg.use_bbox):
        return pred is None
    if pred is None:
        return False
    if box is not None and cfg.use_bbox:
        if _in_scaled_box(pred, box, cfg.bbox_scale):
            return True
        if not cfg.point_or_distance or truth is None:
            return False
    return _dist(pred, truth) <= cfg.point_tolerance


def direction(start: tuple[float, float], end: tuple[float, float], min_length: float) -> tuple[str, int]:
    """Finger direction: ``("x"|"y", sign)`` on the dominant axis, ``("none", 0)`` if shorter than min_length."""
    dx, dy = end[0] - start[0], end[1] - start[1]
    if math.hypot(dx, dy) / 1000.0 < min_length:
        return ("none", 0)
    if abs(dx) >= abs(dy):
        return ("x", 1 if dx > 0 else -1)
    return ("y", 1 if dy > 0 else -1)


def normalize_text(s: str, case_sensitive: bool = False) -> str:
    """NFKC, case-folded (unless ``case_sensitive``), whitespace collapsed and stripped."""
    s = unicodedata.normalize("NFKC", s)
    if not case_sensitive:
        s = s.casefold()
    return " ".join(s.split())


def edit_similarity(a: str, b: str) -> float:
    """``1 - levenshtein(a, b) / max(len)``; 1.0 for two empty strings.

    rapidfuzz's bit-parallel Levenshtein (unit costs, the same normalization): ~0.1 ms for two
    2000-character texts, where a Python dynamic programme takes seconds.
    """
    return Levenshtein.normalized_similarity(a, b)


def token_f1(a: str, b: str) -> float:
    ta, tb = a.split(), b.split()
    if not ta or not tb:
        return float(ta == tb)
    common = sum((Counter(ta) & Counter(tb)).values())
    if common == 0:
        return 0.0
    p, r = common / len(ta), common / len(tb)
    return 2 * p * r / (p + r)


_MAX_EDIT_CHARS = 2000  # longer texts compare by equality / F1 only (bounds the edit-distance work)


def text_match(pred: str | None, truth: str | None, cfg: ScoreConfig) -> bool:
    if pred is None or truth is None:
        return pred is truth
    a, b = normalize_text(pred, cfg.text_case_sensitive), normalize_text(truth, cfg.text_case_sensitive)
    if a == b:
        return True
    if not a or not b:
        return False
    t = cfg.text_edit_similarity
    if t is not None and min(len(a), len(b)) / max(len(a), len(b)) >= t and max(len(a), len(b)) <= _MAX_EDIT_CHARS:
        if Levenshtein.normalized_similarity(a, b, score_cutoff=t) >= t:
            return True
    return cfg.text_f1 is not None and token_f1(a, b) >= cfg.text_f1


def _drag_fields(p: Action, t: Target, cfg: ScoreConfig) -> dict[str, bool]:
    ta = t.action
    if ta.coordinate2 is None:  # end point only (start = the cursor)
        end = p.coordinate2 if p.coordinate2 is not None else p.coordinate
        return {"coordinate": point_match(end, ta.coordinate, t.bbox, cfg)}
    if p.coordinate is None or p.coordinate2 is None:
        return {"direction": False, "coordinate": False}
    return {
        "direction": direction(p.coordinate, p.coordinate2, cfg.swipe_min_length)
        == direction(ta.coordinate, ta.coordinate2, cfg.swipe_min_length),
        "coordinate": point_match(p.coordinate, ta.coordinate, t.bbox, cfg),
    }


def _sign(v: float | None) -> int:
    return 0 if v is None else (v > 0) - (v < 0)


def field_matches(p: Action, t: Target, cfg: ScoreConfig) -> dict[str, bool]:
    """Per-argument verdicts for a prediction whose action equals the target's."""
    ta, family = t.action, t.action.family
    if family == "point":
        return {"coordinate": point_match(p.coordinate, ta.coordinate, t.bbox, cfg)}
    if family == "swipe":
        out = {
            "direction": direction(p.coordinate, p.coordinate2, cfg.swipe_min_length)
            == direction(ta.coordinate, ta.coordinate2, cfg.swipe_min_length),
            "coordinate": point_match(p.coordinate, ta.coordinate, t.bbox, cfg),
        }
        if cfg.swipe_check_end:
            out["coordinate2"] = point_match(p.coordinate2, ta.coordinate2, t.bbox2, cfg)
        return out
    if family == "drag":
        return _drag_fields(p, t, cfg)
    if family == "scroll":
        out = {"pixels": _sign(p.pixels) == _sign(ta.pixels)}
        if cfg.scroll_check_point and ta.coordinate is not None:
            out["coordinate"] = point_match(p.coordinate, ta.coordinate, t.bbox, cfg)
        return out
    if family == "text":
        return {"text": text_match(p.text, ta.text, cfg)}
    if family == "keys":
        return {"keys": frozenset(p.keys or ()) == frozenset(ta.keys or ())}
    if family == "key_text":
        return {"text": normalize_key(p.text or "") == normalize_key(ta.text or "")}
    if family == "button":
        return {"button": p.button == ta.button}
    if family == "status":
        return {"status": p.status == ta.status}
    return {}  # wait: the action alone


@dataclass(frozen=True)
class ScoreResult:
    """The verdict for one prediction. ``fields``: per-argument verdicts (empty unless the action matched)."""

    level: str
    score: float
    action_match: bool
    args_match: bool
    reason: str
    fields: Mapping[str, bool] = field(default_factory=dict)


def score_action(
    pred: Action | ParseError, truth: Target | Action, platform: str | None = None, config: ScoreConfig | None = None
) -> ScoreResult:
    """Score a parsed prediction against one target (strict rules).

    Args:
        pred: from :func:`~verl_mopd.rewards.parse.parse_action`.
        truth: a :class:`Target` (or a bare :class:`Action`, scored without boxes).
        platform: if given, must equal the truth's platform.
        config: tolerances and levels (default :class:`ScoreConfig()`).
    """
    cfg = config or ScoreConfig()
    target = truth if isinstance(truth, Target) else Target(truth)
    if platform is not None and platform != target.action.platform:
        raise ValueError(f"platform={platform!r} but the ground truth is a {target.action.platform} action")
    if isinstance(pred, ParseError):
        return ScoreResult("invalid", cfg.invalid, False, False, f"invalid:{pred.reason}")
    if pred.platform != target.action.platform:
        return ScoreResult("invalid", cfg.invalid, False, False, "invalid:wrong_platform")
    if pred.action != target.action.action:
        return ScoreResult("partial", cfg.partial, False, False, "partial:action")
    verdicts = field_matches(pred, target, cfg)
    wrong = [k for k, ok in verdicts.items() if not ok]
    if wrong:
        return ScoreResult("partial", cfg.partial, True, False, f"partial:{wrong[0]}", verdicts)
    return ScoreResult("correct", cfg.correct, True, True, "ok", verdicts)


_RANK = {"correct": 2, "partial": 1, "invalid": 0}


def _result_dict(score: float, acc: bool, thought: int, parsed: bool, am: bool, args: bool, reason: str, platform: str) -> dict:
    return {
        "score": float(score),
        "acc": 1.0 if acc else 0.0,
        "thought_length": int(thought),
        "parsed": 1.0 if parsed else 0.0,
        "action_match": 1.0 if am else 0.0,
        "args_match": 1.0 if args else 0.0,
        "reason": reason,
        "platform": platform,
    }


def _strict(solution_str: Any, targets: list[Target], score_cfg: ScoreConfig, parse_cfg: ParseConfig, thought: int) -> dict:
    platform = targets[0].action.platform
    pred = parse_action(solution_str, platform, parse_cfg)
    best = score_action(pred, targets[0], config=score_cfg)
    if best.level == "partial":  # an alternative answer may still make it correct
        for t in targets[1:]:
            r = score_action(pred, t, config=score_cfg)
            if r.level == "correct":
                best = replace(r, reason="ok:alternative")
                break
    parsed = not isinstance(pred, ParseError)
    return _result_dict(
        best.score, best.level == "correct", thought, parsed, best.action_match, best.args_match, best.reason, platform
    )


def _ui_mopd(solution_str: Any, ground_truth: Any, extra_info: Mapping | None, thought: int) -> dict:
    text = solution_str if isinstance(solution_str, str) else ""
    gt = to_plain(ground_truth)
    if isinstance(gt, str) and not gt.lstrip().startswith("{"):  # the release's own layout, as it reads it
        r = release_reward(text, gt, extra_info)
        try:
            label = release_parse(gt)
        except Exception:
            label = None
        name = label.get("name") if isinstance(label, dict) else None
        platform = (platform_of_tool(name) if isinstance(name, str) else None) or "unknown"
    else:
        gt = read_ground_truth(gt, extra_info)
        tool = TOOL_NAMES[gt.platform]
        extra = dict(extra_info or {})
        extra["bbox"] = _box_pairs(read_box(gt.bbox, "ground_truth.bbox"))
        extra["bbox2"] = _box_pairs(read_box(gt.bbox2, "ground_truth.bbox2"))
        alternatives = tuple(
            (
                label_string(tool, a),
                {
                    "bbox": _box_pairs(read_box(b1, "alternatives.bbox")),
                    "bbox2": _box_pairs(read_box(b2, "alternatives.bbox2")),
                },
            )
            for a, b1, b2 in gt.alternatives
        )
        r = release_reward(text, label_string(tool, gt.primary), extra, alternatives)
        platform = gt.platform
    score, reason = r["score"], r["reason"]
    action_match = score == 1.0 or reason == "partial:args"
    return _result_dict(score, score == 1.0, thought, r["pred"] is not None, action_match, score == 1.0, reason, platform)


def compute_score(
    data_source: Any = None,
    solution_str: Any = "",
    ground_truth: Any = None,
    extra_info: Mapping | None = None,
    mode: str = "strict",
    **reward_kwargs: Any,
) -> dict:
    """verl custom reward: score one decoded response against its ground truth.

    Args:
        data_source: unused (verl groups validation metrics by it).
        solution_str: the decoded response (verl decodes with ``skip_special_tokens=True``;
            Qwen3's ``<think>``/``<tool_call>`` are not special tokens, so they survive).
        ground_truth: our JSON layout (dict or string) or the release's ``<tool_call>`` string.
        extra_info: the dataset row's ``extra_info``; ``bbox``/``bbox2``/``other_*`` for the
            release's layout, ``tokenizer`` to count ``thought_length`` in tokens.
        mode: ``"strict"`` or ``"ui_mopd"``.
        **reward_kwargs: ``preset`` and any :class:`ScoreConfig` / :class:`ParseConfig` field
            (strict mode only; ``ui_mopd`` mode takes none, to reproduce the release exactly).

    Returns:
        ``score``, ``acc`` (1.0 iff fully correct), ``thought_length``, ``parsed``,
        ``action_match``, ``args_match`` (floats 0/1), ``reason`` and ``platform`` (strings).
        Always the same keys.
    """
    if mode not in MODES:
        raise ValueError(f"mode={mode!r}: allowed {list(MODES)}")
    user_kwargs = {k: v for k, v in reward_kwargs.items() if k not in _VERL_KWARGS}
    if mode == "ui_mopd" and user_kwargs:
        raise ValueError(
            f"mode='ui_mopd' reproduces the release and takes no tolerances; got {sorted(user_kwargs)}"
        )
    score_cfg, parse_cfg = make_configs(**user_kwargs)
    thought = release_thought_length(solution_str, extra_info)
    try:
        extra = extra_mapping(extra_info)
        if mode == "ui_mopd":  # the release's outer try: anything unreadable in the row scores -1.0
            return _ui_mopd(solution_str, ground_truth, extra, thought)
        targets = strict_targets(read_ground_truth(ground_truth, extra))
    except MemoryError:
        raise
    except Exception as e:  # noqa: BLE001 - a malformed row, whatever the type error it trips
        if mode == "strict" and score_cfg.bad_truth == "raise":
            if isinstance(e, ValueError):
                raise
            raise ValueError(f"unreadable ground truth or extra_info ({type(e).__name__}: {e})") from e
        invalid = score_cfg.invalid if mode == "strict" else -1.0
        reason = "invalid:extra_info" if extra_info is not None and not isinstance(extra_info, Mapping) else "invalid:ground_truth"
        return _result_dict(invalid, False, thought, False, False, False, reason, "unknown")
    return _strict(solution_str, targets, score_cfg, parse_cfg, thought)


def summarize(results: Iterable[Mapping[str, Any]]) -> dict[str, dict[str, Any]]:
    """Aggregate :func:`compute_score` outputs per platform (and ``"all"``).

    Returns ``{platform: {"n", "score", "acc", "parsed", "correct", "partial", "invalid", "reasons"}}``
    with means for the numbers, level counts, and a reason histogram (most common first).
    """
    groups: dict[str, list[Mapping[str, Any]]] = {}
    for r in results:
        groups.setdefault(r.get("platform", "unknown"), []).append(r)
        groups.setdefault("all", []).append(r)
    out = {}
    for platform, rs in groups.items():
        n = len(rs)
        reasons = Counter(r["reason"] for r in rs)
        out[platform] = {
            "n": n,
            "score": sum(r["score"] for r in rs) / n,
            "acc": sum(r["acc"] for r in rs) / n,
            "parsed": sum(r["parsed"] for r in rs) / n,
            "correct": sum(1 for r in rs if r["acc"] == 1.0),
            "partial": sum(1 for r in rs if r["reason"].startswith("partial")),
            "invalid": sum(1 for r in rs if r["reason"].startswith("invalid")),
            "reasons": dict(reasons.most_common()),
        }
    return out


__all__ = [
    "MODES",
    "PRESETS",
    "GroundTruth",
    "ScoreConfig",
    "ScoreResult",
    "Target",
    "compute_score",
    "make_configs",
    "read_ground_truth",
    "score_action",
    "strict_targets",
    "summarize",
]
