"""OSWorld / MobileWorld adapters: exact action translation from recorded observations and responses."""

import math

import pytest
from _eval_fixtures import call, png
from hypothesis import given
from hypothesis import strategies as st

from verl_mopd.eval.agent import grid_to_pixel
from verl_mopd.eval.mobileworld import MobileWorldAgent, to_json_action
from verl_mopd.eval.osworld import OSWorldAgent, to_pyautogui
from verl_mopd.rewards import normalize_action, to_grid

DESK = (1920, 1080)
PHONE = (1080, 2400)


def test_grid_to_pixel_table():
    assert grid_to_pixel(500, 500, *DESK) == (960, 540)
    assert grid_to_pixel(0, 0, *DESK) == (0, 0)
    assert grid_to_pixel(1000, 1000, *DESK) == (1919, 1079)  # the grid edge is the last pixel
    assert grid_to_pixel(333, 667, *DESK) == (639, 720)  # 639.36, 720.36
    assert grid_to_pixel(250, 125, 10, 4) == (3, 1)  # 2.5 rounds half up; 0.5 rounds half up
    with pytest.raises(ValueError, match="outside 0-1000"):
        grid_to_pixel(1000.5, 0, *DESK)
    with pytest.raises(ValueError, match="positive ints"):
        grid_to_pixel(1, 1, 0, 10)


@given(st.integers(1, 4000), st.integers(1, 4000), st.data())
def test_grid_to_pixel_is_on_screen_and_inverts_to_grid(w, h, data):
    px, py = data.draw(st.integers(0, w - 1)), data.draw(st.integers(0, h - 1))
    gx, gy = to_grid(px, py, w, h, integer=False)
    x, y = grid_to_pixel(gx, gy, w, h)
    assert 0 <= x < w and 0 <= y < h
    assert abs(x - px) <= 0.5 + 1e-9 * w and abs(y - py) <= 0.5 + 1e-9 * h
    gi = to_grid(px, py, w, h)  # integer grid (what the model emits): within half a grid cell
    xi, yi = grid_to_pixel(*gi, w, h)
    assert abs(xi - px) <= math.ceil(w / 2000) + 1 and abs(yi - py) <= math.ceil(h / 2000) + 1


D = lambda **a: normalize_action("desktop", a)  # noqa: E731
M = lambda **a: normalize_action("mobile", a)  # noqa: E731

OSWORLD_CASES = [
    (D(action="left_click", coordinate=[500, 500]), ["pyautogui.click(960, 540)"]),
    (D(action="left_click"), ["pyautogui.click()"]),
    (D(action="right_click", coordinate=[100, 900]), ["pyautogui.rightClick(192, 972)"]),
    (D(action="middle_click", coordinate=[10, 10]), ["pyautogui.middleClick(19, 11)"]),
    (D(action="double_click", coordinate=[333, 667]), ["pyautogui.doubleClick(639, 720)"]),
    (D(action="triple_click", coordinate=[1000, 0]), ["pyautogui.tripleClick(1919, 0)"]),
    (D(action="mouse_move", coordinate=[250, 750]), ["pyautogui.moveTo(480, 810)"]),
    (D(action="left_click_drag", coordinate=[750, 250]), ["pyautogui.dragTo(1440, 270, duration=0.5, button='left')"]),
    (D(action="left_click_drag", coordinate=[100, 100], coordinate2=[900, 100]),
     ["pyautogui.moveTo(192, 108); pyautogui.dragTo(1728, 108, duration=0.5, button='left')"]),
    (D(action="scroll", pixels=-5), ["pyautogui.scroll(-5)"]),
    (D(action="scroll", pixels=3, coordinate=[500, 500]), ["pyautogui.scroll(3, x=960, y=540)"]),
    (D(action="hscroll", pixels=2.4), ["pyautogui.hscroll(2)"]),
    (D(action="key", keys=["Control", "c"]), ["pyautogui.hotkey('ctrl', 'c')"]),
    (D(action="key", keys=["Return"]), ["pyautogui.press('enter')"]),
    (D(action="key", keys=["cmd", "space"]), ["pyautogui.hotkey('win', 'space')"]),
    (D(action="type", text="it's \"ok\"\nnext"),
     ["pyautogui.write('it\\'s \"ok\"'); pyautogui.press('enter'); pyautogui.write('next')"]),
    (D(action="type", text="a<b"), ["pyautogui.write('a'); pyautogui.hotkey('shift', ','); pyautogui.write('b')"]),
    (D(action="type", text="東京\n"),
     ["import pyperclip; pyperclip.copy('東京'); pyautogui.hotkey('ctrl', 'v'); pyautogui.press('enter')"]),
    (D(action="key", keys=["ctrl", "minus"]), ["pyautogui.hotkey('ctrl', '-')"]),
    (D(action="key", keys=["Control_L", "less"]), ["pyautogui.hotkey('ctrl', 'shift', ',')"]),
    (D(action="key", keys=["Menu"]), ["pyautogui.press('apps')"]),
    (D(action="key", keys=["KP_Add"]), ["pyautogui.press('add')"]),
    (D(action="wait", time=2), ["WAIT"]),
    (D(action="terminate", status="success"), ["DONE"]),
    (D(action="terminate", status="failure"), ["FAIL"]),
    (D(action="answer", text="42"), ["DONE"]),
]


