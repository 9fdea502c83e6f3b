"""MobileWorld agent: screenshot -> our ``mobile_use`` prompt -> model -> the harness's ``JSONAction``.

Written against MobileWorld's agent interface (Tongyi-MAI/MobileWorld,
``mobile_world/agents/base.py::BaseAgent`` and ``core/runner.py``): the runner calls
``agent.initialize(goal)``, then per step ``prediction, action = agent.predict(observation)``
with ``observation["screenshot"]`` (a PIL image of the device screen), ``"tool_call"`` and
``"ask_user_response"``; it ends the episode on ``finished``/``unknown``/``answer`` actions or at
``max_step``, and sends every other action to the device server, which runs it over adb
(``core/server.py::step``). MobileWorld also runs AndroidWorld's tasks through the same agent
interface (its ``docs/android_world_integration.md``), so one adapter covers both suites.

Translation (:func:`to_json_action`; pixels are of the screenshot, from the 0-1000 grid with
:func:`~verl_mopd.eval.agent.grid_to_pixel`; the dict has the keys of MobileWorld's
``JSONAction``, ``mobile_world/runtime/utils/models.py``):

=============================  ====================================================================
click / long_press             ``{"action_type": "click"|"long_press", "x", "y"}`` (``adb input tap``;
                               the server holds long presses for 1000 ms, ``time`` is not sent)
swipe                          ``{"action_type": "drag", "start_x", "start_y", "end_x", "end_y"}``:
                               ``adb input swipe`` along the exact finger path the model chose
                               (the harness's ``swipe``/``scroll`` take only a direction)
type                           ``{"action_type": "input_text", "text"}``
system_button Back/Home/Enter  ``navigate_back`` / ``navigate_home`` / ``keyboard_enter``
key back/home/enter            the same three (other keys have no MobileWorld action: ``unknown``)
open                           ``{"action_type": "open_app", "app_name"}``
wait                           ``{"action_type": "wait"}``
terminate                      ``{"action_type": "finished", "text": status}`` (ends the episode)
answer / ask_user              ``{"action_type": "answer"|"ask_user", "text"}``
=============================  ====================================================================

``system_button`` Menu and keys other than back/home/enter become ``{"action_type": "unknown",
"text": reason}``, which the runner treats as the end of the episode, as it does for an
unparseable response (MobileWorld's own agents do the same). Past ``max_steps`` (30) the agent
answers ``finished`` with status ``failure``.
"""

from __future__ import annotations

from typing import Any, Callable

from verl_mopd.eval.agent import (
    DEFAULT_MAX_STEPS,
    DEFAULT_USER_TEMPLATE,
    StepPrompter,
    ask,
    grid_to_pixel,
    screenshot_size,
    to_png,
)
from verl_mopd.rewards import Action
from verl_mopd.rewards.actions import normalize_key

_BUTTONS = {"Back": "navigate_back", "Home": "navigate_home", "Enter": "keyboard_enter"}
_KEYS = {"back": "navigate_back", "home": "navigate_home", "enter": "keyboard_enter"}


def to_json_action(action: Action, width: int, height: int) -> dict[str, Any]:
    """One mobile :class:`Action` -> MobileWorld ``JSONAction`` keyword arguments (module table)."""
    if action.platform != "mobile":
        raise ValueError(f"action.platform={action.platform!r}: MobileWorld takes mobile (mobile_use) actions")
    name = action.action
    if name in ("click", "long_press"):
        x, y = grid_to_pixel(*action.coordinate, width, height)
        return {"action_type": name, "x": x, "y": y}
    if name == "swipe":
        sx, sy = grid_to_pixel(*action.coordinate, width, height)
        ex, ey = grid_to_pixel(*action.coordinate2, width, height)
        return {"action_type": "drag", "start_x": sx, "start_y": sy, "end_x": ex, "end_y": ey}
    if name == "type":
        return {"action_type": "input_text", "text": action.text}
    if name == "system_button":
        if action.button in _BUTTONS:
            return {"action_type": _BUTTONS[action.button]}
        return {"action_type": "unknown", "text": f"system_button {action.button!r} has no MobileWorld action"}
    if name == "key":
        key = normalize_key(action.text)
        if key in _KEYS:
            return {"action_type": _KEYS[key]}
        return {"action_type": "unknown", "text": f"key {action.text!r} has no MobileWorld action"}
    if name == "open":
        return {"action_type": "open_app", "app_name": action.text}
    if name == "wait":
        return {"action_type": "wait"}
    if name == "terminate":
        return {"action_type": "finished", "text": action.status}
    if name in ("answer", "ask_user"):
        return {"action_type": name, "text": action.text}
    raise ValueError(f"action={name!r}: no MobileWorld translation")  # unreachable for a valid Action


