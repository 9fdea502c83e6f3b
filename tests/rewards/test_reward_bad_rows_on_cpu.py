"""One malformed row never kills the reward worker; off-grid boxes are bad truth; text matching is bounded in time."""

import json
import time

import pytest
from _reward_helpers import call, truth
from hypothesis import given, settings
from hypothesis import strategies as st

from verl_mopd.rewards import compute_score
from verl_mopd.rewards.score import edit_similarity

KEYS = {"score", "acc", "thought_length", "parsed", "action_match", "args_match", "reason", "platform"}
GOOD = call("desktop", action="left_click", coordinate=[620, 140])
GT = truth("desktop", bbox=[600, 120, 640, 160], action="left_click", coordinate=[620, 140])

junk = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=True) | st.text(max_size=12),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=6), inner, max_size=4),
    max_leaves=12,
)
#: the field names a ground truth / extra_info has, so that junk lands where it matters
fields = st.sampled_from(["platform", "action", "bbox", "bbox2", "alternatives", "other_label", "other_bbox",
                          "other_bbox2", "tokenizer", "coordinate", "text", "keys"])


@st.composite
def malformed_rows(draw):
    """A valid row with a random field replaced by junk, or junk outright, in either layout."""
    kind = draw(st.sampled_from(["junk", "json_field", "action_field", "tool_call", "extra"]))
    gt, extra = json.loads(json.dumps(GT)), {"bbox": [[600, 120], [640, 160]]}
    if kind == "junk":
        gt = draw(junk)
    elif kind == "json_field":
        gt[draw(fields)] = draw(junk)
    elif kind == "action_field":
        gt["action"][draw(fields)] = draw(junk)
    elif kind == "tool_call":
        body = draw(junk)
        gt = "<tool_call>" + json.dumps(body) + "</tool_call>"
    if kind == "extra" or draw(st.booleans()):
        extra = draw(junk) if draw(st.booleans()) else {**extra, draw(fields): draw(junk)}
    if draw(st.booleans()) and isinstance(gt, dict):
        gt = json.dumps(gt)
    return gt, extra


@settings(max_examples=300, deadline=None)
@given(row=malformed_rows(), mode=st.sampled_from(["strict", "ui_mopd"]))
def test_a_malformed_row_never_raises_with_bad_truth_invalid(row, mode):
    gt, extra = row
    kwargs = {"bad_truth": "invalid"} if mode == "strict" else {}
    r = compute_score("src", GOOD, gt, extra, mode, **kwargs)
    assert set(r) == KEYS and r["score"] in (1.0, -0.5, -1.0)


@settings(max_examples=300, deadline=None)
@given(row=malformed_rows())
def test_with_bad_truth_raise_only_a_valueerror_escapes(row):
    gt, extra = row
    try:
        r = compute_score("src", GOOD, gt, extra)
    except ValueError as e:
        assert str(e)
    else:
        assert set(r) == KEYS


@pytest.mark.parametrize(
    "gt, extra, reason, field",
    [
        (GT, "not a dict", "invalid:extra_info", "extra_info='not a dict'"),
        (GT, [GT], "invalid:extra_info", "extra_info=[{"),
        ("<tool_call>[3, 4]</tool_call>", None, "invalid:ground_truth", "not a readable <tool_call> label"),
        ('<tool_call>"click"</tool_call>', None, "invalid:ground_truth", "not a readable <tool_call> label"),
        ({**GT, "alternatives": 7}, None, "invalid:ground_truth", "ground_truth.alternatives=7"),
        ({**GT, "alternatives": {"action": {}}}, None, "invalid:ground_truth", "ground_truth.alternatives={"),
        ({**GT, "platform": ["desktop"]}, None, "invalid:ground_truth", "ground_truth.platform=['desktop']"),
    ],
)
def test_each_malformed_shape_is_named_or_scored_invalid(gt, extra, reason, field):
    r = compute_score("src", GOOD, gt, extra, bad_truth="invalid")
    assert (r["score"], r["reason"], r["platform"]) == (-1.0, reason, "unknown")
    with pytest.raises(ValueError) as e:
        compute_score("src", GOOD, gt, extra)
    assert field in str(e.value)


@pytest.mark.parametrize(
    "bbox",
    [[-5e8, -5e8, 5e8, 5e8], [0, 0, 1e300, 1e300], [-300, -300, -20, -20], [100, 100, 1000.5, 200],
     [[-1, 0], [10, 10]]],
)
def test_an_off_grid_ground_truth_box_is_bad_truth_in_both_modes(bbox):
    gt = {**GT, "bbox": bbox}
    far = call("desktop", action="left_click", coordinate=[5, 995])
    with pytest.raises(ValueError, match="outside the 0-1000 grid"):
        compute_score("src", far, gt)
    assert compute_score("src", far, gt, bad_truth="invalid")["reason"] == "invalid:ground_truth"
    assert compute_score("src", far, gt, mode="ui_mopd")["score"] == -1.0  # never +1.0 for any click
    assert compute_score("src", far, {**gt, "bbox": [0, 0, 1000, 1000]})["score"] == 1.0  # the whole grid is fine


def _levenshtein(a, b):
    prev = list(range(len(b) + 1))
    for i, ca in enumerate(a, 1):
        cur = [i]
        for j, cb in enumerate(b, 1):
            cur.append(min(prev[j] + 1, cur[j - 1] + 1, prev[j - 1] + (ca != cb)))
        prev = cur
    return prev[-1]


@settings(max_examples=200, deadline=None)
@given(a=st.text(alphabet="abc é", max_size=14), b=st.text(alphabet="abc é", max_size=14))
def test_edit_similarity_is_one_minus_levenshtein_over_the_longer_length(a, b):
    want = 1.0 if not a and not b else 1 - _levenshtein(a, b) / max(len(a), len(b))
    assert edit_similarity(a, b) == pytest.approx(want, abs=1e-12)


def test_a_long_typed_text_is_scored_in_bounded_time():
    label = "the quick brown fox jumps over the lazy dog; " * 44  # ~2000 characters
    typed = label.replace("fox", "cat", 20)  # 60 edits: similarity ~0.97, decided by the edit distance
    gt = truth("mobile", action="type", text=label)
    response = call("mobile", action="type", text=typed)
    compute_score("src", response, gt)
    t = time.process_time()
    for _ in range(20):
        r = compute_score("src", response, gt)
    per_call = (time.process_time() - t) / 20
    assert r["score"] == 1.0 and per_call < 0.02, per_call  # a Python Levenshtein took ~1.5 s here
