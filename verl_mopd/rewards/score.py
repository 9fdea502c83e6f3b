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

import math
import unicodedata
from collections import Counter
from dataclasses import dataclass, field, fields
from functools import lru_cache
from typing import Any, Iterable, Mapping, Sequence

from rapidfuzz.distance import Levenshtein

from verl_mopd.errors import ConfigError
from verl_mopd.rewards.actions import TOOL_NAMES, Action, normalize_key, platform_of_tool
from verl_mopd.rewards.parse import DEFAULT_PARSE_CONFIG, ParseConfig, ParseError, parse_action
from verl_mopd.rewards.truth import (
    CACHE_SIZE,
    Box,
    GroundTruth,
    Target,
    adds_nothing,
    box_pairs,
    extra_mapping,
    read_box,
    read_ground_truth,
    strict_targets,
    string_layout,
    targets_of,
    to_plain,
)
from verl_mopd.rewards.ui_mopd import flatten, read_label, release_reward, release_thought_length

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
            raise ConfigError(errors, "reward config")

    def level_score(self, level: str) -> float:
        if level not in LEVELS:
            raise KeyError(f"level={level!r}: allowed {list(LEVELS)}")
        return getattr(self, level)


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
    longest = max(len(a), len(b))
    if t is not None and min(len(a), len(b)) / longest >= t and longest <= _MAX_EDIT_CHARS:
        # 1 - d / longest >= t  <=>  d <= (1 - t) * longest, in whole edits (rapidfuzz's float score_cutoff
        # refuses a similarity exactly at t: 0.8 for "abcd" / "abcde" at t = 0.8)
        allowed = math.floor((1.0 - t) * longest + 1e-9)
        if Levenshtein.distance(a, b, score_cutoff=allowed) <= allowed:
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


def _judge(pred: Action | ParseError, target: Target, cfg: ScoreConfig) -> tuple[str, str, bool, dict[str, bool]]:
    """``(level, reason, action_match, verdicts)`` of one prediction against one target."""
    if isinstance(pred, ParseError):
        return "invalid", f"invalid:{pred.reason}", False, {}
    if pred.platform != target.action.platform:
        return "invalid", "invalid:wrong_platform", False, {}
    if pred.action != target.action.action:
        return "partial", "partial:action", False, {}
    verdicts = field_matches(pred, target, cfg)
    for k, ok in verdicts.items():
        if not ok:
            return "partial", f"partial:{k}", True, verdicts
    return "correct", "ok", True, verdicts


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
    cfg = config or _DEFAULT_SCORE
    target = truth if isinstance(truth, Target) else Target(truth)
    if platform is not None and platform != target.action.platform:
        raise ValueError(f"platform={platform!r} but the ground truth is a {target.action.platform} action")
    level, reason, action_match, verdicts = _judge(pred, target, cfg)
    return ScoreResult(level, cfg.level_score(level), action_match, level == "correct", reason, verdicts)


def _result(score: float, acc: bool, thought: int, parsed: bool, am: bool, args: bool, reason: str, platform: str) -> dict:
    return {
        "score": float(score),
        "acc": 1.0 if acc else 0.0,
        "thought_length": thought,
        "parsed": 1.0 if parsed else 0.0,
        "action_match": 1.0 if am else 0.0,
        "args_match": 1.0 if args else 0.0,
        "reason": reason,
        "platform": platform,
    }


#: the numeric keys of every :func:`compute_score` result (verl puts them in ``reward_extra_info``;
#: each can be a gate or filter metric); ``reason`` and ``platform`` are strings
NUMERIC_KEYS = tuple(k for k, v in _result(0.0, False, 0, False, False, False, "", "").items() if not isinstance(v, str))


def _strict(solution_str: Any, platform: str, targets: Sequence[Target], score_cfg: ScoreConfig, parse_cfg: ParseConfig, thought: int) -> dict:
    pred = parse_action(solution_str, platform, parse_cfg)
    level, reason, action_match, _ = _judge(pred, targets[0], score_cfg)
    if level == "partial":  # an alternative answer may still make it correct
        for t in targets[1:]:
            alt = _judge(pred, t, score_cfg)
            if alt[0] == "correct":
                level, reason, action_match = "correct", "ok:alternative", True
                break
    correct = level == "correct"
    return _result(
        score_cfg.level_score(level), correct, thought, not isinstance(pred, ParseError), action_match, correct, reason, platform
    )


