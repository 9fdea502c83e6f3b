"""The public UI-MOPD release's reward as ``verl_mopd/rewards/ui_mopd.py``'s docstring states it.

An independent reference for the differential tests: written from those rules alone, with
regular expressions and Python's own truth tests where the implementation uses ``str.find`` and
explicit checks, and with no guard the rules do not state, so it fails where the release fails:
``extra_info.get`` on something that is not a dict raises ``AttributeError`` out of
:func:`reward` (the release's crash), and ``if box`` on a numpy array raises inside the scoring
(the release's -1.0).
"""

import json
import re

CALL = re.compile(r"<tool_call>(.*?)</tool_call>", re.S)
THOUGHT = re.compile(r"<think(?:ing)?>(.*?)</think(?:ing)?>", re.S)
BEFORE_CLOSE = re.compile(r"(.*?)</think(?:ing)?>", re.S)  # matched at the start only


def read_call(text):
    """The first ``<tool_call>`` block: ``{"name": ..., **arguments}`` or None; raises where the rules say the release raises."""
    block = CALL.search(text)  # TypeError for a text that is not a string
    if block is None:
        return None
    try:
        call = json.loads(block.group(1).strip())
    except ValueError:
        return None
    arguments = call.get("arguments", {})  # AttributeError when the call is not an object
    if not isinstance(arguments, dict) or "action" not in arguments:
        return None
    return {"name": call.get("name", ""), **arguments}


def _point(coordinate, box_key):
    def part(pred, label, extra):
        box = extra.get(box_key)
        if box and coordinate in pred:
            point = pred[coordinate]
            if not point or len(point) != 2 or len(box) != 2:
                return False
            (ax, ay), (bx, by) = box[0], box[1]
            lo, hi = (min(ax, bx), min(ay, by)), (max(ax, bx), max(ay, by))
            return lo[0] <= point[0] <= hi[0] and lo[1] <= point[1] <= hi[1]
        return coordinate in pred and coordinate in label and pred[coordinate] == label[coordinate]

    return part


def _same(key):
    return lambda pred, label, extra: pred.get(key) == label.get(key)


def _text(pred, label, extra):
    return str(pred.get("text", "")).strip().lower() == str(label.get("text", "")).strip().lower()


def _keys(pred, label, extra):
    p, q = pred.get("keys", []), label.get("keys", [])
    return isinstance(p, list) and isinstance(q, list) and {k.lower() for k in p} == {k.lower() for k in q}


def _sign(pred, label, extra):
    p, q = pred.get("pixels", 0), label.get("pixels", 0)
    try:
        return (p > 0) - (p < 0) == (q > 0) - (q < 0)
    except (TypeError, ValueError):
        return False


ACTION, START, END = _same("action"), _point("coordinate", "bbox"), _point("coordinate2", "bbox2")
MOBILE = {
    "click": [ACTION, START],
    "long_press": [ACTION, START],
    "swipe": [ACTION, START, END],
    "type": [ACTION, _text],
    "answer": [ACTION, _text],
    "system_button": [ACTION, _same("button")],
    "wait": [ACTION],
    "terminate": [ACTION, _same("status")],
}
DESKTOP = {
    **dict.fromkeys(
        [
            "left_click",
            "right_click",
            "middle_click",
            "double_click",
            "triple_click",
            "mouse_move",
            "left_click_drag",
        ],
        [ACTION, START],
    ),
    "type": [ACTION, _text],
    "key": [ACTION, _keys],
    "scroll": [ACTION, START, _sign],
    "hscroll": [ACTION, START, _sign],
    "wait": [ACTION],
    "terminate": [ACTION, _same("status")],
}
TABLES = {"mobile_use": MOBILE, "computer_use": DESKTOP}
#: the actions whose parts read extra_info (every one with a point part)
POINT_ACTIONS = {(tool, a) for tool, table in TABLES.items() for a, parts in table.items() if START in parts}


def one_label(text, label, extra):
    """One label's reward, 1.0 / -0.5 / -1.0; ``label`` a string, or already read (a dict)."""
    try:
        label = read_call(label) if not isinstance(label, dict) else label
        if label is None:
            return -1.0
        pred = read_call(text)
        if pred is None:
            return -1.0
        parts = TABLES.get(label.get("name", ""), {}).get(label.get("action", ""))
        if parts is None:
            return -1.0
        held = [part(pred, label, extra) for part in parts]
    except Exception:  # the release's outer try
        return -1.0
    return 1.0 if all(held) else -0.5


def thought_length(text, extra):
    try:
        m = THOUGHT.search(text) or BEFORE_CLOSE.match(text)
        if m is None:
            return 0
        tokenizer = extra.get("tokenizer")
        thought = m.group(1).strip()
        return len(tokenizer.encode(thought)) if tokenizer else len(thought)
    except Exception:
        return 0


def reward(text, ground_truth, extra, alternatives=()):
    """``{"score", "acc", "thought_length"}`` for one row; raises ``AttributeError`` where the release crashes.

    ``alternatives``: our layout's ``(label dict, boxes)`` pairs, tried after ``other_label``.
    """
    score = one_label(text, ground_truth, extra)
    if score != 1.0:
        other = extra.get("other_label")  # outside any try, as the rules say
        if other:
            other_extra = dict(extra)
            for key in ("bbox", "bbox2"):
                if "other_" + key in extra:
                    other_extra[key] = extra["other_" + key]
            if one_label(text, other, other_extra) == 1.0:
                score = 1.0
        for label, boxes in alternatives:
            if score != 1.0 and one_label(text, label, {**extra, **boxes}) == 1.0:
                score = 1.0
    return {
        "score": score,
        "acc": 1.0 if score == 1.0 else 0.0,
        "thought_length": thought_length(text, extra),
    }
