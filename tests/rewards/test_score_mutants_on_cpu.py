"""Strict mode's small pieces, each value worked out by hand (found by mutation testing of
``verl_mopd/rewards/score.py``, scripts/mutation.sh; docs/reliability.md)."""

import pytest

from verl_mopd.errors import ConfigError
from verl_mopd.rewards import score


@pytest.mark.parametrize("start, end, min_length, want", [
    ((0, 0), (100, 0), 0.04, ("x", 1)),
    ((100, 0), (0, 0), 0.04, ("x", -1)),
    ((0, 0), (0, 100), 0.04, ("y", 1)),
    ((0, 100), (0, 0), 0.04, ("y", -1)),
    ((0, 0), (30, 100), 0.04, ("y", 1)),      # |dy| > |dx|, and dy is not end[1] - start[0] = 100 either
    ((0, 0), (100, 100), 0.04, ("x", 1)),     # a tie goes to x
    ((0, 0), (-100, 100), 0.04, ("x", -1)),
    ((0, 0), (50, 0), 0.04, ("x", 1)),        # the length is hypot(dx, dy): 0.05
    ((0, 0), (40, 0), 0.04, ("x", 1)),        # exactly swipe_min_length (40 / 1000): long enough
    ((0, 0), (39, 0), 0.04, ("none", 0)),
    ((0, 0), (1, 0), 0.0, ("x", 1)),          # the sign of dx = 1, dy = 1 is +1
    ((0, 0), (0, 1), 0.0, ("y", 1)),
    ((5, 5), (5, 5), 0.0, ("x", -1)),         # no move with no minimum length: the tie rule, sign of dx <= 0
])
def test_direction_is_the_dominant_axis_and_its_sign(start, end, min_length, want):
    assert score.direction(start, end, min_length) == want


@pytest.mark.parametrize("value, want", [(None, 0), (2.5, 1), (0.5, 1), (0.0, 0), (-0.5, -1), (-3.0, -1)])
def test_sign(value, want):
    assert score._sign(value) == want


@pytest.mark.parametrize("a, b, want", [
    ("", "", 1.0),
    ("click", "", 0.0),
    ("", "click", 0.0),
    ("a b", "c d", 0.0),
    ("a b", "a c", 0.5),                       # p = r = 1/2
    ("a b c d", "a", 0.4),                     # p = 1/4, r = 1: 2 * 0.25 / 1.25
    ("a a b", "a b b", 2 / 3),                 # two common (a once, b once): p = r = 2/3
])
def test_token_f1(a, b, want):
    assert score.token_f1(a, b) == pytest.approx(want, rel=1e-12)


def test_make_configs_caches_and_builds_unhashable_values_uncached():
    assert score.make_configs(bbox_scale=1.3) is score.make_configs(bbox_scale=1.3)
    assert score.make_configs(bbox_scale=1.3)[0].bbox_scale == 1.3
    with pytest.raises(ValueError, match=r"unknown reward_kwargs \['not_a_field'\]"):
        score.make_configs(not_a_field=[1, 2])  # a list: not hashable, so the uncached path


def _result(platform, score_value, acc, parsed, reason):
    return {"platform": platform, "score": score_value, "acc": acc, "parsed": parsed, "reason": reason}


def test_summarize_per_platform_and_all():
    rows = [_result("desktop", 1.0, 1.0, True, "correct"),
            _result("desktop", -0.5, 0.0, True, "partial:coordinate"),
            _result("desktop", -1.0, 0.0, False, "invalid:parse"),
            _result("desktop", -1.0, 0.0, False, "invalid:parse"),
            {"score": -0.5, "acc": 0.0, "parsed": True, "reason": "partial:text"}]
    out = score.summarize(rows)
    assert set(out) == {"desktop", "unknown", "all"}
    assert out["desktop"] == {"n": 4, "score": -0.375, "acc": 0.25, "parsed": 0.5, "correct": 1, "partial": 1,
                              "invalid": 2, "reasons": {"invalid:parse": 2, "correct": 1, "partial:coordinate": 1}}
    assert list(out["desktop"]["reasons"]) == ["invalid:parse", "correct", "partial:coordinate"]  # most common first
    assert out["unknown"] == {"n": 1, "score": -0.5, "acc": 0.0, "parsed": 1.0, "correct": 0, "partial": 1,
                              "invalid": 0, "reasons": {"partial:text": 1}}
    assert out["all"]["n"] == 5 and out["all"]["score"] == pytest.approx(-0.4)
    assert (out["all"]["correct"], out["all"]["partial"], out["all"]["invalid"]) == (1, 2, 2)


@pytest.mark.parametrize("kwargs", [
    {}, {"correct": 1, "partial": -1, "invalid": -1},             # partial == invalid is allowed
    {"bbox_scale": 0.5}, {"point_tolerance": 0}, {"point_tolerance": 0.5}, {"swipe_min_length": 0},
    {"swipe_min_length": 0.5}, {"text_f1": 1}, {"text_edit_similarity": 1.0}, {"text_f1": 0.5},
])
def test_score_config_accepts(kwargs):
    score.ScoreConfig(**kwargs)


BOUNDS = "bbox_scale must be > 0, point_tolerance and swipe_min_length >= 0"


