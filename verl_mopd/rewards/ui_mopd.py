"""``mode="ui_mopd"``: the task reward of the public UI-MOPD release, reproduced rule by rule.

Written from a reading of ``verl/ui_mopd/reward/gui_agent.py`` in github.com/EliSpectre/UI-MOPD
(not copied). The behaviours that matter for reproduction:

- Parsing: the first ``<tool_call>`` with a closing ``</tool_call>`` anywhere in the text (also
  inside ``<think>``), strict ``json.loads`` of its stripped body, an object whose
  ``arguments`` is a dict holding ``action``; flattened to ``{"name": name, **arguments}``.
  Anything else is a parse failure (-1.0).
- The LABEL's tool name picks the action table; the prediction's tool name is not checked.
  Actions missing from the tables (mobile ``open``/``key``/``ask_user``, desktop ``answer``)
  score -1.0.
- Each action is a list of parts, all evaluated (no short-circuit), and the reward is 1.0 iff
  every part holds, else -0.5. A Python exception anywhere in scoring (e.g. a non-string key,
  a malformed box) makes the reward -1.0, as the release's outer ``try`` does.
- Point part: with a box (``extra_info["bbox"]``, or ``bbox2`` for a swipe's end, as
  ``[[x1, y1], [x2, y2]]``, inclusive edges) the point must lie in it; without a box, the point
  must equal the label's point (``==`` on the decoded values).
- Text: ``str(v).strip().lower()`` equality; keys: lower-cased sets, no aliases;
  ``system_button`` and ``status``: ``==`` (case-sensitive); scroll sign: ``(p > 0) - (p < 0)``
  with a missing ``pixels`` read as 0, a ``TypeError``/``ValueError`` there failing the part only.
- An alternative label (``extra_info["other_label"]``, with ``other_bbox``/``other_bbox2``
  replacing the boxes when present, else the primary boxes stay) lifts a non-1.0 reward to 1.0.
- ``thought_length``: characters (or ``extra_info["tokenizer"].encode`` tokens) of the stripped
  text of the first ``<think>...</think>`` (``thinking`` variants too), else of the text before
  the first closing tag; 0 when there is none.

Deviations, where the release would crash rather than score: ``extra_info=None`` is read as
``{}``; numpy arrays in ``extra_info`` boxes are read as lists.
"""

from __future__ import annotations

import json
import re
from typing import Any, Callable, Mapping

_OPEN, _CLOSE = "<tool_call>", "</tool_call>"
_THINK_OPEN = re.compile(r"<think(?:ing)?>")
_THINK_CLOSE = re.compile(r"</think(?:ing)?>")


def release_parse(text: Any) -> dict | None:
    """The release's tool-call reading: flattened ``{"name": ..., **arguments}`` or None.

    May raise (e.g. the decoded call is a list) exactly where the release raises; callers turn
    that into -1.0.
    """
    p = text.find(_OPEN)
    if p < 0:
        return None
    q = text.find(_CLOSE, p + len(_OPEN))
    if q < 0:
        return None
    try:
        call = json.loads(text[p + len(_OPEN) : q].strip())
    except ValueError:
        return None
    arguments = call.get("arguments", {})
    if not isinstance(arguments, dict) or "action" not in arguments:
        return None
    flat = {"name": call.get("name", "")}
    flat.update(arguments)
    return flat


def _in_box(point: Any, box: Any) -> bool:
    if not point or not box:
        return False
    if len(point) != 2 or len(box) != 2:
        return False
    x, y = point[0], point[1]
    (ax, ay), (bx, by) = box[0], box[1]
    return min(ax, bx) <= x <= max(ax, bx) and min(ay, by) <= y <= max(ay, by)


def _point_part(coord_key: str, box_key: str) -> Callable[[dict, dict, Mapping], bool]:
    def part(pred: dict, label: dict, extra: Mapping) -> bool:
        box = extra.get(box_key)
        if box and coord_key in pred:
            return _in_box(pred[coord_key], box)
        if coord_key in pred and coord_key in label:
            return pred[coord_key] == label[coord_key]
        return False

    return part


def _action_part(pred: dict, label: dict, extra: Mapping) -> bool:
    return pred.get("action") == label.get("action")


def _text_part(pred: dict, label: dict, extra: Mapping) -> bool:
    return str(pred.get("text", "")).strip().lower() == str(label.get("text", "")).strip().lower()


def _eq_part(key: str) -> Callable[[dict, dict, Mapping], bool]:
    return lambda pred, label, extra: pred.get(key) == label.get(key)


def _keys_part(pred: dict, label: dict, extra: Mapping) -> bool:
    pk, lk = pred.get("keys", []), label.get("keys", [])
    if isinstance(pk, list) and isinstance(lk, list):
        return {k.lower() for k in pk} == {k.lower() for k in lk}
    return False


def _sign_part(pred: dict, label: dict, extra: Mapping) -> bool:
    p, q = pred.get("pixels", 0), label.get("pixels", 0)
    try:
        return (p > 0) - (p < 0) == (q > 0) - (q < 0)
    except (TypeError, ValueError):
        return False


