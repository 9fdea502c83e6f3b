"""``mode="ui_mopd"``: the task reward of the public UI-MOPD release, reproduced rule by rule.

Written from a reading of ``verl/ui_mopd/reward/gui_agent.py`` in github.com/EliSpectre/UI-MOPD
at commit 84f7e48 (not copied); the release's ``run_mopd.sh`` reaches it through verl's DAPO
reward manager. The behaviours that matter for reproduction:

- Parsing (label and prediction alike): the first ``<tool_call>`` with a closing
  ``</tool_call>`` after it, wherever it stands (text before it, ``<think>`` around it), strict
  ``json.loads`` of its stripped body, an object whose ``arguments`` is a dict holding
  ``action``; flattened to ``{"name": name, **arguments}`` (so an ``arguments["name"]`` replaces
  the tool name). Anything else is a parse failure (-1.0); a body that decodes to something
  other than an object raises in the release, which its outer ``try`` turns into -1.0 as well.
- The LABEL's tool name picks the action table; the prediction's tool name is not checked.
  Actions missing from the tables (mobile ``open``/``key``/``ask_user``, desktop ``answer``)
  score -1.0.
- Each action is a list of parts, all evaluated (no short-circuit), and the reward is 1.0 iff
  every part holds, else -0.5. A Python exception anywhere in scoring (e.g. a non-string key,
  a malformed box) makes the reward -1.0, as the release's outer ``try`` does.
- Point part: with a truthy box (``extra_info["bbox"]``, or ``bbox2`` for a swipe's end) and a
  point in the prediction, the point must lie in the box: ``[[x1, y1], [x2, y2]]``, corners in
  any order, edges included, the box's four bounds taken before any comparison (so a box of
  non-numbers raises); an empty point, or a point or box whose length is not 2 (a flat
  ``[x1, y1, x2, y2]`` box), fails the part. Otherwise the point must equal the label's point
  (``==`` on the decoded values), and a point missing from either fails the part (so, with no
  box, a label without a point never scores 1.0 with a point action).
- Text: ``str(v).strip().lower()`` equality; keys: lower-cased sets, no aliases;
  ``system_button`` and ``status``: ``==`` (case-sensitive); scroll sign: ``(p > 0) - (p < 0)``
  with a missing ``pixels`` read as 0, a ``TypeError``/``ValueError`` there failing the part only.
- An alternative label (``extra_info["other_label"]``, with ``other_bbox``/``other_bbox2``
  replacing the boxes when present, else the primary boxes stay) lifts a non-1.0 reward to 1.0,
  also when the primary label is unreadable.
- ``thought_length``: characters (or ``extra_info["tokenizer"].encode`` tokens) of the stripped
  text of the first ``<think>...</think>`` (``thinking`` variants too), else of the text before
  the first closing tag; 0 when there is none.

Where :func:`~verl_mopd.rewards.score.compute_score` (``mode="ui_mopd"``) departs from the
release (rows where it raises, cannot read a box, or cannot read the ground truth), and nowhere else:

- ``extra_info`` that is not a dict (None, a list, a string, 0, ``""``) is read as ``{}``. The
  release calls ``extra_info.get`` on it: it returns a result only when the first label scores
  1.0 with an action that never reads ``extra_info`` (type, answer, key, system_button, wait,
  terminate), and then its ``thought_length`` is 0 (the tokenizer lookup raises inside its
  ``try``); on every other such row it raises ``AttributeError``. We report the
  ``thought_length`` of ``{}``, the same as strict mode's.
- A box (``bbox``, ``bbox2``, ``other_bbox``, ``other_bbox2``) given as a numpy array is read as
  the list it holds, because a row read with pandas holds its list columns as numpy arrays, and
  verl reads parquet with pandas in places (``trainer/main_eval.py``,
  ``utils/dataset/rm_dataset.py``). The release evaluates ``if bbox`` on the array, which NumPy
  refuses for every size but one, so every label of a point action (click, long_press, swipe,
  the desktop clicks, mouse_move, left_click_drag, scroll, hscroll) scored with an array box
  gets -1.0 from it.
- Our own layout (a dict, or a string that is one whole JSON object; see
  :func:`~verl_mopd.rewards.truth.ground_truth_layout`), which the release cannot read, is
  scored by the release's rules applied to its action as the label, its own boxes as
  ``bbox``/``bbox2`` (else ``extra_info``'s) and its ``alternatives`` as further labels with
  their own boxes. ``extra_info["other_label"]`` belongs to the release's layout and is not
  read there. A ground truth in our layout that does not read (no platform, an off-grid box,
  ...) is scored as the release scores the row: -1.0 unless ``other_label`` lifts it.
"""

from __future__ import annotations

import json
import re
from typing import Any, Callable, Mapping

from verl_mopd.rewards.parse import find_tag

_OPEN, _CLOSE = "<tool_call>", "</tool_call>"


def release_call(text: str) -> tuple[Any, dict] | None:
    """``(name, arguments)`` of the first tool call, read the release's way, or None.

    Raises ``AttributeError`` where the release raises: a block whose JSON is not an object.
    """
    p = find_tag(text, _OPEN)
    if p < 0:
        return None
    q = find_tag(text, _CLOSE, p + len(_OPEN))
    if q < 0:
        return None
    try:
        call = json.loads(text[p + len(_OPEN) : q].strip())
    except ValueError:
        return None
    name = call.get("name", "")
    arguments = call.get("arguments", {})
    if not isinstance(arguments, dict) or "action" not in arguments:
        return None
    return name, arguments