# ----------------------------------------------------------------------------- ui_mopd mode

_EMPTY: Mapping = {}
_BOX_KEYS = ("bbox", "bbox2", "other_bbox", "other_bbox2")


def _release_extra(extra_info: Any) -> Mapping:
    """``extra_info`` as ``mode="ui_mopd"`` reads it: a non-mapping as ``{}``, numpy boxes as lists."""
    if not isinstance(extra_info, Mapping):
        return _EMPTY
    plain = None
    for k in _BOX_KEYS:
        v = extra_info.get(k)
        if v is not None and type(v) is not list and hasattr(v, "tolist") and not isinstance(v, str):
            if plain is None:
                plain = dict(extra_info)
            plain[k] = to_plain(v)
    return extra_info if plain is None else plain


def _release_label_of(tool: str, action: dict) -> dict | str:
    # the release reads a label only when its arguments hold "action"
    return flatten(tool, action) if "action" in action else "invalid:ground_truth"


def _as_release_label(gt: GroundTruth) -> tuple[dict | str, dict, tuple[tuple[dict | str, dict], ...]]:
    """Our layout for the release's rules: ``(label, boxes as extra_info, alternatives)``."""
    tool = TOOL_NAMES[gt.platform]
    boxes = {
        "bbox": box_pairs(read_box(gt.bbox, "ground_truth.bbox")),
        "bbox2": box_pairs(read_box(gt.bbox2, "ground_truth.bbox2")),
    }
    alternatives = tuple(
        (
            _release_label_of(tool, a),
            {
                "bbox": box_pairs(read_box(b1, f"alternatives[{i}].bbox")),
                "bbox2": box_pairs(read_box(b2, f"alternatives[{i}].bbox2")),
            },
        )
        for i, (a, b1, b2) in enumerate(gt.alternatives)
    )
    return _release_label_of(tool, gt.primary), boxes, alternatives


@lru_cache(maxsize=CACHE_SIZE)
def _string_release_label(s: str) -> tuple[dict, dict, tuple[tuple[dict, dict], ...]]:
    return _as_release_label(read_ground_truth(s))


_read_label_cached = lru_cache(maxsize=CACHE_SIZE)(read_label)


def _read_label_any(value: Any) -> dict | str:
    return _read_label_cached(value) if isinstance(value, str) else read_label(value)


def _ours(ground_truth: Any, extra: Mapping) -> tuple[str, tuple] | None:
    """``(platform, _as_release_label(...))`` for a ground truth in our layout that reads, else None."""
    try:
        if isinstance(ground_truth, str):
            if string_layout(ground_truth) != "json":
                return None
            gt = read_ground_truth(ground_truth)
            if adds_nothing(gt, extra):
                return gt.platform, _string_release_label(ground_truth)
        gt = read_ground_truth(ground_truth, extra)
        return (gt.platform, _as_release_label(gt)) if gt.layout == "json" else None
    except MemoryError:
        raise
    except Exception:  # whatever a malformed row trips (a ValueError naming it, nesting too deep, ...)
        return None


def _ui_mopd(solution_str: Any, ground_truth: Any, extra_info: Any) -> dict:
    extra = _release_extra(extra_info)
    thought = release_thought_length(solution_str, extra)
    pred = read_label(solution_str)
    ours = _ours(ground_truth, extra)
    if ours is not None:
        platform, (label, boxes, alternatives) = ours
        score, reason = release_reward(pred, label, boxes, alternatives)
    else:  # the release's layout, or ours unreadable: the row as the release scores it
        label = _read_label_any(ground_truth)
        score, reason = release_reward(pred, label, extra, read=_read_label_any)
        name = label.get("name") if isinstance(label, dict) else None
        platform = (platform_of_tool(name) if isinstance(name, str) else None) or "unknown"
    correct = score == 1.0
    action_match = correct or reason == "partial:args"
    return _result(score, correct, thought, not isinstance(pred, str), action_match, correct, reason, platform)


# ----------------------------------------------------------------------------- verl's entry point

