"""``mode="ui_mopd"`` against the release's reward as the reward docs state it, on every row shape.

The reference is ``_release_reference`` (written from ``rewards/ui_mopd.py``'s docstring); the
rows come from the generator below, which draws the classes that once disagreed: labels with
text before their ``<tool_call>`` (a JSON object included), ``extra_info`` that is not a dict,
numpy boxes, and our own layout as a dict, a JSON string and a pandas-read parquet row.
"""

import json

import numpy as np
import pyarrow as pa
import pytest
from _release_reference import POINT_ACTIONS, TABLES, one_label, read_call, reward
from hypothesis import example, given, settings
from hypothesis import strategies as st

from verl_mopd.rewards import compute_score
from verl_mopd.rewards.truth import ground_truth_layout, read_ground_truth, release_label, strict_targets

TOOL = {"mobile": "mobile_use", "desktop": "computer_use"}
UNSCORED = {
    "mobile": ["open", "key", "ask_user"],
    "desktop": ["answer"],
}  # in our schema, not the release's tables
TAGS = ["<tool_call>", "</tool_call>", "<think>", "</think>", "<thinking>", "</thinking>", '{"step": 3}']
SETTINGS = settings(max_examples=300, deadline=None)
NON_DICTS = [None, [], "", 0, [1], "x", 0.0, False, ("bbox",)]


# ----------------------------------------------------------------------------- the generator


def fragments(chars, size):
    """Text from single characters and whole tags (so that tags occur, not only their letters)."""
    return st.lists(st.sampled_from(list(chars) + TAGS), max_size=size).map("".join)


texts = fragments("aB c1<>{}[]\"'/\\\n:,", 12)
grid = st.integers(0, 1000)
good_points = st.lists(grid, min_size=2, max_size=2) | st.lists(st.floats(0, 1000), min_size=2, max_size=2)
points = good_points | st.sampled_from(
    ["ab", "[1, 2]", [1], [1, 2, 3], [], None, 5, ["450", "450"], {"x": 1}]
)
key_lists = st.lists(
    st.sampled_from(["ctrl", "Ctrl", "C", "c", "shift", "control", "Enter"]), min_size=1, max_size=3
)
VALUES = {
    "coordinate": points,
    "coordinate2": points,
    "text": texts | st.integers(0, 99),
    "keys": key_lists | st.sampled_from([[1, "c"], "ctrl+c", []]),
    "button": st.sampled_from(["Back", "back", "Home", "Menu", "Enter", "Recent"]),
    "status": st.sampled_from(["success", "failure", "Success", "done"]),
    "pixels": st.integers(-500, 500) | st.sampled_from(["-5", None, 0.0, [1]]),
    "time": st.integers(0, 9),
}
FIELDS = {
    "click": ["coordinate"], "long_press": ["coordinate", "time"], "swipe": ["coordinate", "coordinate2"],
    "type": ["text"], "answer": ["text"], "open": ["text"], "ask_user": ["text"], "system_button": ["button"],
    "wait": ["time"], "terminate": ["status"], "key": ["keys"], "scroll": ["coordinate", "pixels"],
    "hscroll": ["coordinate", "pixels"], "left_click_drag": ["coordinate", "coordinate2"],
    **dict.fromkeys(["left_click", "right_click", "middle_click", "double_click", "triple_click", "mouse_move"], ["coordinate"]),
}  # fmt: skip


def actions_of(platform):
    return sorted(TABLES[TOOL[platform]]) + UNSCORED[platform]


@st.composite
def arguments(draw, platform, name=None):
    name = name or draw(st.sampled_from(actions_of(platform)))
    if platform == "mobile" and name == "key":
        return {"action": name, "text": draw(VALUES["text"])}
    args = {"action": name}
    for f in FIELDS[name]:
        if draw(st.integers(0, 4)):  # a field is sometimes missing
            args[f] = draw(VALUES[f])
    return args


@st.composite
def answer(draw, platform, label_args):
    """A response's arguments: the label's own, one field changed, another action, or a fresh draw."""
    how = draw(st.sampled_from(["echo", "echo", "field", "action", "fresh"]))
    args = dict(label_args)
    if how == "field" and len(args) > 1:
        f = draw(st.sampled_from(sorted(k for k in args if k != "action")))
        args[f] = draw(VALUES.get(f, texts))
    elif how == "action":
        args["action"] = draw(st.sampled_from(actions_of(platform) + ["tap", "Click"]))
    elif how == "fresh":
        args = draw(arguments(platform))
    return args


