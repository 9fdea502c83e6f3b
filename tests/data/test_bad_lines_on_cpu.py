"""A bad input line is a counted ``parse`` drop naming file:line; the run goes on; ``--strict`` and an empty result exit 1."""

from __future__ import annotations

import copy
import json
import os

import pytest
from _data_helpers import read_jsonl_dicts, record, relative, write_lines
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from verl_mopd.data.clean import CleanConfig, clean, clean_report
from commands import prepare as prepare_main
from verl_mopd.data.convert import ConvertConfig, trajectory_rows
from verl_mopd.data.schema import PARSE, SchemaError, drop_duplicate_ids, read_jsonl


def _good(root: str, tid: str, **over) -> dict:
    return relative(record(root, tid=tid, **over), root)


@pytest.fixture()
def messy(tmp_path):
    """Good records between every kind of bad line; returns (path, {line: expected kind or 'kept'})."""
    root = str(tmp_path)
    g = _good(root, "g1")
    lines: list = [
        b"\xef\xbb\xbf" + json.dumps(g).encode(),  # 1: UTF-8 BOM on the first line
        "",  # 2: blank
        "not json at all",  # 3
        "[1, 2, 3]",  # 4
        "42",  # 5
        {"id": 7},  # 6: missing fields
        {**_good(root, "steps-str"), "steps": "x"},  # 7
        {**g, "id": "idx", "steps": [{**g["steps"][0], "index": "0"}]},  # 8
        {**_good(root, "mis"), "env_mismatch": "no"},  # 9
        {**_good(root, "tv"), "platform": "tv"},  # 10
        {**g, "id": "act", "steps": [{**g["steps"][0], "action": "click"}]},  # 11
        b'{"id": "caf\xe9", "platform": "desktop"}',  # 12: Latin-1, not UTF-8
        json.dumps({**_good(root, "sur"), "instruction": "x"}).replace('"x"', '"\\ud800"'),  # 13: lone surrogate
        "[" * 100_000,  # 14: nested past the JSON parser's depth
        '{"id": "torn", "platform": "desk',  # 15: torn line
        json.dumps(_good(root, "trail")) + " xyz",  # 16: trailing garbage
        _good(root, "g1"),  # 17: duplicate id
        {**_good(root, "meta"), "meta": [1, 2]},  # 18
        json.dumps({**_good(root, "inf"), "screen_size": [1, 2]}).replace("[1, 2]", "[Infinity, 10]"),  # 19
        json.dumps(_good(root, "crlf")) + "\r",  # 20: CRLF
        _good(root, "huge", instruction="long " * 200_000),  # 21: a 1 MB line
    ]
    path = write_lines(os.path.join(root, "mixed.jsonl"), lines)
    with open(path, "ab") as f:
        f.write(json.dumps(_good(root, "last")).encode())  # 22: no final newline
    expected = {1: "kept", 3: "not_json", 4: "not_object", 5: "not_object", 6: "schema", 7: "schema", 8: "schema",
                9: "schema", 10: "schema", 11: "schema", 12: "not_utf8", 13: "not_utf8", 14: "not_json",
                15: "not_json", 16: "not_json", 17: "duplicate_id", 18: "schema", 19: "schema", 20: "kept",
                21: "kept", 22: "kept"}  # fmt: skip
    return path, expected


def test_every_bad_line_is_a_parse_drop_and_the_run_goes_on(messy, tmp_path, capsys):
    path, expected = messy
    out = tmp_path / "out"
    assert prepare_main(["--input", path, "--out", str(out), "--val-fraction", "0", "--no-progress"]) == 0
    dropped = read_jsonl_dicts(str(out / "dropped.jsonl"))
    assert all(d["rule"] == PARSE for d in dropped)
    got = {int(d["where"].rsplit(":", 1)[1]): d["kind"] for d in dropped}
    assert got == {line: kind for line, kind in expected.items() if kind != "kept"}
    for d in dropped:
        assert d["where"].startswith(path + ":") and d["detail"].startswith(d["where"])
    by_line = {int(d["where"].rsplit(":", 1)[1]): d for d in dropped}
    assert "byte 0xe9 at column 12" in by_line[12]["detail"]
    assert ".platform='tv': allowed ['desktop', 'mobile']" in by_line[10]["detail"]
    assert "already read at " + path + ":1" in by_line[17]["detail"]
    assert by_line[6]["id"] == "7" and by_line[3]["id"] == f"{path}:3"
    kept = [t["id"] for t in read_jsonl_dicts(str(out / "cleaned.jsonl"))]
    assert kept == ["g1", "crlf", "huge", "last"]
    report = json.load(open(out / "report.json"))
    assert report["balanced"] and report["total"]["dropped"][PARSE]["trajectories"] == 17
    assert report["total"]["input"]["trajectories"] == 21 and report["kinds"][PARSE]["schema"] == 8
    assert report["platforms"]["unknown"]["input"]["trajectories"] == 10  # lines with no readable platform
    err = capsys.readouterr().err
    assert "17 input line(s) could not be read" in err and f"{path}:3: not JSON" in err and "7 more in dropped.jsonl" in err


