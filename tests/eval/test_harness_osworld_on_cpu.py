"""OSWorldAgent inside OSWorld's own loop, its action rewrite, and the real pyautogui on OSWorld's keyboard.

Every desktop action goes: our agent -> pinned ``run_single_example`` -> pinned ``DesktopEnv.step``
(its ``<`` rewrite, upstream's and OSWorld-JP's) -> the VM's ``python -c`` prefix -> the installed
pyautogui 0.9.54 -> a recorded X11 display with the VM's US keymap (tests/eval/harness). The
assertions are on what the focused app and the pointer receive.
"""

import importlib.util
import string
import sys
from pathlib import Path

import pytest
from _eval_fixtures import call, png
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

if importlib.util.find_spec("pyautogui") is None:  # importing it needs a display; the harness supplies one
    pytest.skip("pyautogui 0.9.54 comes with the test extra: pip install -e .[test]", allow_module_level=True)
sys.path.insert(0, str(Path(__file__).with_name("harness")))
import fake_x11  # noqa: E402
import osworld_pinned as osw  # noqa: E402

from verl_mopd.eval.agent import Unsupported  # noqa: E402
from verl_mopd.eval.osworld import PYAUTOGUI_X11_KEYS, OSWorldAgent, to_pyautogui  # noqa: E402
from verl_mopd.rewards import normalize_action  # noqa: E402

D = lambda **a: normalize_action("desktop", a)  # noqa: E731
W, H = 1920, 1080


def vm(commands, rewrite=osw.rewrite_upstream):
    """Run OSWorld actions on a fresh screen through DesktopEnv.step; what the app received."""
    fake_x11.load_pyautogui(W, H)
    fake_x11.new_display(W, H)
    app = fake_x11.FocusedApp()
    env = osw.DesktopEnv(lambda cmd: fake_x11.run_vm_command(cmd, app), rewrite=rewrite)
    for c in commands:
        env.step(c)
    return app, env


def test_the_harness_reproduces_the_pyautogui_bugs_it_guards_against():
    app, _ = vm(["pyautogui.write('a<b')", "pyautogui.hotkey('ctrl', 'minus')", "pyautogui.write('naïve')"])
    # '<' arrives as '>', 'minus' and 'ï' are skipped: ctrl is pressed alone
    assert app.text == "a>bnave" and app.chords == [("ctrl",)]
    app, _ = vm(["pyautogui.typewrite('a<b')"])  # the form OSWorld's rewrite does fix
    assert app.text == "a<b"


@pytest.mark.parametrize("rewrite", [osw.rewrite_upstream, osw.rewrite_jp], ids=["upstream", "osworld-jp"])
@pytest.mark.parametrize("text", [
    "if a < b and c<d:\n\treturn '<tag attr=\"v\">'",
    "<<<", "x <= y; 1 < 2", "ends with <", "back\\slash < 'quote' \"dq\"",
    "naïve café < 東京\nsecond line", "=SUM(A1:A3)<10", "", "\n\n",
])
def test_type_arrives_exactly(text, rewrite):
    actions = to_pyautogui(D(action="type", text=text), W, H)
    assert len(actions) == 1
    app, _ = vm(actions, rewrite)
    assert app.text == text


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.text(st.characters(codec="utf-8", exclude_categories=("Cs", "Cc")) | st.sampled_from("<\n\t"), max_size=30))
def test_type_arrives_exactly_property(text):
    app, _ = vm(to_pyautogui(D(action="type", text=text), W, H))
    assert app.text == text


KEY_CASES = [
    (["ctrl", "c"], [("ctrl", "c")]),
    (["Control_L", "minus"], [("ctrl", "minus")]),
    (["ctrl", "plus"], [("ctrl", "shift", "equal")]),
    (["ctrl", "shift", "KP_Add"], [("ctrl", "shift", "kp_add")]),
    (["Menu"], [("menu",)]),
    (["super"], [("super",)]),
    (["cmd", "space"], [("super", "space")]),
    (["alt", "Tab"], [("alt", "tab")]),
    (["Return"], []),  # typed: a newline
    (["Page_Down"], [("next",)]),
    (["F11"], [("f11",)]),
    (["Escape"], [("escape",)]),
    (["ctrl", "less"], [("ctrl", "shift", "comma")]),
    (["ISO_Left_Tab"], [("shift", "tab")]),
    (["Num_Lock"], [("num_lock",)]),
    (["Print"], [("print",)]),
    (["ctrl", "alt", "Delete"], [("alt", "ctrl", "delete")]),
]


@pytest.mark.parametrize("keys,chords", KEY_CASES, ids=["+".join(k) for k, _ in KEY_CASES])
def test_keys_reach_the_display(keys, chords):
    app, _ = vm(to_pyautogui(D(action="key", keys=keys), W, H))
    assert app.chords == chords
    if not chords:
        assert app.text == "\n"


@pytest.mark.parametrize("key", ["volumeup", "f13", "é", "fn", "option_r", "XF86AudioPlay", "select"])
def test_keys_without_a_keycode_are_refused_not_skipped(key):
    with pytest.raises(Unsupported, match="no keycode"):
        to_pyautogui(D(action="key", keys=["ctrl", key]), W, H)


def test_x11_key_set_equals_pyautoguis_own_mapping_on_the_vm_keyboard():
    fake_x11.load_pyautogui(W, H)
    x11 = sys.modules.get("pyautogui._pyautogui_x11") or fake_x11._LOADED["x11"]
    valid = {k for k, code in x11.keyboardMapping.items() if code}
    assert valid - {"\\e"} == set(PYAUTOGUI_X11_KEYS)  # pyautogui's '\e' is a backslash and an e, no key name


