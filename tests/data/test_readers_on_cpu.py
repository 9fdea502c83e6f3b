"""AgentNet (PyAutoGUI) and AndroidControl readers: mapping tables, and unmappable actions reach the report."""

from __future__ import annotations

import io
import json
import os

import pytest
from _data_helpers import png
from PIL import Image

from verl_mopd.data.readers import (
    agentnet_to_trajectory,
    android_control_action,
    android_control_to_trajectory,
    pyautogui_to_action,
    read_agentnet,
)
from verl_mopd.data.trajectories import CleanConfig, SchemaError, clean, step_action

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
    ("computer.terminate(status='success')", {"action": "terminate", "status": "success"}),
    ("computer.wait()", {"action": "wait"}),
    ("time.sleep(2)", {"action": "wait", "time": 2}),
]


@pytest.mark.parametrize("code,expected", PYAUTOGUI)
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
    ],
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
