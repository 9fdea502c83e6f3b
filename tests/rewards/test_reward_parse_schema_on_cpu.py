"""Schema, prompt and parser: round trip, fuzzing, grid conversion, verl's reward-function door."""

import json
import math

import numpy as np
import pytest
from _reward_helpers import call, truth
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from verl_mopd.rewards import compute_score
from verl_mopd.rewards.actions import (
    ACTION_SPECS,
    PLATFORMS,
    ActionError,
    from_grid,
    normalize_action,
    normalize_key,
    to_grid,
)
from verl_mopd.rewards.parse import ParseError, decode_json, parse_action
from verl_mopd.rewards.prompts import render_tool_call, system_prompt, tool_definition

LEVELS = {1.0, -0.5, -1.0}
_VALUES = {
    "point": st.tuples(st.integers(0, 1000), st.integers(0, 1000)).map(list)
    | st.tuples(st.floats(0, 1000), st.floats(0, 1000)).map(list),
    "text": st.text(max_size=30),
    "keys": st.lists(st.sampled_from(["ctrl", "alt", "shift", "super", "enter", "escape", "a", "f5"]), min_size=1, max_size=3),
    "number": st.integers(-1000, 1000) | st.floats(-1e6, 1e6, allow_nan=False),
    "button": st.sampled_from(["Back", "Home", "Menu", "Enter"]),
    "status": st.sampled_from(["success", "failure"]),
}


@st.composite
def schema_actions(draw):
    platform = draw(st.sampled_from(PLATFORMS))
    spec = draw(st.sampled_from(list(ACTION_SPECS[platform].values())))
    args = {"action": spec.name}
    for a in spec.args:
        if a.required or draw(st.booleans()):
            args[a.name] = draw(_VALUES[a.kind])
    return platform, args


@settings(max_examples=300, deadline=None)
@given(schema_actions())
def test_round_trip_every_schema_action(example):
    """Every action the schema allows, rendered as the prompt asks, parses back to itself."""
    platform, args = example
    action = normalize_action(platform, args)
    for think in ("", "Let me look.\n</think>\n"):
        parsed = parse_action(think + render_tool_call(action), platform)
        assert parsed == action
    assert compute_score("t", render_tool_call(action), {"platform": platform, "action": args})["score"] == 1.0


def test_prompt_and_parser_share_one_schema():
    for platform in PLATFORMS:
        fn = tool_definition(platform, list(ACTION_SPECS[platform]))["function"]
        assert fn["name"] == {"desktop": "computer_use", "mobile": "mobile_use"}[platform]
        props = fn["parameters"]["properties"]
        assert props["action"]["enum"] == list(ACTION_SPECS[platform])
        schema_args = {a.name for s in ACTION_SPECS[platform].values() for a in s.args}
        assert set(props) == {"action"} | schema_args
        text = system_prompt(platform)
        assert "<tools>" in text and "<tool_call>" in text
        assert json.loads(text.split("<tools>\n")[1].split("\n</tools>")[0]) == tool_definition(platform)
    assert "ask_user" in system_prompt("mobile")  # as MobileWorld's and the UI-MOPD release's mobile prompts
    assert "ask_user" not in system_prompt("mobile", actions=["click", "terminate"])
    with pytest.raises(ValueError, match="allowed mobile actions"):
        system_prompt("mobile", actions=["left_click"])


def test_action_sets_match_the_issue():
    assert set(ACTION_SPECS["desktop"]) == {
        "key", "type", "mouse_move", "left_click", "left_click_drag", "right_click", "middle_click",
        "double_click", "triple_click", "scroll", "hscroll", "wait", "terminate", "answer",
    }  # fmt: skip
    assert set(ACTION_SPECS["mobile"]) == {
        "click", "long_press", "swipe", "type", "key", "system_button", "open", "wait", "terminate",
        "answer", "ask_user",
    }  # fmt: skip


def test_key_aliases():
    for alias, canon in [("Control", "ctrl"), ("CMD", "super"), ("win", "super"), ("Return", "enter"), ("Esc", "escape"), ("meta", "super")]:
        assert normalize_key(alias) == canon


def test_errors_name_field_value_and_allowed():
    with pytest.raises(ActionError, match=r"action='fly'.*allowed") as e:
        normalize_action("mobile", {"action": "fly"})
    assert e.value.field == "action"
    with pytest.raises(ActionError, match="status='maybe'.*success"):
        normalize_action("desktop", {"action": "terminate", "status": "maybe"})
    with pytest.raises(ActionError, match="platform='tv'"):
        normalize_action("tv", {"action": "wait"})


def test_grid_conversion():
    assert to_grid(960, 540, 1920, 1080) == (500, 500)
    assert to_grid(1920, 0, 1920, 1080) == (1000, 0)
    gx, gy = to_grid(123.0, 456.0, 1080, 2400, integer=False)
    assert from_grid(gx, gy, 1080, 2400) == pytest.approx((123.0, 456.0))
    with pytest.raises(ValueError, match="outside the screen"):
        to_grid(2000, 0, 1920, 1080)
    with pytest.raises(ValueError, match="width"):
        to_grid(0, 0, 0, 1080)


