"""X11/xdotool key names are the same keys as their canonical names, for the reward and for OSWorld."""

import pytest

from verl_mopd.rewards import compute_score, normalize_action
from verl_mopd.rewards.actions import normalize_key


@pytest.mark.parametrize("name,canonical", [
    ("minus", "-"), ("plus", "+"), ("equal", "="), ("comma", ","), ("period", "."), ("slash", "/"),
    ("backslash", "\\"), ("semicolon", ";"), ("apostrophe", "'"), ("grave", "`"), ("less", "<"),
    ("Control_L", "ctrl"), ("Shift_R", "shift"), ("Alt_L", "alt"), ("Super_L", "super"), ("apps", "menu"),
    ("Menu", "menu"), ("Num_Lock", "numlock"), ("Scroll_Lock", "scrolllock"), ("Print_Screen", "print"),
    ("KP_Add", "kp_add"), ("add", "kp_add"), ("num7", "kp_7"), ("KP_7", "kp_7"), ("Return", "enter"),
])
def test_normalize_key(name, canonical):
    assert normalize_key(name) == canonical


def test_the_reward_compares_keys_as_the_keyboard_sees_them():
    truth = '{"platform": "desktop", "action": {"action": "key", "keys": ["ctrl", "-"]}}'
    reply = '</think><tool_call>{"name": "computer_use", "arguments": {"action": "key", "keys": ["Control_L", "minus"]}}</tool_call>'
    assert compute_score("gui", reply, truth)["score"] == 1.0
    assert normalize_action("desktop", {"action": "key", "keys": "ctrl+plus"}).keys == ("ctrl", "+")