def box_around(point, draw):
    x, y = (
        point
        if isinstance(point, list) and len(point) == 2 and all(isinstance(c, (int, float)) for c in point)
        else [500, 500]
    )
    dx, dy = draw(st.integers(0, 60)), draw(st.integers(0, 60))
    x1, y1 = max(0, int(x) - dx), max(0, int(y) - dy)
    x2 = min(1000, max(0, int(x) + draw(st.integers(-5, 60))))  # on the grid: an off-grid box is bad truth
    y2 = min(1000, max(0, int(y) + draw(st.integers(-5, 60))))
    return [[x1, y1], [max(x1, x2), max(y1, y2)]] if draw(st.booleans()) else [[x2, y2], [x1, y1]]


@st.composite
def boxes(draw, point):
    kind = draw(st.sampled_from(["pairs", "pairs", "none", "flat", "junk"]))
    if kind == "pairs":
        return box_around(point, draw)
    if kind == "flat":
        (x1, y1), (x2, y2) = box_around(point, draw)
        return [x1, y1, x2, y2]
    if kind == "junk":
        return draw(st.sampled_from([[], [[1, 2]], [["a", 1], [2, 3]], [1, 2], {"x": 1}, "box", 0]))
    return None


def call_text(tool, args, *, closed=True):
    body = json.dumps({"name": tool, "arguments": args})
    return f"<tool_call>\n{body}\n</tool_call>" if closed else f"<tool_call>\n{body}"


@st.composite
def label_strings(draw, platform, args):
    """The release's layout: its first <tool_call> block wherever it stands."""
    prefix = draw(
        st.sampled_from(["", "", '{"step": 3}\n', '{"a": [1, {"b": 2}]} ', "Step 2:\n", "<think>x</think>\n"])
        | texts
    )
    tool = draw(st.sampled_from([TOOL[platform]] * 6 + ["tv_use", "computer_use", ""]))
    suffix = draw(st.sampled_from(["", "\n", " trailing <tool_call>{}</tool_call>"]) | texts)
    return prefix + call_text(tool, args) + suffix


@st.composite
def responses(draw, platform, label_args):
    args = draw(answer(platform, label_args))
    tool = draw(
        st.sampled_from([TOOL[platform]] * 5 + ["computer_use" if platform == "mobile" else "mobile_use"])
    )
    think = draw(
        st.sampled_from(
            ["", "Let me look.\n</think>\n", "<think>plan</think>\n", "<think> a </think> b </think>"]
        )
        | texts
    )
    form = draw(st.sampled_from(["tags", "tags", "tags", "unclosed", "bare", "single_quotes", "garbage"]))
    if form == "tags":
        return think + call_text(tool, args) + draw(st.sampled_from(["", "\nDone."]) | texts)
    if form == "unclosed":
        return think + call_text(tool, args, closed=False)
    if form == "bare":
        return think + json.dumps({"name": tool, "arguments": args})
    if form == "single_quotes":
        return think + call_text(tool, args).replace('"', "'")
    return think + draw(texts)


@st.composite
def release_rows(draw):
    """``(response, label string, extra_info dict with list boxes, label args)``."""
    platform = draw(st.sampled_from(["mobile", "desktop"]))
    args = draw(arguments(platform))
    extra = {}
    if draw(st.integers(0, 3)):
        extra["bbox"] = draw(boxes(args.get("coordinate")))
    if draw(st.booleans()):
        extra["bbox2"] = draw(boxes(args.get("coordinate2")))
    if draw(st.integers(0, 3)) == 0:
        other = draw(arguments(platform))
        extra["other_label"] = draw(
            label_strings(platform, other) | st.sampled_from(["garbage", "", {"action": "wait"}])
        )
        if draw(st.booleans()):
            extra["other_bbox"] = draw(boxes(other.get("coordinate")))
        if draw(st.booleans()):
            extra["other_bbox2"] = draw(boxes(other.get("coordinate2")))
    if draw(st.integers(0, 5)) == 0:  # what verl's reward manager adds
        extra.update(num_turns=1, rollout_reward_scores={})
    label = draw(label_strings(platform, args))
    return draw(responses(platform, args)), label, extra, args