def default_action_factory() -> Callable[[dict[str, Any]], Any]:
    """MobileWorld's ``JSONAction`` when ``mobile_world`` is importable, else the plain dict."""
    try:
        from mobile_world.runtime.utils.models import JSONAction
    except ImportError:
        return dict
    return lambda d: JSONAction(**d)


class MobileWorldAgent:
    """A MobileWorld agent around any client (``complete(messages) -> str``).

    Subclass-free on purpose: MobileWorld's ``BaseAgent`` only adds an OpenAI client and token
    counters, and its runner calls exactly ``initialize``, ``predict``, ``done`` and, through
    ``done``, ``reset``. Register it with MobileWorld's agent registry (a factory that returns
    ``MobileWorldAgent(OpenAIClient(llm_base_url, model_name).complete)``).

    Args:
        complete: the model client's ``complete``.
        max_steps: the step budget (30); run the harness with ``--max-step 30`` as well.
        user_template, history_n: the step prompt (:class:`~verl_mopd.eval.agent.StepPrompter`).
        action_factory: builds the returned action from the dict (default: MobileWorld's
            ``JSONAction`` when installed).
    """

    def __init__(
        self,
        complete: Callable[[list[dict[str, Any]]], str],
        *,
        max_steps: int = DEFAULT_MAX_STEPS,
        user_template: str = DEFAULT_USER_TEMPLATE,
        history_n: int | None = None,
        action_factory: Callable[[dict[str, Any]], Any] | None = None,
    ):
        if not (isinstance(max_steps, int) and max_steps >= 1):
            raise ValueError(f"max_steps={max_steps!r}: must be an int >= 1")
        self.complete = complete
        self.max_steps = max_steps
        self.prompter = StepPrompter("mobile", user_template, history_n)
        self.make_action = action_factory or default_action_factory()
        self.instruction: str | None = None
        self.steps = 0

    def initialize(self, instruction: str) -> bool:
        self.reset()
        self.instruction = instruction
        return True

    def reset(self) -> None:
        self.prompter.reset()
        self.steps = 0

    def done(self) -> None:
        self.instruction = None
        self.reset()

    def predict(self, observation: dict[str, Any]) -> tuple[str, Any]:
        if self.instruction is None:
            raise RuntimeError("predict() before initialize(instruction)")
        answer = observation.get("ask_user_response")
        if answer is not None and self.prompter.history:
            self.prompter.history[-1] += f" -> the user answered: {answer}"
        if self.steps >= self.max_steps:
            return f"step budget of {self.max_steps} reached", self.make_action({"action_type": "finished", "text": "failure"})
        self.steps += 1
        screenshot = observation["screenshot"]
        width, height = screenshot_size(screenshot)
        response, action = ask(self.complete, self.prompter, self.instruction, to_png(screenshot))
        self.prompter.record(action)
        if not action:
            return response, self.make_action({"action_type": "unknown", "text": f"unparseable response: {action.reason}"})
        return response, self.make_action(to_json_action(action, width, height))


__all__ = ["MobileWorldAgent", "default_action_factory", "to_json_action"]
