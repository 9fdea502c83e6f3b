"""Schema, normalization and the cleaning rules: each rule keeps and drops what it should, counts add up."""

from __future__ import annotations

import json

import pytest
from _data_helpers import record
from hypothesis import given, settings
from hypothesis import strategies as st

from verl_mopd.data.clean import RULES, CleanConfig, check_structure, clean, clean_report, format_report
from verl_mopd.data.fixtures import make_fixture
from verl_mopd.data.schema import (
    SchemaError,
    Step,
    Trajectory,
    read_jsonl,
    step_action,
    step_bbox,
    trajectory_from_dict,
    trajectory_to_dict,
    write_jsonl,
)
from verl_mopd.rewards.actions import ActionError


@pytest.fixture(scope="module")
def fixture_trajs(tmp_path_factory):
    path = make_fixture(str(tmp_path_factory.mktemp("fx")), per_platform=3)
    return list(read_jsonl(path))


def test_each_rule_drops_exactly_its_bad_trajectory(fixture_trajs):
    cfg = CleanConfig()
    kept, drops = clean(fixture_trajs, cfg)
    assert {d.id: d.rule for d in drops} == {f"bad-{r}": r for r in RULES}
    assert all(t.id.startswith("good-") for t in kept) and len(kept) == 6
    report = clean_report(fixture_trajs, kept, drops, cfg)
    tot = report["total"]
    for unit in ("trajectories", "steps"):
        assert tot["input"][unit] == tot["kept"][unit] + sum(d[unit] for d in tot["dropped"].values())
    assert tot["dropped"]["max_steps"] == {"trajectories": 1, "steps": 41}
    assert report["platforms"]["mobile"]["dropped"]["structure"]["trajectories"] == 0
    json.dumps(report)  # serializable
    table = format_report(report)
    for r in RULES:
        assert f"dropped: {r}" in table


@pytest.mark.parametrize("rule", RULES)
def test_each_rule_is_switchable(fixture_trajs, rule):
    cfg = CleanConfig(rules=tuple(r for r in RULES if r != rule))
    kept, drops = clean(fixture_trajs, cfg)
    assert rule not in {d.rule for d in drops}
    report = clean_report(fixture_trajs, kept, drops, cfg)
    assert rule in report["disabled"] and rule not in report["total"]["dropped"]
    # the bad trajectory of that rule now passes (or a later rule catches it), never silently vanishes
    assert len(kept) + len(drops) == len(fixture_trajs)
    if rule in ("max_steps", "env_mismatch", "subtasks", "action_space"):
        assert f"bad-{rule}" in {t.id for t in kept}


def _traj(indices, actions=None, shots=None):
    actions = actions or [{"action": "wait"}] * len(indices)
    shots = shots or [f"/x/{i}.png" for i in range(len(indices))]
    steps = tuple(Step(i, s, a) for i, s, a in zip(indices, shots, actions))
    return Trajectory("t", "desktop", "q", steps, coords="grid")


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(min_value=0, max_value=6), min_size=1, max_size=8))
def test_structure_passes_iff_indices_are_0_1_2(indices):
    assert (check_structure(_traj(indices)) is None) == (indices == list(range(len(indices))))


def test_structure_duplicates_and_empty():
    assert check_structure(_traj([0, 1, 1])).kind == "duplicated_index"
    assert check_structure(_traj([0, 2])).kind == "non_consecutive"
    assert check_structure(_traj([1, 2])) == ("bad_start", "step indices start at 1, not 0")
    same = check_structure(_traj([0, 1], shots=["/a.png", "/a.png"]))
    assert same.kind == "duplicate_step" and "repeats step 0" in same.detail
    assert check_structure(_traj([0, 1], shots=["/a.png", "/b.png"])) is None
    assert check_structure(Trajectory("t", "mobile", "q", ())) == ("no_steps", "no steps")