@pytest.mark.parametrize("action,expected", OSWORLD_CASES, ids=[c[0].action for c in OSWORLD_CASES])
def test_osworld_translation_table(action, expected):
    assert to_pyautogui(action, *DESK) == expected


def test_osworld_typed_text_is_python_that_compiles():
    for text in ("a'b\"c\\d\n\té", "{0} %d {name} $HOME", "'\"'", "\\", "x\\"):
        compile(to_pyautogui(D(action="type", text=text), *DESK)[0], "<vm>", "exec")


MOBILE_CASES = [
    (M(action="click", coordinate=[500, 500]), {"action_type": "click", "x": 540, "y": 1200}),
    (M(action="long_press", coordinate=[100, 50], time=2), {"action_type": "long_press", "x": 108, "y": 120}),
    (M(action="swipe", coordinate=[500, 800], coordinate2=[500, 200]),
     {"action_type": "drag", "start_x": 540, "start_y": 1920, "end_x": 540, "end_y": 480}),
    (M(action="type", text="hello"), {"action_type": "input_text", "text": "hello"}),
    (M(action="system_button", button="back"), {"action_type": "navigate_back"}),
    (M(action="system_button", button="Home"), {"action_type": "navigate_home"}),
    (M(action="system_button", button="Enter"), {"action_type": "keyboard_enter"}),
    (M(action="key", text="KEYCODE_BACK"), {"action_type": "navigate_back"}),
    (M(action="open", text="Settings"), {"action_type": "open_app", "app_name": "Settings"}),
    (M(action="wait", time=1), {"action_type": "wait"}),
    (M(action="terminate", status="success"), {"action_type": "finished", "text": "success"}),
    (M(action="terminate", status="failed"), {"action_type": "finished", "text": "failure"}),
    (M(action="answer", text="7 pm"), {"action_type": "answer", "text": "7 pm"}),
    (M(action="ask_user", text="Which account?"), {"action_type": "ask_user", "text": "Which account?"}),
]


@pytest.mark.parametrize("action,expected", MOBILE_CASES, ids=[c[0].action for c in MOBILE_CASES])
def test_mobileworld_translation_table(action, expected):
    assert to_json_action(action, *PHONE) == expected


def test_mobileworld_refuses_what_it_cannot_execute():
    from verl_mopd.eval.agent import Unsupported

    with pytest.raises(Unsupported, match="system_button 'Menu' has no MobileWorld action"):
        to_json_action(M(action="system_button", button="Menu"), *PHONE)
    with pytest.raises(Unsupported, match="key 'volume_up' has no MobileWorld action"):
        to_json_action(M(action="key", text="volume_up"), *PHONE)


def test_translators_refuse_the_other_platform():
    with pytest.raises(ValueError, match="desktop"):
        to_pyautogui(M(action="click", coordinate=[1, 1]), *DESK)
    with pytest.raises(ValueError, match="mobile"):
        to_json_action(D(action="left_click", coordinate=[1, 1]), *PHONE)


class _Recorded:
    """Replays recorded model responses and keeps the messages it was sent."""

    def __init__(self, responses):
        self.responses, self.sent = list(responses), []

    def __call__(self, messages):
        self.sent.append(messages)
        return self.responses[len(self.sent) - 1]


