"""AgentNet (PyAutoGUI) and AndroidControl readers: mapping tables, and unmappable actions reach the report."""

from __future__ import annotations

import io
import json
import os

import pytest
from _data_helpers import png, write_lines
from hypothesis import given, settings
from hypothesis import strategies as st
from PIL import Image

from verl_mopd.data.clean import CleanConfig, clean
from verl_mopd.data.readers import (
    agentnet_to_trajectory,
    android_control_action,
    android_control_to_trajectory,
    pyautogui_to_action,
    read_agentnet,
)
from verl_mopd.data.schema import SchemaError, step_action

PYAUTOGUI = [
    ("pyautogui.click(x=0.018, y=0.508)", {"action": "left_click", "coordinate": [0.018, 0.508]}),
    ("pyautogui.click(0.5, 0.25, button='right')", {"action": "right_click", "coordinate": [0.5, 0.25]}),
    ("pyautogui.click(x=0.1, y=0.2, clicks=2)", {"action": "double_click", "coordinate": [0.1, 0.2]}),
    ("pyautogui.rightClick(x=0.9553, y=0.5117)", {"action": "right_click", "coordinate": [0.9553, 0.5117]}),
    ("pyautogui.tripleClick(x=0.3, y=0.3)", {"action": "triple_click", "coordinate": [0.3, 0.3]}),
    ("pyautogui.moveTo(x=0.4, y=0.6)", {"action": "mouse_move", "coordinate": [0.4, 0.6]}),
    (
        "pyautogui.moveTo(x=0.4546, y=0.2682)\npyautogui.dragTo(x=0.4107, y=0.2773, button='left')",
        {"action": "left_click_drag", "coordinate": [0.4546, 0.2682], "coordinate2": [0.4107, 0.2773]},
    ),
    ("pyautogui.moveTo(x=0.396, y=0.7839)\npyautogui.scroll(-3)", {"action": "scroll", "pixels": -3, "coordinate": [0.396, 0.7839]}),
    ("pyautogui.hscroll(5)", {"action": "hscroll", "pixels": 5}),
    ("pyautogui.write(message='cd ~/Desktop')", {"action": "type", "text": "cd ~/Desktop"}),
    ("pyautogui.typewrite('hi')", {"action": "type", "text": "hi"}),
    ("pyautogui.press('enter')", {"action": "key", "keys": ["enter"]}),
    ("pyautogui.hotkey('ctrl', 'u')", {"action": "key", "keys": ["ctrl", "u"]}),
    ("pyautogui.hotkey(['ctrl', 'shift', 't'])", {"action": "key", "keys": ["ctrl", "shift", "t"]}),
    # the keyword forms OpenCUA's PyAutoGUIAction.to_command writes
    ("pyautogui.hotkey(keys=['ctrl', 'c'])", {"action": "key", "keys": ["ctrl", "c"]}),
    ("pyautogui.press(keys=['enter'])", {"action": "key", "keys": ["enter"]}),
    ("pyautogui.press(keys='esc')", {"action": "key", "keys": ["esc"]}),
    ("pyautogui.press('down', presses=1)", {"action": "key", "keys": ["down"]}),
    ("pyautogui.write(message='SPOTIFY')\npyautogui.press(keys=['enter'])", {"action": "type", "text": "SPOTIFY\n"}),
    ("pyautogui.write('a')\npyautogui.press('enter', presses=2)", {"action": "type", "text": "a\n\n"}),
    ("pyautogui.typewrite(message='x')\npyautogui.press('tab')", {"action": "type", "text": "x\t"}),
    ("pyautogui.typewrite(['h', 'i', 'enter'])", {"action": "type", "text": "hi\n"}),
    ("pyautogui.typewrite(['f5'])", {"action": "key", "keys": ["f5"]}),
    ("computer.tripleClick(x=0.2, y=0.3)", {"action": "triple_click", "coordinate": [0.2, 0.3]}),
    ("pyautogui.dragTo(0.5, 0.5, button='left')", {"action": "left_click_drag", "coordinate": [0.5, 0.5]}),
    ("computer.terminate(status='success')", {"action": "terminate", "status": "success"}),
    ("computer.wait()", {"action": "wait"}),
    ("time.sleep(2)", {"action": "wait", "time": 2}),
]