def test_strict_exits_1_and_a_rerun_says_so_again(messy, tmp_path, capsys):
    path, _ = messy
    args = ["--input", path, "--out", str(tmp_path / "o"), "--strict", "--no-progress"]
    assert prepare_main(args) == 1
    assert (tmp_path / "o" / "rl" / "train.parquet").is_file()  # outputs are written, the exit code tells
    capsys.readouterr()
    assert prepare_main(args) == 1  # up to date, same outcome
    out, err = capsys.readouterr()
    assert "up to date" in out and "could not be read" in err


def test_nothing_kept_exits_1_and_says_why(tmp_path, capsys):
    root = str(tmp_path)
    rec = _good(root, "a")
    rec["steps"][0]["screenshot"] = "imgs/gone.png"
    src = write_lines(os.path.join(root, "t.jsonl"), [rec, "oops"])
    assert prepare_main(["--input", src, "--out", str(tmp_path / "o"), "--no-progress"]) == 1
    err = capsys.readouterr().err
    assert "kept 0 of 2 trajectories, so no parquet was written" in err and "screenshots 1" in err and "parse 1" in err
    assert "gone.png' does not exist" in err
    assert not (tmp_path / "o" / "rl").exists()
    unjudged = write_lines(os.path.join(root, "u.jsonl"), [_good(root, "u", judge=None)])
    assert prepare_main(["--input", unjudged, "--out", str(tmp_path / "u"), "--no-progress"]) == 1
    assert "--missing-verdict keep" in capsys.readouterr().err
    empty = write_lines(os.path.join(root, "e.jsonl"), [])
    assert prepare_main(["--input", empty, "--out", str(tmp_path / "e"), "--no-progress"]) == 1
    assert "nothing (the input is empty)" in capsys.readouterr().err


def test_reading_without_a_drops_list_raises_at_the_first_bad_line(messy):
    path, _ = messy
    with pytest.raises(SchemaError, match=r"mixed\.jsonl:3: not JSON"):
        list(read_jsonl(path))


def test_bad_agentnet_and_android_control_records_are_parse_drops(tmp_path):
    from verl_mopd.data.readers import read_agentnet, read_android_control

    (tmp_path / "images").mkdir()
    step = {"index": 0, "image": "a.png", "value": {"code": "computer.terminate(status='success')", "thought": "t"}}
    an = write_lines(str(tmp_path / "an.jsonl"), [
        {"task_id": "ok", "instruction": "i", "task_completed": True, "traj": [step]},
        "[]",
        {"task_id": "t1", "instruction": "i", "traj": "nope"},
        {"task_id": "t2", "instruction": "i", "traj": [{**step, "value": {"thought": "no code"}}]},
        {"task_id": "t3", "instruction": "i", "traj": [{**step, "image": 5}]},
        {"task_id": "t4", "instruction": "i", "task_completed": "yes", "traj": [step]},
        {"task_id": "t5", "instruction": None, "traj": [step]},
        {"task_id": ["x"], "instruction": "i", "traj": [step]},
        {"task_id": "t6", "instruction": "i", "traj": [step, "not a step"]},
    ])  # fmt: skip
    drops: list = []
    assert [t.id for t in read_agentnet(an, str(tmp_path / "images"), drops=drops)] == ["ok"]
    assert [(d.id, d.where.rsplit(":", 1)[1], d.platform) for d in drops] == [
        (f"{an}:2", "2", "desktop"), ("t1", "3", "desktop"), ("t2", "4", "desktop"), ("t3", "5", "desktop"),
        ("t4", "6", "desktop"), ("t5", "7", "desktop"), (f"{an}:8", "8", "desktop"), ("t6", "9", "desktop")]  # fmt: skip
    assert drops[3].num_steps == 1 and "traj[0].value.code" in drops[2].detail and "task_completed='yes'" in drops[4].detail
    ep = {"episode_id": 3, "goal": "g", "screenshots": ["s0.png", "s1.png"], "screenshot_widths": [10, 10],
          "screenshot_heights": [20, 20], "actions": ['{"action_type": "wait"}']}  # fmt: skip
    ac = write_lines(str(tmp_path / "ac.jsonl"), [
        ep,
        {**ep, "episode_id": 4, "actions": ['{"action_type": ']},
        {**ep, "episode_id": 5, "screenshot_widths": ["10", 10]},
        {**ep, "episode_id": 6, "actions": ['["click"]']},
        {**ep, "episode_id": 7, "screenshots": [b"x".hex(), 5]},
        {**ep, "episode_id": 8, "step_instructions": [1]},
        {**ep, "episode_id": 9, "actions": ['{"action_type": ["click"]}']},  # unmappable action: action_space later
    ])  # fmt: skip
    drops = []
    ids = [t.id for t in read_android_control(ac, drops=drops)]
    assert ids == ["android_control-3", "android_control-9"]
    assert [d.id for d in drops] == [f"android_control-{i}" for i in (4, 5, 6, 7, 8)]
    assert all(d.platform == "mobile" and d.rule == PARSE for d in drops)
    assert "actions[0]" in drops[0].detail and "screenshot_widths[0]" in drops[1].detail