def numpy_boxes(extra):
    """The boxes as a pandas-read row holds them (numpy arrays), everything else as it is.

    Only boxes a parquet list column can hold (numbers of one kind, not ragged) become arrays.
    """
    out = dict(extra)
    for k in ("bbox", "bbox2", "other_bbox", "other_bbox2"):
        if isinstance(out.get(k), list) and out[k]:
            try:
                array = np.array(out[k])
            except ValueError:  # ragged
                continue
            if array.dtype.kind in "iuf" and array.tolist() == out[k]:
                out[k] = array
    return out


def ui(response, gt, extra):
    return compute_score("src", response, gt, extra, mode="ui_mopd")


def release_view(r):
    return (r["score"], r["acc"], r["thought_length"])


ISSUE_CALL = '<tool_call>\n{"name": "mobile_use", "arguments": {"action": "wait"}}\n</tool_call>'


# ----------------------------------------------------------------------------- the release's layout


@SETTINGS
@given(row=release_rows())
@example(row=(ISSUE_CALL, '{"step": 3}\n' + ISSUE_CALL, {}, {"action": "wait"}))  # issue 25, class 1
def test_release_layout_rows_score_as_the_release(row):
    response, label, extra, _ = row
    assert ground_truth_layout(label)[0] == "tool_call"  # text before the block never makes it ours
    assert release_view(ui(response, label, extra)) == release_view(reward(response, label, extra))


@SETTINGS
@given(row=release_rows(), other=st.sampled_from(NON_DICTS))
@example(
    row=(
        '<tool_call>{"name": "mobile_use", "arguments": {"action": "type", "text": "hi"}}</tool_call>',
        '<tool_call>{"name": "mobile_use", "arguments": {"action": "type", "text": "Hi"}}</tool_call>',
        {},
        {},
    ),
    other=[],
)  # issue 25, class 2
def test_extra_info_that_is_not_a_dict_is_read_as_none(row, other):
    response, label, _, _ = row
    ours = ui(response, label, other)
    assert ours == ui(response, label, None) == ui(response, label, {})
    assert release_view(ours) == release_view(reward(response, label, {}))
    # the release itself returns only where its first label scores 1.0, which no point action can here
    first = one_label(response, label, other)
    try:
        theirs = reward(response, label, other)
    except AttributeError:
        theirs = None
    assert (theirs is not None) == (first == 1.0)
    if theirs is not None:  # the documented difference: its thought_length is 0
        assert label_key(label) not in POINT_ACTIONS
        assert (theirs["score"], theirs["thought_length"]) == (ours["score"], 0)


def label_key(label):
    """``(tool, action)`` of a label string as the release reads it, or None."""
    try:
        call = read_call(label)
    except Exception:
        return None
    return None if call is None else (call.get("name"), call.get("action"))


@SETTINGS
@given(row=release_rows())
def test_numpy_boxes_read_as_lists_where_the_release_gives_point_actions_minus_one(row):
    response, label, extra, _ = row
    arrays = numpy_boxes(extra)
    assert release_view(ui(response, label, arrays)) == release_view(ui(response, label, extra))
    # the release: -1.0 for a point action's label scored with an array box (of other than one element)
    key = label_key(label)
    scored_with = ["bbox"] + (["bbox2"] if key and key[1] == "swipe" else [])
    if key in POINT_ACTIONS and any(
        isinstance(arrays.get(k), np.ndarray) and arrays[k].size != 1 for k in scored_with
    ):
        assert one_label(response, label, arrays) == -1.0
    elif not any(isinstance(v, np.ndarray) for v in arrays.values()):
        assert one_label(response, label, arrays) == one_label(response, label, extra)


# ----------------------------------------------------------------------------- our layout