_POINT = _point_part("coordinate", "bbox")
_END = _point_part("coordinate2", "bbox2")
_MOBILE = {
    "click": (_action_part, _POINT),
    "long_press": (_action_part, _POINT),
    "swipe": (_action_part, _POINT, _END),
    "type": (_action_part, _text_part),
    "answer": (_action_part, _text_part),
    "system_button": (_action_part, _eq_part("button")),
    "wait": (_action_part,),
    "terminate": (_action_part, _eq_part("status")),
}
_DESKTOP = {
    **{a: (_action_part, _POINT) for a in ("left_click", "right_click", "middle_click", "double_click")},
    "triple_click": (_action_part, _POINT),
    "mouse_move": (_action_part, _POINT),
    "left_click_drag": (_action_part, _POINT),
    "type": (_action_part, _text_part),
    "key": (_action_part, _keys_part),
    "scroll": (_action_part, _POINT, _sign_part),
    "hscroll": (_action_part, _POINT, _sign_part),
    "wait": (_action_part,),
    "terminate": (_action_part, _eq_part("status")),
}
RELEASE_TABLES = {"mobile_use": _MOBILE, "computer_use": _DESKTOP}


def _single(pred_text: str, label: Any, extra: Mapping) -> tuple[float, str, dict | None]:
    """Score against one label string: ``(reward, reason, parsed prediction)``; never raises."""
    try:
        lab = release_parse(label)
        if lab is None:
            return -1.0, "invalid:ground_truth", None
        pred = release_parse(pred_text)
        if pred is None:
            return -1.0, "invalid:no_call", None
        table = RELEASE_TABLES.get(lab.get("name", ""))
        if table is None:
            return -1.0, "invalid:label_tool", pred
        parts = table.get(lab.get("action", ""))
        if parts is None:
            return -1.0, "invalid:label_action", pred
        results = [part(pred, lab, extra) for part in parts]  # all parts run, as the release does
    except Exception as e:  # the release's outer try: any exception is -1.0
        return -1.0, f"invalid:exception:{type(e).__name__}", None
    if all(results):
        return 1.0, "ok", pred
    return -0.5, ("partial:action" if not results[0] else "partial:args"), pred


def _as_lists(v: Any) -> Any:
    return v.tolist() if hasattr(v, "tolist") and not isinstance(v, (list, str)) else v


def label_string(tool: str, arguments: Mapping) -> str:
    """A label in the release's layout: ``<tool_call>{"name": tool, "arguments": {...}}</tool_call>``."""
    return _OPEN + json.dumps({"name": tool, "arguments": dict(arguments)}, ensure_ascii=False) + _CLOSE


def release_reward(
    solution_str: str,
    label: Any,
    extra_info: Mapping | None,
    alternatives: tuple[tuple[str, Mapping], ...] = (),
) -> dict:
    """The release's reward for one response.

    Args:
        solution_str: the decoded response.
        label: the release's ground truth, a ``<tool_call>`` string (see :func:`label_string`).
        extra_info: ``bbox``/``bbox2`` as ``[[x1, y1], [x2, y2]]``, optional ``other_label``,
            ``other_bbox``, ``other_bbox2``, ``tokenizer``.
        alternatives: further ``(label, box overrides)`` pairs (our JSON layout's
            ``alternatives``), tried like ``other_label`` after it.

    Returns:
        ``score`` (1.0 / -0.5 / -1.0), ``reason``, ``pred`` (the flattened prediction or None).
    """
    extra = {} if extra_info is None else {k: _as_lists(v) for k, v in extra_info.items()}
    score, reason, pred = _single(solution_str, label, extra)
    if score != 1.0:
        tries = []
        if extra.get("other_label"):
            other = dict(extra)
            if "other_bbox" in extra:
                other["bbox"] = extra["other_bbox"]
            if "other_bbox2" in extra:
                other["bbox2"] = extra["other_bbox2"]
            tries.append((extra["other_label"], other))
        tries.extend((alt, {**extra, **overrides}) for alt, overrides in alternatives)
        for alt, alt_extra in tries:
            if _single(solution_str, alt, alt_extra)[0] == 1.0:
                score, reason = 1.0, "ok:alternative"
                break
    return {"score": score, "reason": reason, "pred": pred}


def release_thought_length(text: Any, extra_info: Mapping | None) -> int:
    """Length of the reasoning as the release measures it (see the module docstring)."""
    try:
        m = _THINK_OPEN.search(text)
        close = _THINK_CLOSE.search(text, m.end()) if m else None
        if m and close:
            thought = text[m.end() : close.start()]
        else:
            first_close = _THINK_CLOSE.search(text)
            if first_close is None:
                return 0
            thought = text[: first_close.start()]
        thought = thought.strip()
        tokenizer = (extra_info or {}).get("tokenizer")
        return len(tokenizer.encode(thought)) if tokenizer else len(thought)
    except Exception:
        return 0