@pytest.mark.parametrize("kwargs, message", [
    ({"correct": "a"}, "correct='a': must be a finite number"),
    ({"correct": True}, "correct=True: must be a finite number"),
    ({"partial": float("nan")}, "partial=nan: must be a finite number"),
    ({"correct": float("nan"), "bbox_scale": 0}, "correct=nan: must be a finite number"),  # no order / bounds check
    ({"correct": 0.5, "partial": 0.5}, "correct=0.5, partial=0.5, invalid=-1.0: need correct > partial >= invalid"),
    ({"bbox_scale": 0}, BOUNDS), ({"bbox_scale": -1}, BOUNDS),
    ({"point_tolerance": -0.1}, BOUNDS), ({"swipe_min_length": -0.1}, BOUNDS),
    ({"text_f1": 0}, "text_f1=0: must be None or in (0, 1]"),
    ({"text_f1": 1.5}, "text_f1=1.5: must be None or in (0, 1]"),
    ({"text_f1": True}, "text_f1=True: must be None or in (0, 1]"),
    ({"text_edit_similarity": "a"}, "text_edit_similarity='a': must be None or in (0, 1]"),
    ({"bad_truth": "skip"}, "bad_truth='skip': allowed ['raise', 'invalid']"),
    ({"bbox_scale": 0, "text_f1": 2}, BOUNDS + "; text_f1=2: must be None or in (0, 1]"),
])
def test_score_config_refuses_with_one_message_per_field(kwargs, message):
    with pytest.raises(ConfigError) as error:
        score.ScoreConfig(**kwargs)
    assert error.value.what == "reward config" and error.value.errors == message.split("; ")


def _action(platform, **arguments):
    from _reward_helpers import call

    from verl_mopd.rewards.parse import ParseError, parse_action

    action = parse_action(call(platform, **arguments), platform)
    assert not isinstance(action, ParseError), action
    return action


def test_score_action_against_a_target_a_bare_action_and_a_platform():
    truth = _action("mobile", action="click", coordinate=[500, 500])
    near, far = _action("mobile", action="click", coordinate=[510, 500]), _action("mobile", action="click",
                                                                                  coordinate=[900, 900])
    result = score.score_action(near, truth)  # a bare Action: no box, the 0.04 distance rule
    assert result == score.ScoreResult("correct", 1.0, True, True, "ok", {"coordinate": True})
    result = score.score_action(far, score.Target(truth, bbox=(850, 850, 950, 950)), platform="mobile")
    assert result == score.ScoreResult("correct", 1.0, True, True, "ok", {"coordinate": True})  # inside the box
    result = score.score_action(far, truth, config=score.ScoreConfig(partial=-0.25))
    assert result == score.ScoreResult("partial", -0.25, True, False, "partial:coordinate", {"coordinate": False})
    swipe = _action("mobile", action="swipe", coordinate=[500, 500], coordinate2=[500, 100])
    assert score.score_action(swipe, truth) == score.ScoreResult("partial", -0.5, False, False, "partial:action", {})
    with pytest.raises(ValueError, match=r"^platform='desktop' but the ground truth is a mobile action$"):
        score.score_action(near, truth, platform="desktop")


@pytest.mark.parametrize("pred, truth, config, want", [
    (None, None, {}, True), (None, "a", {}, False), ("a", None, {}, False),
    ("Hello", "Hello", {"text_case_sensitive": True, "text_edit_similarity": None}, True),
    ("hello", "Hello", {"text_case_sensitive": True, "text_edit_similarity": None}, False),
    ("abcd", "abcde", {}, True),                  # length ratio and similarity exactly 0.8: accepted
    ("abcde", "abcdx", {}, True),                 # similarity exactly 0.8 (rapidfuzz's float cutoff refused it)
    ("abcd", "abce", {}, False),                  # 0.75
    ("abc", "abcde", {}, False),                  # 0.6
    ("a b", "a c", {"text_edit_similarity": None, "text_f1": 0.5}, True),   # F1 exactly 0.5: accepted
    ("a b", "c d", {"text_edit_similarity": None, "text_f1": 0.5}, False),
    ("x" * 1999 + "a", "x" * 1999 + "b", {}, True),   # 2000 characters: still compared by edit distance
    ("x" * 2000 + "a", "x" * 2000 + "b", {}, False),  # longer: equality (and F1) only
])
def test_text_match(pred, truth, config, want):
    assert score.text_match(pred, truth, score.ScoreConfig(**config)) is want


def _drag_target(**arguments):
    return score.Target(_action("desktop", action="left_click_drag", **arguments), bbox=(100, 100, 200, 200))


@pytest.mark.parametrize("pred, target, want", [
    # the truth gives the end point only: the prediction's end (coordinate2, else coordinate) must be in its box
    ({"coordinate": [150, 150]}, {"coordinate": [150, 150]}, {"coordinate": True}),
    ({"coordinate": [900, 900], "coordinate2": [150, 150]}, {"coordinate": [150, 150]}, {"coordinate": True}),
    ({"coordinate": [150, 150], "coordinate2": [900, 900]}, {"coordinate": [150, 150]}, {"coordinate": False}),
    ({"coordinate": [190, 190]}, {"coordinate": [110, 110]}, {"coordinate": True}),   # in the box, 0.11 away
    # start and end in the truth: a prediction without both fails both
    ({"coordinate": [150, 150]}, {"coordinate": [150, 150], "coordinate2": [150, 600]},
     {"direction": False, "coordinate": False}),
    ({"coordinate": [150, 150], "coordinate2": [150, 500]}, {"coordinate": [150, 150], "coordinate2": [150, 600]},
     {"direction": True, "coordinate": True}),
    ({"coordinate": [190, 190], "coordinate2": [190, 500]}, {"coordinate": [110, 110], "coordinate2": [110, 600]},
     {"direction": True, "coordinate": True}),                                         # the start by the box
    ({"coordinate": [150, 150], "coordinate2": [600, 150]}, {"coordinate": [150, 150], "coordinate2": [150, 600]},
     {"direction": False, "coordinate": True}),
])
def test_drag_fields(pred, target, want):
    p = _action("desktop", action="left_click_drag", **pred)
    assert score._drag_fields(p, _drag_target(**target), score.ScoreConfig()) == want
