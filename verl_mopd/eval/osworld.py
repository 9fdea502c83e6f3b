"""OSWorld agent: screenshot -> our ``computer_use`` prompt -> model -> pyautogui code for the harness.

Written against OSWorld's agent interface (xlang-ai/OSWorld, ``lib_run_single.run_single_example``):
the harness calls ``agent.reset(logger)``, then per step ``response, actions =
agent.predict(instruction, obs)`` with ``obs["screenshot"]`` the PNG bytes of the screen, and
runs ``env.step(action)`` for each string in ``actions``: a pyautogui code string (the VM runs it
after ``import pyautogui``), or one of the special actions ``"WAIT"``, ``"DONE"``, ``"FAIL"``
(``DONE``/``FAIL`` end the episode). Use it with the ``pyautogui`` action space and the
``screenshot`` observation type.

Translation (:func:`to_pyautogui`; points from the 0-1000 grid to screen pixels of the
screenshot with :func:`~verl_mopd.eval.agent.grid_to_pixel`):

================  ======================================================================
left_click etc.   ``pyautogui.click(x, y)``, ``rightClick``, ``middleClick``, ``doubleClick``,
                  ``tripleClick``; without a coordinate, at the cursor (``pyautogui.click()``)
mouse_move        ``pyautogui.moveTo(x, y)``
left_click_drag   ``pyautogui.dragTo(x, y, duration=0.5, button='left')`` from the cursor;
                  with ``coordinate2``: ``pyautogui.moveTo(x1, y1); pyautogui.dragTo(x2, y2, ...)``
scroll / hscroll  ``pyautogui.scroll(pixels)`` / ``pyautogui.hscroll(pixels)`` (+ ``x=, y=`` when
                  a coordinate is given); positive = up / right, as in Qwen3-VL and pyautogui
key               one key ``pyautogui.press('k')``, several ``pyautogui.hotkey('ctrl', 'c')``;
                  canonical names, ``super`` -> ``win`` (pyautogui's name for it)
type              ``pyautogui.write('...')`` (Python-escaped literal)
wait              ``WAIT``
terminate         ``DONE`` (success) / ``FAIL`` (failure)
answer            ``DONE`` (OSWorld has no answer channel; the text stays in the response)
================  ======================================================================

The step budget (``max_steps``, 30 by default as in the paper) is enforced here too: past it the
agent answers ``FAIL``; run the harness with ``--max_steps 30`` so it does not stop earlier (its
own default is 15). A response that does not parse gives no action (``[]``), as OSWorld's own
Qwen3-VL agent does; ``on_invalid="fail"`` ends the episode instead, ``"wait"`` waits.
"""

from __future__ import annotations

import logging
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

SPECIAL = ("WAIT", "DONE", "FAIL")
_CLICKS = {
    "left_click": "click",
    "right_click": "rightClick",
    "middle_click": "middleClick",
    "double_click": "doubleClick",
    "triple_click": "tripleClick",
}
PYAUTOGUI_KEY_NAMES = {"super": "win"}  # our canonical names that pyautogui spells differently
DRAG_DURATION = 0.5
_ON_INVALID = {"skip": [], "wait": ["WAIT"], "fail": ["FAIL"]}


def _num(v: float) -> str:
    return str(int(v)) if float(v).is_integer() else repr(float(v))


