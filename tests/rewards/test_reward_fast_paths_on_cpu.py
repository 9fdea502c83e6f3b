"""The reward's fast paths give what their plain versions give, on every input.

Each shortcut taken for speed (``benchmarks/reward.py``) is checked against the obvious
implementation it replaces: ``str.find``, a regular expression, the frozen dataclass's own
``__init__``, an uncached reading.
"""

import json
import pickle
import re

from hypothesis import given, settings
from hypothesis import strategies as st

from verl_mopd.rewards.actions import ACTION_SPECS, PLATFORMS, Action, normalize_action, to_point
from verl_mopd.rewards.parse import _not_json_object, decode_json_at, find_tag, strip_thinking, think_tag
from verl_mopd.rewards.truth import _read_alone, read_ground_truth, strict_targets, targets_of
from verl_mopd.rewards.ui_mopd import release_thought_length

PIECES = ["<", ">", "/", "a", "k", " ", "\n", "<think>", "</think>", "<thinking>", "</thinking>", "<think", "</think",
          "<tool_call>", "</tool_call>", "<tool_", "{", "}", '"']  # fmt: skip
FILLER = "the button is at the top right so I should click it " * 8  # past the plain-search threshold


@st.composite
def tagged_texts(draw):
    """Texts dense in '<' and tag fragments, some longer than the short-text threshold."""
    parts = draw(
        st.lists(st.sampled_from(PIECES) | st.sampled_from([FILLER, FILLER[:100], "<" * 20]), max_size=30)
    )
    tail = draw(st.sampled_from(["", "", FILLER]))  # so that the tags come far enough before the end
    return "".join(parts) + tail


TAG_NAMES = ["<think", "</think", "<tool_call>", "</tool_call>", "<", "<a"]


@settings(max_examples=500, deadline=None)
@given(text=tagged_texts(), tag=st.sampled_from(TAG_NAMES), start=st.integers(0, 50))
def test_find_tag_is_str_find(text, tag, start):
    assert find_tag(text, tag, start) == text.find(tag, start)


OPEN, CLOSE = re.compile(r"<think(?:ing)?>"), re.compile(r"</think(?:ing)?>")


@settings(max_examples=500, deadline=None)
@given(text=tagged_texts(), start=st.integers(0, 50))
def test_think_tag_is_the_regex(text, start):
    for closing, pattern in ((False, OPEN), (True, CLOSE)):
        m = pattern.search(text, start)
        assert think_tag(text, closing, start) == ((m.start(), m.end()) if m else (-1, -1))


def _release_thought(text):  # the release's two regexes, as rewards/ui_mopd.py states them
    m = re.search(r"<think(?:ing)?>(.*?)</think(?:ing)?>", text, re.S) or re.match(
        r"(.*?)</think(?:ing)?>", text, re.S
    )
    return len(m.group(1).strip()) if m else 0


@settings(max_examples=500, deadline=None)
@given(text=tagged_texts())
def test_thought_length_is_the_release_regexes(text):
    assert release_thought_length(text, {}) == _release_thought(text)


@settings(max_examples=500, deadline=None)
@given(text=tagged_texts())
def test_strip_thinking_is_the_text_after_the_last_closing_tag(text):
    ends = [m.end() for m in CLOSE.finditer(text)]
    rest = text[ends[-1] :] if ends else text
    got = strip_thinking(text)
    if OPEN.search(rest):
        assert not got and got.reason == "unclosed_think"
    else:
        assert got == rest


@settings(max_examples=500, deadline=None)
@given(
    s=st.lists(
        st.sampled_from(["{", "}", " ", '"a"', "'a'", ":", "1", ",", "a", "\n", "[", "]"]), max_size=12
    ).map("".join)
)
def test_json_is_skipped_only_where_it_would_fail(s):
    if _not_json_object(s, 0):
        try:
            json.JSONDecoder().raw_decode(s, 0)
        except ValueError:
            pass
        else:
            raise AssertionError(f"json reads {s!r}")
    if s.startswith("{") and "}" not in s:  # the cut-off shortcut: no object without its "}"
        assert decode_json_at(s, 0) is None