def test_osworld_agent_on_recorded_observations():
    shot = png(*DESK)
    model = _Recorded([
        call("computer_use", action="left_click", coordinate=[500, 500]),
        "garbage",
        call("computer_use", action="key", keys=["ctrl", "s"]),
        call("computer_use", action="terminate", status="success"),
    ])
    agent = OSWorldAgent(model)
    agent.reset(None)
    outs = [agent.predict("Save the file", {"screenshot": shot, "accessibility_tree": None}) for _ in range(4)]
    assert [a for _, a in outs] == [["pyautogui.click(960, 540)"], [], ["pyautogui.hotkey('ctrl', 's')"], ["DONE"]]
    assert outs[0][0] == model.responses[0]
    system, user = model.sent[2]
    assert system["role"] == "system" and '"name": "computer_use"' in system["content"]
    text = user["content"][0]["text"]
    assert "Save the file" in text and 'Step 1: {"action": "left_click", "coordinate": [500, 500]}' in text
    assert "Step 2: (invalid output)" in text and user["content"][1] == {"type": "image", "image": shot}
    agent.reset()
    assert agent.steps == 0 and agent.prompter.history == []


def test_osworld_agent_step_budget_and_invalid_policy():
    agent = OSWorldAgent(_Recorded(["nope"] * 3), max_steps=2, on_invalid="wait")
    shot = png(100, 50)
    assert agent.predict("x", {"screenshot": shot})[1] == ["WAIT"]
    assert agent.predict("x", {"screenshot": shot})[1] == ["WAIT"]
    assert agent.predict("x", {"screenshot": shot})[1] == []  # budget spent: no action, never FAIL
    assert len(agent.complete.sent) == 2  # the model is not called past the budget
    with pytest.raises(ValueError, match="on_invalid"):
        OSWorldAgent(lambda m: "", on_invalid="fail")
    assert OSWorldAgent(lambda m: "").max_steps == 30


def test_mobileworld_agent_on_recorded_observations():
    from PIL import Image

    screen = Image.new("RGB", PHONE)  # MobileWorld passes a PIL image
    model = _Recorded([
        call("mobile_use", action="open", text="Clock"),
        call("mobile_use", action="ask_user", text="What time?"),
        call("mobile_use", action="swipe", coordinate=[500, 900], coordinate2=[500, 100]),
        "<think>unfinished",
    ])
    model.responses.append("still no call")
    agent = MobileWorldAgent(model, action_factory=dict)
    assert agent.initialize("Set an alarm")
    obs = {"screenshot": screen, "tool_call": None, "ask_user_response": None}
    assert agent.predict(obs)[1] == {"action_type": "open_app", "app_name": "Clock"}
    assert agent.predict(obs)[1] == {"action_type": "ask_user", "text": "What time?"}
    assert agent.predict({**obs, "ask_user_response": "7 am"})[1] == {
        "action_type": "drag", "start_x": 540, "start_y": 2160, "end_x": 540, "end_y": 240}
    assert "the user answered: 7 am" in model.sent[2][1]["content"][0]["text"]
    assert agent.predict(obs)[1] == {"action_type": "wait"}  # unparseable, re-asked once, still: wait
    assert len(model.sent) == 5 and agent.get_total_token_usage() == {}
    agent.done()
    with pytest.raises(RuntimeError, match="initialize"):
        agent.predict(obs)


def test_mobileworld_agent_step_budget_defaults_to_30():
    agent = MobileWorldAgent(_Recorded([call("mobile_use", action="wait")] * 31), action_factory=dict)
    agent.initialize("t")
    obs = {"screenshot": png(10, 20)}
    acts = [agent.predict(obs)[1] for _ in range(31)]
    assert acts[:30] == [{"action_type": "wait"}] * 30
    assert acts[30] == {"action_type": "finished", "text": "failure"} and len(agent.complete.sent) == 30


def test_online_step_prompt_is_the_training_prompt_of_verl_mopd_prepare():
    """The adapters' user turn equals data/convert.py's for the same instruction and history."""
    convert = pytest.importorskip("verl_mopd.data.convert")
    from verl_mopd.data.schema import Step, Trajectory
    from verl_mopd.eval.agent import StepPrompter
    from verl_mopd.rewards import system_prompt

    acts = [{"action": "click", "coordinate": [100, 200]}, {"action": "type", "text": "héllo"}, {"action": "wait"}]
    t = Trajectory("t1", "mobile", "Open the clock", tuple(Step(i, f"{i}.png", a) for i, a in enumerate(acts)),
                   coords="grid")
    prompter = StepPrompter("mobile")
    for upto in range(len(acts)):
        msgs = prompter.messages(t.instruction, b"img")
        expected = convert.user_content(t, upto, convert.ConvertConfig())
        before, after = expected.split("<image>")
        assert msgs[0] == {"role": "system", "content": system_prompt("mobile")}
        assert msgs[1]["content"] == [{"type": "text", "text": before}, {"type": "image", "image": b"img"}]
        assert after == ""
        prompter.record(normalize_action("mobile", acts[upto]))