@pytest.mark.parametrize("code,expected", PYAUTOGUI, ids=[c[:40] for c, _ in PYAUTOGUI])
def test_pyautogui_mapping(code, expected):
    assert pyautogui_to_action(code) == expected


@pytest.mark.parametrize(
    "code,name",
    [
        ("pyautogui.mouseDown(x=0.1, y=0.1)", "pyautogui.mouseDown"),
        ("pyautogui.click(x=0.1, y=0.1)\npyautogui.write('a')", "<2 calls: pyautogui.click + pyautogui.write>"),
        ("pyautogui.click(x=foo, y=1)", "<non-literal arguments>"),
        ("import os", "<not a call>"),
        ("pyautogui.click(", "<syntax error>"),
        # a sequence of presses is not one chord: not one student action
        ("pyautogui.press(keys=['down'], presses=3)", "pyautogui.press(presses=3)"),
        ("pyautogui.press('down', 3)", "pyautogui.press(presses=3)"),
        ("pyautogui.press(['a', 'b'])", "pyautogui.press(2 keys in sequence)"),
        ("pyautogui.typewrite(['a', 'f5'])", "pyautogui.typewrite(a key sequence)"),
        ("pyautogui.write('a')\npyautogui.press('f5')", "<2 calls: pyautogui.write + pyautogui.press>"),
        ("pyautogui.dragTo(0.5, 0.5, button='right')", "pyautogui.dragTo(button='right')"),
        # pathological code: a counted drop, never an exception
        ("pyautogui.click({[]: 1})", "<non-literal arguments>"),
        ("pyautogui.click(" + "-" * 3000 + "1, 2)", "<syntax error>"),
        ("pyautogui.click(" + "(" * 250 + "1" + ")" * 250 + ", 2)", "<syntax error>"),
        ("pyautogui.click([[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[1]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]"
         "]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]])", "left_click"),
        ("pyautogui.click(x=1, clicks=[2])", "left_click"),
        ("pyautogui.press(keys=[1], presses=[1])", "pyautogui.press(presses=[1])"),
        ("pyautogui.click(x=0.1, y=0.1)\x00", "<syntax error>"),
        ("pyautogui.click(x=" + "9" * 5000 + ")", "<syntax error>"),  # past Python's int digit limit
        ("x" * 20_000, "<code too long>"),
        ("import os; os.system('id')", "<not a call>"),
    ],
    ids=lambda v: v[:40],
)
def test_pyautogui_unmappable_keeps_a_name(code, name):
    assert pyautogui_to_action(code)["action"] == name


def _agentnet_record(codes):
    return {
        "task_id": "an-1",
        "instruction": "Open display settings",
        "task_completed": True,
        "traj": [
            {"index": i, "image": f"{i}.png", "value": {"code": c, "thought": f"t{i}", "action": f"a{i}", "observation": "o"}}
            for i, c in enumerate(codes)
        ],
    }


def test_agentnet_reader_and_action_space_rule(tmp_path):
    img = tmp_path / "images"
    for i in range(3):
        png(str(img / f"{i}.png"))
    good = _agentnet_record(["pyautogui.click(x=0.25, y=0.5)", "pyautogui.scroll(-3)", "computer.terminate(status='success')"])
    bad = {**_agentnet_record(["pyautogui.click(x=0.25, y=0.5)", "pyautogui.mouseDown()", "computer.wait()"]), "task_id": "an-2"}
    path = tmp_path / "agentnet.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in (good, bad)) + "\n")
    trajs = list(read_agentnet(str(path)))
    assert [t.id for t in trajs] == ["an-1", "an-2"] and trajs[0].coords == "unit"
    t = trajs[0]
    assert t.steps[0].screenshot == str(img / "0.png") and t.steps[0].thought == "t0" and t.steps[0].description == "a0"
    assert step_action(t, t.steps[0]).coordinate == (250.0, 500.0)
    kept, drops = clean(trajs, CleanConfig(rules=("structure", "screenshots", "action_space")))
    assert [k.id for k in kept] == ["an-1"]
    assert drops[0].rule == "action_space" and "pyautogui.mouseDown" in drops[0].detail
    with pytest.raises(SchemaError, match=r"traj\[0\]\.value\.code"):
        agentnet_to_trajectory({"task_id": "x", "instruction": "i", "traj": [{"index": 0, "image": "a.png", "value": {}}]}, "")