def test_action_space_aliases_grid_and_rejects(tmp_path):
    rec = record(str(tmp_path), platform="mobile", actions=[{"action": "tap", "coordinate": [25, 10]}])
    t = trajectory_from_dict(rec)
    a = step_action(t, t.steps[0])
    assert a.action == "click" and a.coordinate == (250.0, 200.0)  # 25/100, 10/50 of the screen
    bad = [
        {"action": "left_click", "coordinate": [10, 10]},  # desktop action on mobile
        {"action": "click", "coordinate": [150, 10]},  # outside the 100x50 screen
        {"action": "swipe", "coordinate": [1, 1]},  # missing coordinate2
    ]
    for i, act in enumerate(bad):
        t = trajectory_from_dict(record(str(tmp_path), tid=f"b{i}", platform="mobile", actions=[act]))
        kept, drops = clean([t], CleanConfig(rules=("action_space",)))
        assert not kept and drops[0].rule == "action_space" and "step 0" in drops[0].detail, act
    # the student's action set is configurable: ask_user is offered by default, not when left out
    t = trajectory_from_dict(record(str(tmp_path), tid="ok", platform="mobile", actions=[{"action": "ask_user", "text": "?"}]))
    assert clean([t], CleanConfig(rules=("action_space",)))[0]
    sets = {"mobile": ("click",), "desktop": ("left_click",)}
    assert not clean([t], CleanConfig(rules=("action_space",), action_sets=sets))[0]


def test_unit_coords_and_bbox_to_grid():
    t = Trajectory(
        "u", "desktop", "q",
        (Step(0, "/s.png", {"action": "left_click", "coordinate": [0.25, 0.5]}, bbox=(0.2, 0.4, 0.3, 0.6)),),
        coords="unit",
    )  # fmt: skip
    assert step_action(t, t.steps[0]).coordinate == (250.0, 500.0)
    assert step_bbox(t, t.steps[0]) == [200, 400, 300, 600]
    t2 = Trajectory("u", "desktop", "q", (Step(0, "/s.png", {"action": "left_click", "coordinate": [1.5, 0.5]}),), coords="unit")
    with pytest.raises(ActionError, match="unit square"):
        step_action(t2, t2.steps[0])


def test_missing_verdict_modes(tmp_path):
    t = trajectory_from_dict(record(str(tmp_path), judge=None))
    kept, drops = clean([t], CleanConfig())  # default: drop, counted
    assert CleanConfig().missing_verdict == "drop"
    assert not kept and (drops[0].rule, drops[0].kind, drops[0].detail) == ("subtasks", "no_verdict", "no judge verdict")
    with pytest.raises(ValueError, match="no subtask verdict"):
        clean([t], CleanConfig(missing_verdict="error"))
    assert clean([t], CleanConfig(missing_verdict="keep"))[0] == [t]


def test_schema_errors_name_the_field(tmp_path):
    rec = record(str(tmp_path))
    cases = [
        ({"platform": "web"}, "platform='web'"),
        ({"coords": "cm"}, "coords='cm'"),
        ({"steps": "x"}, ".steps="),
        ({"env_mismatch": "no"}, "env_mismatch="),
        ({"screen_size": [0, 10]}, "screen_size="),
    ]
    for over, needle in cases:
        with pytest.raises(SchemaError, match=needle.replace("[", r"\[").replace(".", r"\.")):
            trajectory_from_dict({**rec, **over})
    broken = {**rec, "steps": [{**rec["steps"][0], "index": "0"}]}
    with pytest.raises(SchemaError, match=r"steps\[0\]\.index"):
        trajectory_from_dict(broken)
    with pytest.raises(SchemaError, match="unique"):
        t = trajectory_from_dict(rec)
        clean([t, t], CleanConfig())
    with pytest.raises(ValueError, match="unknown"):
        CleanConfig(rules=("structure", "nope"))


def test_jsonl_roundtrip(tmp_path):
    t = trajectory_from_dict(record(str(tmp_path), subtasks=["a"], env_mismatch=False, source="s", meta={"k": 1}))
    path = str(tmp_path / "out.jsonl")
    assert write_jsonl([t], path) == 1
    (back,) = read_jsonl(path)
    assert back == t and trajectory_to_dict(back) == trajectory_to_dict(t)