def to_pyautogui(action: Action, width: int, height: int) -> list[str]:
    """One desktop :class:`Action` -> the OSWorld actions that perform it (see the module table)."""
    if action.platform != "desktop":
        raise ValueError(f"action.platform={action.platform!r}: OSWorld takes desktop (computer_use) actions")
    name = action.action

    def px(point: tuple[float, float]) -> str:
        x, y = grid_to_pixel(point[0], point[1], width, height)
        return f"{x}, {y}"

    if name in _CLICKS:
        fn = _CLICKS[name]
        return [f"pyautogui.{fn}({px(action.coordinate)})" if action.coordinate is not None else f"pyautogui.{fn}()"]
    if name == "mouse_move":
        return [f"pyautogui.moveTo({px(action.coordinate)})"]
    if name == "left_click_drag":
        drag = f"duration={DRAG_DURATION}, button='left'"
        if action.coordinate2 is None:
            return [f"pyautogui.dragTo({px(action.coordinate)}, {drag})"]
        return [f"pyautogui.moveTo({px(action.coordinate)}); pyautogui.dragTo({px(action.coordinate2)}, {drag})"]
    if name in ("scroll", "hscroll"):
        at = ""
        if action.coordinate is not None:
            x, y = grid_to_pixel(action.coordinate[0], action.coordinate[1], width, height)
            at = f", x={x}, y={y}"
        return [f"pyautogui.{name}({_num(round(action.pixels))}{at})"]
    if name == "key":
        keys = ", ".join(repr(PYAUTOGUI_KEY_NAMES.get(k, k)) for k in action.keys)
        return [f"pyautogui.press({keys})" if len(action.keys) == 1 else f"pyautogui.hotkey({keys})"]
    if name == "type":
        return [f"pyautogui.write({action.text!r})"]
    if name == "wait":
        return ["WAIT"]
    if name == "terminate":
        return ["DONE" if action.status == "success" else "FAIL"]
    if name == "answer":
        return ["DONE"]
    raise ValueError(f"action={name!r}: no OSWorld translation")  # unreachable for a valid Action


class OSWorldAgent:
    """An OSWorld agent around any client (``complete(messages) -> str``).

    Args:
        complete: e.g. ``OpenAIClient(base_url, model).complete``.
        max_steps: the step budget (30).
        user_template, history_n: the step prompt (:class:`~verl_mopd.eval.agent.StepPrompter`).
        on_invalid: ``"skip"`` (no action), ``"wait"`` or ``"fail"`` for an unparseable response.
    """

    def __init__(
        self,
        complete: Callable[[list[dict[str, Any]]], str],
        *,
        max_steps: int = DEFAULT_MAX_STEPS,
        user_template: str = DEFAULT_USER_TEMPLATE,
        history_n: int | None = None,
        on_invalid: str = "skip",
    ):
        if on_invalid not in _ON_INVALID:
            raise ValueError(f"on_invalid={on_invalid!r}: allowed {list(_ON_INVALID)}")
        if not (isinstance(max_steps, int) and max_steps >= 1):
            raise ValueError(f"max_steps={max_steps!r}: must be an int >= 1")
        self.complete = complete
        self.max_steps = max_steps
        self.on_invalid = on_invalid
        self.prompter = StepPrompter("desktop", user_template, history_n)
        self.steps = 0
        self.logger = logging.getLogger("verl_mopd.eval.osworld")

    def reset(self, _logger: logging.Logger | None = None, *args: Any, **kwargs: Any) -> None:
        """Called by the harness before each task (it may pass its runtime logger)."""
        if _logger is not None:
            self.logger = _logger
        self.prompter.reset()
        self.steps = 0

    def predict(self, instruction: str, obs: dict[str, Any]) -> tuple[str, list[str]]:
        """``obs["screenshot"]``: PNG bytes -> ``(response, actions)`` for ``env.step``."""
        if self.steps >= self.max_steps:
            return f"step budget of {self.max_steps} reached", ["FAIL"]
        self.steps += 1
        screenshot = obs["screenshot"]
        width, height = screenshot_size(screenshot)
        response, action = ask(self.complete, self.prompter, instruction, to_png(screenshot))
        self.prompter.record(action)
        if not action:
            self.logger.info("step %d: unparseable response (%s)", self.steps, action.reason)
            return response, list(_ON_INVALID[self.on_invalid])
        actions = to_pyautogui(action, width, height)
        self.logger.info("step %d: %s -> %s", self.steps, action.to_arguments(), actions)
        return response, actions