def _png_bytes(size):
    buf = io.BytesIO()
    Image.new("RGB", size, (1, 2, 3)).save(buf, format="PNG")
    return buf.getvalue()


def test_android_control_episode(tmp_path):
    w, h = 108, 240
    rec = {
        "episode_id": 7,
        "goal": "Turn on wifi",
        "screenshots": [_png_bytes((w, h)) for _ in range(6)],
        "screenshot_widths": [w] * 6,
        "screenshot_heights": [h] * 6,
        "actions": [
            json.dumps({"action_type": "open_app", "app_name": "Settings"}),
            json.dumps({"action_type": "scroll", "direction": "down"}),
            json.dumps({"action_type": "click", "x": 54, "y": 120}),
            json.dumps({"action_type": "input_text", "text": "wifi"}),
            json.dumps({"action_type": "navigate_back"}),
        ],
        "step_instructions": ["open settings", "scroll", "tap wifi", "type", "back"],
    }
    t = android_control_to_trajectory(rec, str(tmp_path / "ac"))
    assert t.id == "android_control-7" and t.platform == "mobile" and t.num_steps == 6
    assert all(os.path.isfile(s.screenshot) for s in t.steps)
    acts = [step_action(t, s).to_arguments() for s in t.steps]
    assert acts[0] == {"action": "open", "text": "Settings"}
    # content scrolls down into view = finger swipes up
    assert acts[1] == {"action": "swipe", "coordinate": [500, 750], "coordinate2": [500, 250]}
    assert acts[2] == {"action": "click", "coordinate": [500, 500]}
    assert acts[3] == {"action": "type", "text": "wifi"}
    assert acts[4] == {"action": "system_button", "button": "Back"}
    assert acts[5] == {"action": "terminate", "status": "success"}
    assert t.steps[2].description == "tap wifi"
    kept, drops = clean([t], CleanConfig(rules=("structure", "screenshots", "action_space")))
    assert kept == [t] and not drops
    finger = android_control_action({"action_type": "scroll", "direction": "down"}, w, h, scroll_is_finger=True)
    assert finger["coordinate"][1] < finger["coordinate2"][1]
    assert android_control_action({"action_type": "double_tap"}, w, h) == {"action": "double_tap"}
    with pytest.raises(SchemaError, match="one action fewer"):
        android_control_to_trajectory({**rec, "actions": rec["actions"][:2]}, str(tmp_path))


# --------------------------------------------------------------------------- pyautogui: never raises

_LITERAL = st.recursive(
    st.none() | st.booleans() | st.integers(-(10**6), 10**6) | st.floats(allow_nan=True, allow_infinity=True)
    | st.text(max_size=6),
    lambda kids: st.lists(kids, max_size=3) | st.tuples(kids, kids) | st.dictionaries(st.text(max_size=3), kids, max_size=2)
    | st.frozensets(st.integers(0, 3), max_size=2),
    max_leaves=6,
)  # fmt: skip
_NAMES = ["pyautogui.click", "pyautogui.rightClick", "pyautogui.doubleClick", "pyautogui.tripleClick",
          "computer.tripleClick", "pyautogui.moveTo", "pyautogui.dragTo", "pyautogui.scroll", "pyautogui.hscroll",
          "pyautogui.write", "pyautogui.typewrite", "pyautogui.press", "pyautogui.hotkey", "computer.terminate",
          "computer.wait", "time.sleep", "pyautogui.mouseDown", "os.system"]  # fmt: skip