POINTER_CASES = [
    (D(action="left_click", coordinate=[500, 500]), [("down", 1, 960, 540), ("up", 1, 960, 540)]),
    (D(action="right_click", coordinate=[100, 900]), [("down", 3, 192, 972), ("up", 3, 192, 972)]),
    (D(action="middle_click", coordinate=[10, 10]), [("down", 2, 19, 11), ("up", 2, 19, 11)]),
    (D(action="double_click", coordinate=[333, 667]), [("down", 1, 639, 720), ("up", 1, 639, 720)] * 2),
    (D(action="triple_click", coordinate=[1000, 0]), [("down", 1, 1919, 0), ("up", 1, 1919, 0)] * 3),
    (D(action="left_click"), [("down", 1, 0, 0), ("up", 1, 0, 0)]),
    (D(action="left_click_drag", coordinate=[100, 100], coordinate2=[900, 100]), [("down", 1, 192, 108), ("up", 1, 1728, 108)]),
    (D(action="left_click_drag", coordinate=[750, 250]), [("down", 1, 0, 0), ("up", 1, 1440, 270)]),
    (D(action="scroll", pixels=-3, coordinate=[500, 500]), [("wheel", 5, 960, 540)] * 3),
    (D(action="scroll", pixels=2), [("wheel", 4, 0, 0)] * 2),
    (D(action="hscroll", pixels=-2.4, coordinate=[0, 1000]), [("wheel", 6, 0, 1079)] * 2),
    (D(action="hscroll", pixels=1), [("wheel", 7, 0, 0)]),
]


@pytest.mark.parametrize("action,events", POINTER_CASES, ids=[c[0].action for c in POINTER_CASES])
def test_pointer_actions_reach_the_display(action, events):
    app, _ = vm(to_pyautogui(action, W, H))
    assert app.buttons == events


def test_mouse_move_moves_the_pointer():
    vm(to_pyautogui(D(action="mouse_move", coordinate=[250, 750]), W, H))
    assert fake_x11._LOADED["display"].pointer == [480, 810]


class _Model:
    def __init__(self, responses):
        self.responses, self.calls = list(responses), 0

    def __call__(self, messages):
        self.calls += 1
        return self.responses[min(self.calls, len(self.responses)) - 1]


class _Args:
    sleep_after_execution = 0.0


def episode(responses, max_steps, infeasible=False, metric=lambda: 1.0, **agent_kw):
    model = _Model(responses)
    agent = OSWorldAgent(model, **agent_kw)
    app = fake_x11.FocusedApp()
    fake_x11.load_pyautogui(W, H)
    fake_x11.new_display(W, H)
    env = osw.DesktopEnv(lambda cmd: fake_x11.run_vm_command(cmd, app), infeasible=infeasible, metric=metric)
    scores = []
    steps = osw.run_single_example(agent, env, {"id": "t"}, max_steps, "do it", _Args(), None, scores,
                                   {"screenshot": png(W, H)})
    return scores[0], env, model, steps, app


def test_episode_click_type_terminate():
    s, env, model, steps, app = episode([
        call("computer_use", action="left_click", coordinate=[500, 500]),
        call("computer_use", action="type", text="x<1"),
        call("computer_use", action="terminate", status="success"),
    ], max_steps=15)
    assert (s, steps, model.calls, app.text, env.action_history[-1]) == (1.0, 3, 3, "x<1", "DONE")


@pytest.mark.parametrize("infeasible", [True, False])
def test_step_budget_never_claims_infeasible(infeasible):
    """Past our budget of 30 under the harness's --max_steps 45: no FAIL, the checker decides."""
    s, env, model, steps, _ = episode([call("computer_use", action="wait")], 45, infeasible)
    assert model.calls == 30 and steps == 45 and "FAIL" not in env.action_history
    assert s == (0 if infeasible else 1.0)


def test_terminate_failure_is_the_models_infeasible_claim():
    s, env, *_ = episode([call("computer_use", action="terminate", status="failure")], 15, infeasible=True)
    assert s == 1 and env.action_history == ["FAIL"]


@pytest.mark.parametrize("on_invalid,history,calls", [
    ("skip", ["pyautogui.press('enter')"], 3),
    ("wait", ["WAIT", "pyautogui.press('enter')"], 3),
    ("retry", ["pyautogui.press('enter')"], 3),
])
def test_on_invalid(on_invalid, history, calls):
    responses = ["no call", call("computer_use", action="key", keys=["volumeup"]),
                 call("computer_use", action="key", keys=["Return"])]
    s, env, model, steps, app = episode(responses, 3 if on_invalid != "retry" else 2, on_invalid=on_invalid)
    assert [a for a in env.action_history if a != "WAIT"] == [a for a in history if a != "WAIT"]
    assert env.action_history.count("WAIT") == (2 if on_invalid == "wait" else 0)
    assert model.calls == calls and "FAIL" not in env.action_history
    with pytest.raises(ValueError, match="on_invalid='fail'"):
        OSWorldAgent(model, on_invalid="fail")


def test_refused_key_is_in_the_history_the_model_reads():
    model = _Model([call("computer_use", action="key", keys=["volumeup"]), call("computer_use", action="wait")])
    sent = []
    agent = OSWorldAgent(lambda m: (sent.append(m), model(m))[1], on_invalid="retry")
    agent.reset()
    _, actions = agent.predict("x", {"screenshot": png(10, 10)})
    assert actions == ["WAIT"] and len(sent) == 2
    assert "not executed: key 'volumeup' has no keycode" in sent[1][1]["content"][0]["text"]


def test_every_printable_ascii_character_is_typable():
    text = string.printable[:-2]  # without \x0b, \x0c; "\r" is the Return key, as "\n"
    app, _ = vm(to_pyautogui(D(action="type", text=text), W, H))
    assert app.text == text.replace("\r", "\n")