def test_lenient_decoder_against_json():
    for obj in [{"a": [1, 2.5, -3e2, True, None, "x\"y\\n"]}, [], {"k": {"n": {}}}, "\u00e9", 0.5]:
        s = json.dumps(obj)
        assert decode_json(s) == obj
    assert decode_json("{'a': 'it\\'s', b: [1, 2,], 'c': None,}") == {"a": "it's", "b": [1, 2], "c": None}
    assert decode_json("{'x': +.5}") == {"x": 0.5}
    with pytest.raises(ValueError):
        decode_json("{'a': 1")
    with pytest.raises(ValueError):
        decode_json("[" * 5000)


_GT = [
    truth("mobile", [100, 100, 300, 300], action="click", coordinate=[200, 200]),
    truth("desktop", action="key", keys=["ctrl", "c"]),
    "<tool_call>{\"name\": \"mobile_use\", \"arguments\": {\"action\": \"swipe\", \"coordinate\": [5, 5], \"coordinate2\": [9, 900]}}</tool_call>",
]
_SEEDS = [
    call("mobile", action="click", coordinate=[200, 200]),
    call("desktop", action="key", keys=["ctrl", "c"]),
    "<think>x</think>" + call("mobile", think="", action="swipe", coordinate=[5, 5], coordinate2=[9, 900]),
]


@st.composite
def mutated(draw):
    s = draw(st.sampled_from(_SEEDS))
    for _ in range(draw(st.integers(1, 6))):
        op = draw(st.sampled_from(["cut", "insert", "delete", "dup"]))
        i = draw(st.integers(0, len(s)))
        if op == "cut":
            s = s[:i]
        elif op == "insert":
            s = s[:i] + draw(st.sampled_from(["{", "}", "[", "'", '"', ",", "<think>", "</think>", "<tool_call>", "NaN", "\\", "\x00", "é", "1e999"])) + s[i:]
        elif op == "delete":
            s = s[:i] + s[i + 1 :]
        else:
            s = s + s[i:]
    return s


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.one_of(st.text(max_size=300), mutated()), st.sampled_from(range(len(_GT))), st.sampled_from(["strict", "ui_mopd"]))
def test_fuzz_never_raises_and_stays_on_levels(text, gt_index, mode):
    r = compute_score("t", text, _GT[gt_index], {}, mode=mode)
    assert r["score"] in LEVELS
    assert r["acc"] == (1.0 if r["score"] == 1.0 else 0.0)
    assert isinstance(r["reason"], str) and isinstance(r["thought_length"], int)
    for platform in PLATFORMS:
        p = parse_action(text, platform)
        assert isinstance(p, ParseError) or all(
            math.isfinite(c) and 0 <= c <= 1000 for pt in (p.coordinate, p.coordinate2) if pt for c in pt
        )


@settings(max_examples=50, deadline=None)
@given(st.binary(max_size=200))
def test_fuzz_non_text_inputs(data):
    for value in (data, data.decode("latin-1"), None, 5, [data]):
        assert compute_score("t", value, _GT[0])["score"] in LEVELS
        assert compute_score("t", value, _GT[2], {}, mode="ui_mopd")["score"] in LEVELS


def test_megabyte_input_is_rejected_fast():
    import time

    text = ("{[<tool_call>'" * 80_000)[:1_048_576]
    t0 = time.perf_counter()
    r = compute_score("t", text, _GT[0])
    assert r["reason"] == "invalid:too_long"
    assert time.perf_counter() - t0 < 0.05
    # the release mode reads any length, but stays linear
    t0 = time.perf_counter()
    assert compute_score("t", text, _GT[2], {}, mode="ui_mopd")["score"] == -1.0
    assert time.perf_counter() - t0 < 0.5


def test_through_verl_custom_reward_function_and_batch_stacking():
    """verl 0.9.1 loads the function with get_custom_reward_fn and stacks each result key."""
    from omegaconf import OmegaConf
    from verl.trainer.ppo.reward import get_custom_reward_fn

    for mode in ("strict", "ui_mopd"):
        cfg = OmegaConf.create(
            {"reward": {"custom_reward_function": {"path": "pkg://verl_mopd.rewards.score", "name": "compute_score", "reward_kwargs": {"mode": mode}}}}
        )
        fn = get_custom_reward_fn(cfg)
        texts = [_SEEDS[0], "junk", call("mobile", action="click", coordinate=[900, 900])]
        results = [fn(data_source="m", solution_str=t, ground_truth=_GT[0], extra_info={"num_turns": 2, "rollout_reward_scores": {}}) for t in texts]
        assert [r["score"] for r in results] == [1.0, -1.0, -0.5]
        keys = list(results[0])
        assert all(list(r) == keys for r in results)
        stacked = {k: np.array([r[k] for r in results]) for k in keys}  # as agent_loop.py does
        assert stacked["acc"].dtype == np.float64 and stacked["score"].tolist() == [1.0, -1.0, -0.5]