_KW = ["x", "y", "keys", "presses", "message", "button", "clicks", "status", "seconds"]


@st.composite
def _code(draw):
    calls = []
    for _ in range(draw(st.integers(1, 3))):
        args = [repr(v) for v in draw(st.lists(_LITERAL, max_size=3))]
        args += [f"{k}={v!r}" for k, v in draw(st.dictionaries(st.sampled_from(_KW), _LITERAL, max_size=3)).items()]
        calls.append(f"{draw(st.sampled_from(_NAMES))}({', '.join(args)})")
    return "\n".join(calls)


@settings(max_examples=300, deadline=None)
@given(st.one_of(_code(), st.text(max_size=60)))
def test_pyautogui_never_raises_and_the_rule_reports_it(code):
    from verl_mopd.data.clean import check_action_space
    from verl_mopd.data.schema import Step, Trajectory

    action = pyautogui_to_action(code)
    assert isinstance(action, dict) and isinstance(action["action"], str)
    t = Trajectory("t", "desktop", "q", (Step(0, "/x.png", action),), coords="unit")
    problem = check_action_space(t, None)  # a Problem or None, never an exception
    assert problem is None or (problem.kind and "step 0" in problem.detail)


# --------------------------------------------------------------------------- AgentNet as released

def _an_step(i: int, image: str, code: str) -> dict:
    """A step in AgentNet's full published layout."""
    return {"index": i, "image": image, "value": {
        "observation": f"obs {i}", "thought": f"I should do step {i}.", "action": f"Do step {i}.", "code": code,
        "reflection": "The last action worked.", "last_step_correct": True, "last_step_redundant": False}}  # fmt: skip


def _an_record(task_id: str, completed, codes: list[str], folder, rng) -> dict:
    steps = []
    for i, code in enumerate(codes):
        name = f"{rng.getrandbits(128):032x}.png"  # AgentNet names frames by UUID
        png(str(folder / name), (64, 36), (rng.randrange(256), rng.randrange(256), i))
        steps.append(_an_step(i, name, code))
    return {"task_id": task_id, "instruction": f"Task {task_id}", "task_completed": completed, "alignment_score": 8,
            "efficiency_score": 7, "task_difficulty": 3, "reason": "why", "natural_language_task": "nl",
            "actual_task": "actual", "domain": "Chrome", "traj": steps}  # fmt: skip


END = "computer.terminate(status='success')"


@pytest.fixture()
def agentnet_release(tmp_path):
    """The released layout: two JSONL files, each with its image folder beside it."""
    import random

    rng = random.Random(0)
    ub, wm = tmp_path / "ubuntu_images", tmp_path / "win_mac_images"
    ub.mkdir()
    wm.mkdir()
    ubuntu = [
        _an_record("u-true", True, ["pyautogui.hotkey(keys=['ctrl', 'c'])",
                                    "pyautogui.write(message='SPOTIFY')\npyautogui.press(keys=['enter'])",
                                    "computer.tripleClick(x=0.25, y=0.75)", END], ub, rng),
        _an_record("u-false", False, ["pyautogui.click(x=0.1, y=0.2)", END], ub, rng),
        _an_record("u-null", None, ["pyautogui.press(keys=['down'], presses=1)", END], ub, rng),
        _an_record("u-presses3", True, ["pyautogui.press(keys=['down'], presses=3)", END], ub, rng),
        _an_record("u-evil", True, ["pyautogui.click({[]: 1})", END], ub, rng),
        _an_record("u-deep", True, ["pyautogui.click(" + "-" * 3000 + "1, 2)", END], ub, rng),
    ]
    ubuntu.append({**ubuntu[0], "instruction": "the same task_id again"})
    win_mac = [
        _an_record("w-scroll", True, ["pyautogui.moveTo(x=0.396, y=0.7839)\npyautogui.scroll(-3)",
                                      "pyautogui.moveTo(x=0.45, y=0.27)\npyautogui.dragTo(x=0.41, y=0.28, button='left')",
                                      END], wm, rng),
    ]  # fmt: skip
    u = write_lines(str(tmp_path / "agentnet_ubuntu_5k.jsonl"), ubuntu)
    w = write_lines(str(tmp_path / "agentnet_win_mac_18k.jsonl"), win_mac)
    return tmp_path, u, w