def test_duplicate_ids_keep_the_first():
    from verl_mopd.data.schema import Trajectory

    ts = [Trajectory("a", "mobile", "q", (), origin="f:1"), Trajectory("b", "mobile", "q", (), origin="f:2"),
          Trajectory("a", "mobile", "q", (), origin="f:3")]  # fmt: skip
    drops: list = []
    assert [t.origin for t in drop_duplicate_ids(ts, drops)] == ["f:1", "f:2"]
    assert drops[0].detail == "f:3: id 'a' was already read at f:1" and drops[0].kind == "duplicate_id"


# --------------------------------------------------------------------------- fuzz: no record crashes the pipeline

NUMBER = st.integers(-(2**70), 2**70) | st.floats(allow_nan=True, allow_infinity=True) | st.sampled_from([0, 1, -1, 0.5])
JSON = st.recursive(
    st.none() | st.booleans() | NUMBER | st.text(max_size=8) | st.lists(NUMBER, min_size=2, max_size=4),  # sizes, boxes
    lambda kids: st.lists(kids, max_size=3) | st.dictionaries(st.text(max_size=6), kids, max_size=3),
    max_leaves=8,
)  # fmt: skip
TOP_KEYS = ["id", "platform", "instruction", "screen_size", "coords", "steps", "subtasks", "judge", "env_mismatch",
            "source", "meta"]  # fmt: skip
STEP_KEYS = ["index", "screenshot", "action", "thought", "description", "bbox", "screen_size"]
ACTION_KEYS = ["action", "coordinate", "coordinate2", "text", "keys", "button", "status", "pixels", "time"]


@pytest.fixture(scope="module")
def base_record(tmp_path_factory):
    root = tmp_path_factory.mktemp("fuzz")
    rec = _good(str(root), "f", actions=[
        {"action": "left_click", "coordinate": [50, 25]}, {"action": "type", "text": "hi"},
        {"action": "terminate", "status": "success"}], subtasks=["a"])  # fmt: skip
    return str(root), rec


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(st.tuples(st.sampled_from(["top", "step", "action", "delete"]), st.integers(0, 10), JSON),
                min_size=1, max_size=4))  # fmt: skip
def test_fuzzed_records_never_crash_reading_cleaning_or_rows(base_record, edits):
    root, base = base_record
    rec = copy.deepcopy(base)
    for where, k, value in edits:
        step = rec["steps"][k % len(rec["steps"])] if isinstance(rec.get("steps"), list) and rec["steps"] else None
        if where == "top":
            rec[TOP_KEYS[k % len(TOP_KEYS)]] = value
        elif where == "step" and isinstance(step, dict):
            step[STEP_KEYS[k % len(STEP_KEYS)]] = value
        elif where == "action" and isinstance(step, dict) and isinstance(step.get("action"), dict):
            step["action"][ACTION_KEYS[k % len(ACTION_KEYS)]] = value
        elif where == "delete":
            rec.pop(TOP_KEYS[k % len(TOP_KEYS)], None)
    path = os.path.join(root, "fuzz.jsonl")
    with open(path, "w", encoding="utf-8") as f:
        f.write(json.dumps(rec) + "\n" + json.dumps({**base, "id": "control"}) + "\n")
    drops: list = []
    trajs = list(drop_duplicate_ids(read_jsonl(path, drops), drops))
    assert len(trajs) + len(drops) == 2 and "control" in {t.id for t in trajs} | {d.id for d in drops}
    kept, rule_drops = clean(trajs, CleanConfig(missing_verdict="keep"))
    report = clean_report(trajs, kept, [*drops, *rule_drops], CleanConfig())
    assert report["balanced"] and report["total"]["input"]["trajectories"] == 2
    for t in kept:
        rl, sft = trajectory_rows(t, "train", ConvertConfig(image_mode="path"))
        assert len(rl) == len(sft) == t.num_steps
        json.dumps(rl, default=str).encode("utf-8")