@st.composite
def our_rows(draw):
    """``(response, ground-truth dict, extra_info, the release's view: label, boxes, alternatives)``."""
    platform = draw(st.sampled_from(["mobile", "desktop"]))
    args = draw(arguments(platform))
    gt = {"platform": platform, "action": args}
    release_boxes = {"bbox": None, "bbox2": None}
    for key, point in (("bbox", args.get("coordinate")), ("bbox2", args.get("coordinate2"))):
        if draw(st.booleans()):
            pairs = box_around(point, draw)
            gt[key] = [*pairs[0], *pairs[1]] if draw(st.booleans()) else pairs
            release_boxes[key] = pairs
    alternatives = []
    if draw(st.integers(0, 3)) == 0:
        alt = draw(arguments(platform))
        pairs = box_around(alt.get("coordinate"), draw) if draw(st.booleans()) else None
        gt["alternatives"] = [{"action": alt, **({"bbox": pairs} if pairs else {})}]
        alternatives.append(({"name": TOOL[platform], **alt}, {"bbox": pairs, "bbox2": None}))
    extra = draw(
        st.sampled_from(
            [None, {}, {"platform": platform, "id": "t", "index": 0, "bbox": None, "split": "train"}]
        )
    )
    label = {"name": TOOL[platform], **args}
    return draw(responses(platform, args)), gt, extra, (label, release_boxes, alternatives)


def pandas_and_pylist(row: dict) -> tuple[dict, dict]:
    """One parquet row as verl's readers hand it over: pandas (numpy arrays) and datasets (lists)."""
    table = pa.Table.from_pylist([row])
    return table.to_pandas().iloc[0].to_dict(), table.to_pylist()[0]


@SETTINGS
@given(row=our_rows())
def test_our_layout_is_the_release_rules_applied_to_its_action_in_every_row_shape(row):
    response, gt, extra, (label, release_boxes, alternatives) = row
    want = reward(response, label, {**release_boxes}, alternatives)
    want["thought_length"] = reward(response, label, extra or {})["thought_length"]
    for shape in (gt, json.dumps(gt), json.dumps(gt, indent=1) + "\n"):
        assert ground_truth_layout(shape)[0] == "json"
        assert release_view(ui(response, shape, extra)) == release_view(want), shape
    try:
        from_pandas, from_datasets = pandas_and_pylist({"gt": gt, "extra": extra})
    except pa.ArrowException:  # mixed types in one list, an empty struct
        return
    for mode in ("strict", "ui_mopd"):
        kw = {"bad_truth": "invalid"} if mode == "strict" else {}
        assert compute_score(
            "s", response, from_pandas["gt"], from_pandas["extra"], mode, **kw
        ) == compute_score("s", response, from_datasets["gt"], from_datasets["extra"], mode, **kw)


@SETTINGS
@given(
    text=fragments("ab <>/\\\"'{}", 20),
    platform=st.sampled_from(["mobile", "desktop"]),
)
@example(text="<tool_call>", platform="mobile")  # issue 25, class 4
@example(
    text='see <tool_call>{"name": "mobile_use", "arguments": {"action": "wait"}}</tool_call>',
    platform="mobile",
)
def test_a_label_text_holding_tool_calls_is_still_read_as_our_layout(text, platform):
    gt = {"platform": platform, "action": {"action": "type", "text": text}}
    echo = call_text(TOOL[platform], {"action": "type", "text": text})
    for shape in (gt, json.dumps(gt), json.dumps(gt, ensure_ascii=False)):
        assert ground_truth_layout(shape)[0] == "json"
        truth = read_ground_truth(shape)
        assert (truth.layout, truth.primary) == ("json", gt["action"])
        assert strict_targets(truth)[0].action.text == text
        if "</" in text or "<think" in text:  # a response holding these is another matter (its own parser)
            continue
        for mode in ("strict", "ui_mopd"):
            r = compute_score("s", "</think>" + echo, shape, {"platform": platform}, mode)
            assert (r["score"], r["platform"]) == (1.0, platform), (mode, shape)


# ----------------------------------------------------------------------------- the two modes


AGREEING_FIELDS = {
    "type": {"text": st.text("aB c", max_size=8)},
    "answer": {"text": st.text("ab", max_size=4)},
    "key": {"keys": key_lists},
    "system_button": {"button": st.sampled_from(["Back", "Home"])},
    "terminate": {"status": st.sampled_from(["success", "failure"])},
}