def test_agentnet_release_layout_with_defaults(agentnet_release):
    import pandas as pd

    from commands import prepare as prepare_main

    root, u, w = agentnet_release
    out = root / "out"
    assert prepare_main(["--agentnet", u, "--agentnet", w, "--out", str(out), "--val-fraction", "0", "--no-progress"]) == 0
    dropped = {(d["id"], d["rule"], d["kind"]) for d in map(json.loads, open(out / "dropped.jsonl"))}
    assert dropped == {
        ("u-false", "subtasks", "not_completed"),  # task_completed=false honoured
        ("u-null", "subtasks", "no_verdict"),  # no verdict: dropped by default, counted
        ("u-presses3", "action_space", "unknown_action"),
        ("u-evil", "action_space", "unknown_action"),
        ("u-deep", "action_space", "unknown_action"),
        ("u-true", "parse", "duplicate_id"),
    }
    df = pd.read_parquet(out / "rl" / "train.parquet")
    truth = {(r["id"], r["index"]): json.loads(g)["action"]
             for r, g in zip(df["extra_info"], (m["ground_truth"] for m in df["reward_model"]))}  # fmt: skip
    assert truth[("u-true", 0)] == {"action": "key", "keys": ["ctrl", "c"]}
    assert truth[("u-true", 1)] == {"action": "type", "text": "SPOTIFY\n"}
    assert truth[("u-true", 2)] == {"action": "triple_click", "coordinate": [250, 750]}
    assert truth[("w-scroll", 0)] == {"action": "scroll", "pixels": -3, "coordinate": [396, 784]}
    assert truth[("w-scroll", 1)] == {"action": "left_click_drag", "coordinate": [450, 270], "coordinate2": [410, 280]}
    cleaned = {t["id"]: t for t in map(json.loads, open(out / "cleaned.jsonl"))}
    assert cleaned["u-true"]["judge"]["model"] == "agentnet:task_completed" and cleaned["u-true"]["meta"]["domain"] == "Chrome"
    assert cleaned["u-true"]["steps"][0]["screenshot"].startswith(str(root / "ubuntu_images"))
    assert cleaned["w-scroll"]["steps"][0]["screenshot"].startswith(str(root / "win_mac_images"))

    keep = root / "keep"
    assert prepare_main(["--agentnet", u, "--out", str(keep), "--missing-verdict", "keep", "--no-progress"]) == 0
    assert "u-null" in {t["id"] for t in map(json.loads, open(keep / "cleaned.jsonl"))}


def test_agentnet_image_folders_per_file_and_clear_errors(agentnet_release, capsys):
    from commands import prepare as prepare_main

    root, u, w = agentnet_release
    moved = root / "elsewhere"
    (root / "ubuntu_images").rename(moved)
    assert prepare_main(["--agentnet", u, "--agentnet", w, "--out", str(root / "o1"), "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert "ubuntu_images" in err and "--agentnet-images" in err
    args = ["--agentnet", u, "--agentnet", w, "--agentnet-images", str(moved), "--agentnet-images", str(root / "win_mac_images")]
    assert prepare_main([*args, "--out", str(root / "o2"), "--no-progress"]) == 0
    kept = {t["id"] for t in map(json.loads, open(root / "o2" / "cleaned.jsonl"))}
    assert kept == {"u-true", "w-scroll"}
    assert prepare_main([*args, "--agentnet-images", str(moved), "--out", str(root / "o3"), "--no-progress"]) == 2
    assert "given 3 times for 2 --agentnet files" in capsys.readouterr().err