NASTY = [None, True, 0, -1, 2**70, float("inf"), float("nan"), "", "x", "../../etc/hostname", [], [float("inf"), 1],
         [1, float("nan")], [0, 0], [1, 2, 3, 4], [[1, 2], [3, 4]], [None], ["a"], {}, {"a": 1}, {"action": "wait"}]  # fmt: skip


def test_every_field_with_every_wrong_type_is_read_or_dropped_never_raised(base_record):
    """The table behind the fuzz: each field of the record, its step and its action, set to each nasty value."""
    root, base = base_record
    records = []
    for keys, target in [(TOP_KEYS, None), (STEP_KEYS, "step"), (ACTION_KEYS, "action")]:
        for key in keys:
            for value in NASTY:
                rec = copy.deepcopy(base)
                rec["id"] = f"{target}.{key}={value!r}"
                obj = rec if target is None else rec["steps"][0] if target == "step" else rec["steps"][0]["action"]
                obj[key] = value
                records.append(rec)
    path = os.path.join(root, "table.jsonl")
    with open(path, "w", encoding="utf-8") as f:
        f.writelines(json.dumps(r) + "\n" for r in records)
    drops: list = []
    trajs = list(drop_duplicate_ids(read_jsonl(path, drops), drops))
    kept, rule_drops = clean(trajs, CleanConfig(missing_verdict="keep"))
    report = clean_report(trajs, kept, [*drops, *rule_drops], CleanConfig())
    assert report["total"]["input"]["trajectories"] == len(records) and report["balanced"]
    assert kept and drops and rule_drops  # each outcome happens
    for t in kept:
        rl, _ = trajectory_rows(t, "train", ConvertConfig(image_mode="path"))
        gt = json.loads(rl[0]["reward_model"]["ground_truth"])
        assert gt["platform"] == t.platform


def test_fuzz_control_is_kept(base_record):
    root, base = base_record
    path = os.path.join(root, "control.jsonl")
    write_lines(path, [base])
    (t,) = read_jsonl(path)
    assert clean([t], CleanConfig(missing_verdict="keep"))[0] == [t]


def test_android_control_tfrecord_episodes_with_png_bytes(tmp_path, monkeypatch):
    """The TFRecord path after tensorflow's parse (tensorflow is not installed here: its record dicts are given)."""
    from _data_helpers import png_bytes

    import verl_mopd.data.readers as readers

    shots = [png_bytes((27, 60), (i, 5, 5)) for i in range(3)]
    good = {"episode_id": 11, "goal": "g", "screenshots": shots, "screenshot_widths": [27] * 3,
            "screenshot_heights": [60] * 3, "actions": ['{"action_type": "wait"}', '{"action_type": "navigate_back"}'],
            "step_instructions": ["wait", "back"]}  # fmt: skip
    bad = {**good, "episode_id": 12, "screenshot_heights": [60, 60]}
    monkeypatch.setattr(readers, "iter_android_control_tfrecords", lambda pattern: iter([good, bad]))
    drops: list = []
    (t,) = readers.read_android_control(str(tmp_path / "ac-*.tfrecord"), str(tmp_path / "shots"), drops)
    assert t.origin.endswith("ac-*.tfrecord#1") and [s.screenshot for s in t.steps] == [
        str(tmp_path / "shots" / f"11_{i}.png") for i in range(3)]  # fmt: skip
    assert (tmp_path / "shots" / "11_2.png").read_bytes() == shots[2] and not list(tmp_path.rglob("*.tmp"))
    assert [(d.id, d.where.rsplit("#", 1)[1], d.num_steps) for d in drops] == [("android_control-12", "2", 3)]
    kept, rule_drops = clean([t], CleanConfig(missing_verdict="keep"))
    assert kept == [t] and not rule_drops