_DEFAULT_SCORE = ScoreConfig()


def _user_kwargs(mode: str, reward_kwargs: Mapping[str, Any]) -> Mapping[str, Any]:
    """The keyword arguments of :func:`compute_score` that are the user's (verl's own removed), after
    checking ``mode`` and that ``ui_mopd`` mode gets none."""
    user_kwargs = {k: v for k, v in reward_kwargs.items() if k not in _VERL_KWARGS} if reward_kwargs else reward_kwargs
    if mode == "ui_mopd" and user_kwargs:
        raise ValueError(f"mode='ui_mopd' reproduces the release and takes no tolerances; got {sorted(user_kwargs)}")
    if mode not in MODES:
        raise ValueError(f"mode={mode!r}: allowed {list(MODES)}")
    return user_kwargs


#: the release's reward levels (``verl_mopd.rewards.ui_mopd.release_score``): invalid, partial, correct
RELEASE_LEVELS = (-1.0, -0.5, 1.0)


def reward_levels(mode: str = "strict", **reward_kwargs: Any) -> tuple[float, ...]:
    """The scores :func:`compute_score` gives with these keyword arguments (a recipe's
    ``reward.custom_reward_function.reward_kwargs``), lowest first: strict mode's ``invalid``,
    ``partial`` and ``correct`` (:class:`ScoreConfig`, presets included), or the release's
    :data:`RELEASE_LEVELS` in ``ui_mopd`` mode. Raises ``ValueError`` for the keyword arguments
    :func:`compute_score` refuses, so a recipe's are checked before a run."""
    user_kwargs = _user_kwargs(mode, reward_kwargs)
    if mode == "ui_mopd":
        return RELEASE_LEVELS
    score_cfg = make_configs(**user_kwargs)[0] if user_kwargs else _DEFAULT_SCORE
    return tuple(sorted({score_cfg.invalid, score_cfg.partial, score_cfg.correct}))


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
        ground_truth: our layout (a dict, or a string that is one whole JSON object) or the
            release's (any other string; its first ``<tool_call>`` block is the label), see
            :mod:`verl_mopd.rewards.truth`.
        extra_info: the dataset row's ``extra_info``; ``bbox``/``bbox2``/``other_*`` for the
            release's layout, ``tokenizer`` to count ``thought_length`` in tokens. Strict mode
            refuses one that is not a dict or None (``bad_truth``); ``ui_mopd`` reads it as ``{}``.
        mode: ``"strict"`` or ``"ui_mopd"``.
        **reward_kwargs: ``preset`` and any :class:`ScoreConfig` / :class:`ParseConfig` field
            (strict mode only; ``ui_mopd`` mode takes none, to reproduce the release exactly).

    Returns:
        ``score``, ``acc`` (1.0 iff fully correct), ``thought_length``, ``parsed``,
        ``action_match``, ``args_match`` (floats 0/1), ``reason`` and ``platform`` (strings).
        Always the same keys.
    """
    user_kwargs = _user_kwargs(mode, reward_kwargs)
    if mode == "ui_mopd":
        return _ui_mopd(solution_str, ground_truth, extra_info)
    score_cfg, parse_cfg = make_configs(**user_kwargs) if user_kwargs else (_DEFAULT_SCORE, DEFAULT_PARSE_CONFIG)
    try:
        extra = extra_info if type(extra_info) is dict else extra_mapping(extra_info)
        platform, targets = targets_of(ground_truth, extra)
    except MemoryError:
        raise
    except Exception as e:  # a malformed row, whatever the type error it trips
        if score_cfg.bad_truth == "raise":
            if isinstance(e, ValueError):
                raise
            raise ValueError(f"unreadable ground truth or extra_info ({type(e).__name__}: {e})") from e
        bad_extra = extra_info is not None and not isinstance(extra_info, Mapping)
        thought = release_thought_length(solution_str, extra_info if isinstance(extra_info, Mapping) else _EMPTY)
        reason = "invalid:extra_info" if bad_extra else "invalid:ground_truth"
        return _result(score_cfg.invalid, False, thought, False, False, False, reason, "unknown")
    thought = release_thought_length(solution_str, extra)
    return _strict(solution_str, platform, targets, score_cfg, parse_cfg, thought)


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