def agreeing_args(name):
    """A label both modes score alike: valid in our schema, a point where the action takes one (in the test's boxes)."""
    fixed = {}
    if FIELDS[name][0] == "coordinate":
        fixed["coordinate"] = st.just([500, 500])
        if name in ("swipe", "left_click_drag"):
            fixed["coordinate2"] = st.just([500, 100])
        if name in ("scroll", "hscroll"):
            fixed["pixels"] = st.sampled_from([-5, 3])
    return st.fixed_dictionaries({"action": st.just(name), **fixed, **AGREEING_FIELDS.get(name, {})})


@SETTINGS
@given(
    data=st.data(),
    platform=st.sampled_from(["mobile", "desktop"]),
    layout=st.sampled_from(["dict", "json", "release", "pandas"]),
)
def test_the_modes_agree_wherever_the_documented_differences_do_not_apply(data, platform, layout):
    scored = sorted(TABLES[TOOL[platform]])  # the documented difference: the rest score -1.0 in ui_mopd
    args = data.draw(st.sampled_from(scored).flatmap(agreeing_args))
    box = [[450, 450], [550, 550]] if "coordinate" in args else None
    other = data.draw(st.sampled_from([a for a in scored if a != args["action"]]).flatmap(agreeing_args))
    other_args = {**{k: v for k, v in args.items() if k != "action"}, **other}
    response = data.draw(st.sampled_from([
        ("echo", 1.0, "<think>x</think>\n" + call_text(TOOL[platform], args)),
        ("other action", -0.5, "ok\n</think>" + call_text(TOOL[platform], other_args)),
        ("no call", -1.0, "I do not know"),
    ]))  # fmt: skip
    _, want, text = response
    extra = data.draw(st.sampled_from(["none", "prepare", "numpy"]))
    if layout == "release":
        gt = data.draw(st.sampled_from(["", '{"step": 1}\n'])) + call_text(TOOL[platform], args)
        extra_info = {"bbox": box, "bbox2": [[450, 50], [550, 150]] if args["action"] == "swipe" else None}
    else:
        gt = {"platform": platform, "action": args, **({"bbox": [*box[0], *box[1]]} if box else {})}
        if args["action"] == "swipe":
            gt["bbox2"] = [450, 50, 550, 150]
        extra_info = {"platform": platform, "id": "t", "index": 0, "bbox": gt.get("bbox"), "split": "train"}
        if layout == "json":
            gt = json.dumps(gt)
        elif layout == "pandas":
            gt = pandas_and_pylist({"gt": gt})[0]["gt"]
    extra_info = {"none": None, "prepare": extra_info, "numpy": numpy_boxes(extra_info)}[extra]
    strict, release = compute_score("s", text, gt, extra_info), ui(text, gt, extra_info)
    assert strict["score"] == release["score"] == want, (strict, release)
    assert (strict["platform"], strict["thought_length"]) == (release["platform"], release["thought_length"])


@pytest.mark.parametrize("other", NON_DICTS[1:])
def test_strict_mode_refuses_extra_info_that_is_not_a_dict_where_ui_mopd_reads_none(other):
    gt = {"platform": "mobile", "action": {"action": "wait"}}
    text = "</think>" + call_text("mobile_use", {"action": "wait"})
    with pytest.raises(ValueError, match="extra_info="):
        compute_score("s", text, gt, other)
    assert compute_score("s", text, gt, other, bad_truth="invalid")["reason"] == "invalid:extra_info"
    assert ui(text, gt, other) == ui(text, gt, None)
    assert ui(text, gt, other)["score"] == 1.0


@SETTINGS
@given(row=release_rows())
@example(row=(ISSUE_CALL, '{"step": 3}\n' + ISSUE_CALL, {}, {"action": "wait"}))
def test_strict_mode_reads_the_label_the_release_reads(row):
    _, label, _, _ = row
    try:
        theirs = read_call(label)
    except Exception:
        theirs = None
    if theirs is None:
        with pytest.raises(ValueError, match="readable <tool_call> label"):
            release_label(label)
        return
    name, arguments = release_label(label)
    assert {"name": name, **arguments} == theirs
    clean = "<" not in json.dumps(arguments)
    if (
        name in TOOL.values() and clean
    ):  # strict scores the label's echo 1.0 whenever it is valid in our schema
        try:
            r = compute_score("s", call_text(name, arguments), label, {})
        except ValueError as e:
            assert "ground_truth.action" in str(e)
        else:
            assert (r["score"], r["platform"]) == (1.0, "mobile" if name == "mobile_use" else "desktop")