_VALUES = {
    "point": st.lists(st.integers(-5, 1005), min_size=2, max_size=2)
    | st.lists(st.floats(0, 1000), min_size=2, max_size=2)
    | st.sampled_from([[True, 2], [1, 2, 3], "[3, 4]", ["5", "6"], (7, 8)]),
    "text": st.text(max_size=5),
    "keys": st.lists(st.sampled_from(["ctrl", "c", "Return"]), min_size=1, max_size=2),
    "number": st.integers(-5, 5),
    "button": st.sampled_from(["Back", "home"]),
    "status": st.sampled_from(["success", "fail"]),
}


@st.composite
def argument_dicts(draw):
    platform = draw(st.sampled_from(PLATFORMS))
    spec = draw(st.sampled_from(list(ACTION_SPECS[platform].values())))
    args = {"action": draw(st.sampled_from([spec.name, spec.name.upper()]))}
    for a in spec.args:
        if a.required or draw(st.booleans()):
            args[a.name] = draw(_VALUES[a.kind])
    if draw(st.booleans()):
        args["unknown"] = 1
    return platform, args


@settings(max_examples=500, deadline=None)
@given(example=argument_dicts())
def test_actions_built_without_init_are_the_dataclass(example):
    platform, args = example
    try:
        action = normalize_action(platform, args)
    except ValueError:
        return
    fields = {k: getattr(action, k) for k in Action.__dataclass_fields__}
    rebuilt = Action(**fields)
    assert action == rebuilt and hash(action) == hash(rebuilt) and repr(action) == repr(rebuilt)
    assert pickle.loads(pickle.dumps(action)) == action
    if "coordinate" in args:  # the int fast path of to_point against its general path (floats)
        value = args["coordinate"]
        floats = (
            [float(c) for c in value]
            if isinstance(value, list) and all(type(c) is int for c in value)
            else None
        )
        if floats is not None:
            assert to_point(value) == to_point(floats)


@st.composite
def truth_rows(draw):
    platform = draw(st.sampled_from(PLATFORMS))
    action = {
        "action": "click" if platform == "mobile" else "left_click",
        "coordinate": [draw(st.integers(0, 1000)), 5],
    }
    tool = "mobile_use" if platform == "mobile" else "computer_use"
    box = draw(st.sampled_from([None, [0, 0, 10, 10], [[1, 1], [20, 20]]]))
    other = {"action": "wait"}
    layout = draw(st.sampled_from(["json", "json_no_box", "release"]))
    if layout == "release":
        gt = "<tool_call>" + json.dumps({"name": tool, "arguments": action}) + "</tool_call>"
    else:
        d = {"platform": platform, "action": action, "alternatives": [{"action": other}]}
        if layout == "json":
            d["bbox"] = box
        gt = json.dumps(d)
    extra = draw(st.sampled_from([{}, {"bbox": None}, {"bbox": [[2, 2], [30, 30]]}, {"bbox2": [1, 1, 2, 2]},
                                  {"other_label": "<tool_call>" + json.dumps({"name": tool, "arguments": other}) + "</tool_call>"}]))  # fmt: skip
    return gt, extra


@settings(max_examples=300, deadline=None)
@given(row=truth_rows())
def test_memoized_targets_are_the_uncached_reading(row):
    gt, extra = row
    for _ in range(2):  # cold and warm
        platform, targets = targets_of(gt, extra)
        fresh = read_ground_truth(json.loads(gt) if gt.startswith("{") else gt, extra)
        assert (platform, list(targets)) == (fresh.platform, strict_targets(fresh))
    assert _read_alone(gt) == read_ground_truth(gt)  # a string's memoized reading is its plain one