def flatten(name: Any, arguments: Mapping) -> dict:
    """The release's flat call: ``{"name": name, **arguments}``."""
    flat = {"name": name}
    flat.update(arguments)
    return flat


def release_parse(text: Any) -> dict | None:
    """The release's tool-call reading: flattened ``{"name": ..., **arguments}`` or None.

    May raise (e.g. the decoded call is a list) exactly where the release raises.
    """
    call = release_call(text)
    return None if call is None else flatten(*call)


def read_label(value: Any) -> dict | str:
    """A label (or prediction) string read the release's way: the flat call, or a failure reason.

    Never raises: ``"invalid:no_call"`` when the release reads no call, ``"invalid:exception:<T>"``
    where it raises (a non-string value included, which its ``re.search`` refuses).
    """
    if not isinstance(value, str):
        return "invalid:exception:TypeError"
    try:
        flat = release_parse(value)
    except Exception as e:  # noqa: BLE001 - the release's outer try
        return f"invalid:exception:{type(e).__name__}"
    return "invalid:no_call" if flat is None else flat


def _in_box(point: Any, box: Any) -> bool:
    if not point or not box:
        return False
    if len(point) != 2 or len(box) != 2:
        return False
    x, y = point[0], point[1]
    (ax, ay), (bx, by) = box[0], box[1]
    x0, x1, y0, y1 = min(ax, bx), max(ax, bx), min(ay, by), max(ay, by)  # all four first, as the release
    return x0 <= x <= x1 and y0 <= y <= y1


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


def release_score(pred: dict | str, label: dict | str, extra: Mapping) -> tuple[float, str]:
    """One label's reward: ``(1.0 | -0.5 | -1.0, reason)``; never raises.

    ``pred`` and ``label`` as :func:`read_label` returns them (a failure reason for a string
    that did not read); a label failure wins over a prediction failure, as the release reads the
    label first.
    """
    if isinstance(label, str):
        return -1.0, "invalid:ground_truth"
    if isinstance(pred, str):
        return -1.0, pred
    try:
        table = RELEASE_TABLES.get(label.get("name", ""))
        if table is None:
            return -1.0, "invalid:label_tool"
        parts = table.get(label.get("action", ""))
        if parts is None:
            return -1.0, "invalid:label_action"
        results = [part(pred, label, extra) for part in parts]  # all parts run, as the release does
    except Exception as e:  # noqa: BLE001 - the release's outer try: any exception is -1.0
        return -1.0, f"invalid:exception:{type(e).__name__}"
    if all(results):
        return 1.0, "ok"
    return -0.5, ("partial:action" if not results[0] else "partial:args")


def release_reward(
    pred: dict | str,
    label: dict | str,
    extra: Mapping,
    alternatives: tuple[tuple[dict | str, Mapping], ...] = (),
    read: Callable[[Any], dict | str] = read_label,
) -> tuple[float, str]:
    """The release's reward for one response: ``(score, reason)``.

    Args:
        pred: the response as :func:`read_label` reads it.
        label: the label, read (:func:`read_label` of the release's string, or our layout's
            action flattened with :func:`flatten`).
        extra: a dict; ``bbox``/``bbox2`` as ``[[x1, y1], [x2, y2]]``, optional ``other_label``,
            ``other_bbox``, ``other_bbox2`` (read when ``other_label`` is).
        alternatives: further ``(read label, box overrides)`` pairs (our layout's
            ``alternatives``), tried after ``other_label``.
        read: how ``other_label`` is read (:func:`read_label`, or a cached equivalent).
    """
    score, reason = release_score(pred, label, extra)
    if score == 1.0:
        return score, reason
    other = extra.get("other_label")
    if other:
        other_extra = dict(extra)
        if "other_bbox" in extra:
            other_extra["bbox"] = extra["other_bbox"]
        if "other_bbox2" in extra:
            other_extra["bbox2"] = extra["other_bbox2"]
        if release_score(pred, read(other), other_extra)[0] == 1.0:
            return 1.0, "ok:alternative"
    for alt, overrides in alternatives:
        if release_score(pred, alt, {**extra, **overrides})[0] == 1.0:
            return 1.0, "ok:alternative"
    return score, reason


_THINK_TAGS = re.compile(r"<(/?)think(?:ing)?>")  # <think>, <thinking> and their closing tags


def release_thought_length(text: Any, extra_info: Mapping) -> int:
    """Length of the reasoning as the release measures it (see the module docstring).

    One pass over the think tags, in order: the first opening tag with a closing tag after it
    bounds the thought; failing that, the first closing tag ends it.
    """
    if not isinstance(text, str):
        return 0
    first = text.find("<")  # a one-character find (memchr) to where tags can start
    if first < 0:
        return 0
    opened, first_close, span = -1, -1, None
    m = _THINK_TAGS.search(text, first)
    while m is not None:
        if not m.group(1):
            if opened < 0:
                opened = m.end()
        elif opened >= 0:
            span = (opened, m.start())
            break
        elif first_close < 0:
            first_close = m.start()
        m = _THINK_TAGS.search(text, m.end())
    if span is None:
        if first_close < 0:
            return 0
        span = (0, first_close)
    thought = text[span[0] : span[1]].strip()
    try:
        tokenizer = extra_info.get("tokenizer")
        return len(tokenizer.encode(thought)) if tokenizer else len(thought)
    except Exception:  # noqa: BLE001 - the release's try: a failing tokenizer reports 0
        return 0
