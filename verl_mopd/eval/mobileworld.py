"""MobileWorld agent: screenshot -> our ``mobile_use`` prompt -> model -> the harness's ``JSONAction``.

Written against MobileWorld's agent interface (Tongyi-MAI/MobileWorld, read at the commits named
in tests/eval/harness/README.md): ``mw eval`` builds the agent with
``agents/registry.py::create_agent``, which for ``--agent-type path/to/file.py`` loads the first
class in that file that subclasses ``mobile_world.agents.base.BaseAgent`` and calls it as
``cls(model_name=..., llm_base_url=..., api_key=..., env=..., **more)``. The runner
(``core/runner.py::_execute_single_task``) then calls ``agent.initialize(goal)``, per step
``prediction, action = agent.predict(observation)`` with ``observation["screenshot"]`` (a PIL
image of the device screen), ``"tool_call"`` and ``"ask_user_response"``, logs
``action.model_dump(...)`` with ``agent.get_total_token_usage()``, stops when ``prediction`` is
None, ends the episode on ``finished``/``unknown`` (not executed) and ``answer`` (executed), sends
every other action to the device server (``core/server.py::step``, adb), and stops at ``max_step``;
finally it scores the task and calls ``agent.done()``.

Two classes: :class:`MobileWorldAgent` works around any client (``complete(messages) -> str``)
and has the runner's whole interface; :class:`VerlMopdMobileWorldAgent` (defined only where
``mobile_world`` imports) is the ``BaseAgent`` subclass that ``--agent-type`` loads: it calls the
model through ``BaseAgent``'s own OpenAI client, so the runner's token counters are real. Pass this
file to MobileWorld:

    mw eval --agent-type "$(python -c 'import verl_mopd.eval.mobileworld as m; print(m.__file__)')" \\
        --model-name MODEL --llm-base-url http://HOST:PORT/v1 --max-step 30 --task ALL ...

``--max-step`` is required in practice: without it MobileWorld passes ``max_step=-1`` ("unlimited")
but its loop tests ``step >= max_step`` after the first step, so every task runs ONE step. Options
that the ``mw`` command line cannot pass are read from the environment when the class is built:
``VERL_MOPD_MAX_STEPS`` (30), ``VERL_MOPD_ON_INVALID`` (``retry``), ``VERL_MOPD_HISTORY_N``
(all), ``VERL_MOPD_MOBILE_ACTIONS`` (comma-separated prompt actions; default every mobile action,
``ask_user`` included), ``VERL_MOPD_MAX_TOKENS`` (2048), ``VERL_MOPD_TEMPERATURE`` (0).

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
key back/home/enter            the same three
open                           ``{"action_type": "open_app", "app_name"}``
wait                           ``{"action_type": "wait"}``
terminate                      ``{"action_type": "finished", "text": status}`` (ends the episode)
answer / ask_user              ``{"action_type": "answer"|"ask_user", "text"}``; the user's reply
                               comes back as ``ask_user_response`` and joins the action history
=============================  ====================================================================

``system_button`` Menu and keys other than back/home/enter have no MobileWorld action
(:class:`~verl_mopd.eval.agent.Unsupported`); they are handled like an unparseable reply, by
``on_invalid``: ``"retry"`` (default) asks the model once more within the step (the history now
shows the refused reply) and then waits; ``"wait"`` waits at once; ``"end"`` answers ``unknown``,
which ends the episode. MobileWorld's own Qwen3-VL agent re-asks until a reply parses. Past
``max_steps`` (30) the agent answers ``finished`` (the checker still decides the score).
"""

from __future__ import annotations

import os
from typing import Any, Callable, Sequence

from verl_mopd.clients import to_openai
from verl_mopd.eval.agent import (
    DEFAULT_MAX_STEPS,
    DEFAULT_USER_TEMPLATE,
    StepPrompter,
    Unsupported,
    ask,
    grid_to_pixel,
    screenshot_size,
    to_png,
)
from verl_mopd.rewards import Action
from verl_mopd.rewards.actions import normalize_key

_BUTTONS = {"Back": "navigate_back", "Home": "navigate_home", "Enter": "keyboard_enter"}
_KEYS = {"back": "navigate_back", "home": "navigate_home", "enter": "keyboard_enter"}
ON_INVALID = ("retry", "wait", "end")


def to_json_action(action: Action, width: int, height: int) -> dict[str, Any]:
    """One mobile :class:`Action` -> MobileWorld ``JSONAction`` keyword arguments (module table).

    Raises :class:`~verl_mopd.eval.agent.Unsupported` for a button or key MobileWorld has no
    action for.
    """
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
        raise Unsupported(f"system_button {action.button!r} has no MobileWorld action (allowed: {list(_BUTTONS)})")
    if name == "key":
        key = normalize_key(action.text)
        if key in _KEYS:
            return {"action_type": _KEYS[key]}
        raise Unsupported(f"key {action.text!r} has no MobileWorld action (allowed: {list(_KEYS)})")
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
    """A MobileWorld agent around any client (``complete(messages) -> str``; None = gave up).

    Has every method MobileWorld's runner calls: ``initialize``, ``predict``,
    ``get_total_token_usage`` (empty here: the client does not report usage), ``done`` and, through
    ``done``, ``reset``. For ``mw eval --agent-type`` use :class:`VerlMopdMobileWorldAgent`.

    Args:
        complete: the model client's ``complete``.
        max_steps: the step budget (30): ``predict`` calls; run the harness with ``--max-step 30``.
        user_template, history_n, actions: the step prompt
            (:class:`~verl_mopd.eval.agent.StepPrompter`).
        on_invalid: ``"retry"``, ``"wait"`` or ``"end"`` (module docstring).
        action_factory: builds the returned action from the dict (default: MobileWorld's
            ``JSONAction`` when installed).
    """

    def __init__(
        self,
        complete: Callable[[list[dict[str, Any]]], str | None],
        *,
        max_steps: int = DEFAULT_MAX_STEPS,
        user_template: str = DEFAULT_USER_TEMPLATE,
        history_n: int | None = None,
        actions: Sequence[str] | None = None,
        on_invalid: str = "retry",
        action_factory: Callable[[dict[str, Any]], Any] | None = None,
    ):
        if not (isinstance(max_steps, int) and max_steps >= 1):
            raise ValueError(f"max_steps={max_steps!r}: must be an int >= 1")
        if on_invalid not in ON_INVALID:
            raise ValueError(f"on_invalid={on_invalid!r}: allowed {list(ON_INVALID)}")
        self.complete = complete
        self.max_steps = max_steps
        self.on_invalid = on_invalid
        self.prompter = StepPrompter("mobile", user_template, history_n, actions)
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

    def get_total_token_usage(self) -> dict[str, int]:
        return {}

    def predict(self, observation: dict[str, Any]) -> tuple[str | None, Any]:
        if self.instruction is None:
            raise RuntimeError("predict() before initialize(instruction)")
        answer = observation.get("ask_user_response")
        if answer is not None and self.prompter.history:
            self.prompter.history[-1] += f" -> the user answered: {answer}"
        if self.steps >= self.max_steps:
            return f"step budget of {self.max_steps} spent", self.make_action({"action_type": "finished", "text": "failure"})
        self.steps += 1
        screenshot = observation["screenshot"]
        width, height = screenshot_size(screenshot)
        attempts = 2 if self.on_invalid == "retry" else 1
        out = ask(self.complete, self.prompter, self.instruction, to_png(screenshot),
                  lambda a: to_json_action(a, width, height), attempts)
        if out.response is None:  # the client gave up: the runner stops on a None prediction
            return None, self.make_action({"action_type": "unknown", "text": out.reason})
        if out.output is None:
            if self.on_invalid == "end":
                return out.response, self.make_action({"action_type": "unknown", "text": out.reason})
            return out.response, self.make_action({"action_type": "wait"})
        return out.response, self.make_action(out.output)


def _env_options(environ: dict[str, str]) -> dict[str, Any]:
    """The agent options of the module docstring from ``VERL_MOPD_*`` variables (unset: default)."""
    out: dict[str, Any] = {}

    def number(name: str, kind: type) -> Any:
        raw = environ[name]
        try:
            return kind(raw)
        except ValueError:
            raise ValueError(f"{name}={raw!r}: expected {'an int' if kind is int else 'a number'}") from None

    if "VERL_MOPD_MAX_STEPS" in environ:
        out["max_steps"] = number("VERL_MOPD_MAX_STEPS", int)
    if "VERL_MOPD_HISTORY_N" in environ:
        out["history_n"] = number("VERL_MOPD_HISTORY_N", int)
    if "VERL_MOPD_ON_INVALID" in environ:
        out["on_invalid"] = environ["VERL_MOPD_ON_INVALID"]
    if "VERL_MOPD_MOBILE_ACTIONS" in environ:
        out["actions"] = tuple(a.strip() for a in environ["VERL_MOPD_MOBILE_ACTIONS"].split(",") if a.strip())
    if "VERL_MOPD_MAX_TOKENS" in environ:
        out["max_tokens"] = number("VERL_MOPD_MAX_TOKENS", int)
    if "VERL_MOPD_TEMPERATURE" in environ:
        out["temperature"] = number("VERL_MOPD_TEMPERATURE", float)
    return out


try:  # MobileWorld is optional: this module must import without it
    from mobile_world.agents.base import BaseAgent as _BaseAgent
except ImportError:
    _BaseAgent = None

if _BaseAgent is not None:

    class VerlMopdMobileWorldAgent(_BaseAgent):
        """The ``BaseAgent`` subclass ``mw eval --agent-type <this file>`` loads.

        Built by MobileWorld as ``cls(model_name=..., llm_base_url=..., api_key=..., env=...,
        ...)``; keyword options (``max_steps``, ``on_invalid``, ``history_n``, ``actions``,
        ``max_tokens``, ``temperature``) override the ``VERL_MOPD_*`` environment variables. The
        model is called with ``BaseAgent.openai_chat_completions_create`` (its retries, its token
        counters); a call that still fails after them ends the task as MobileWorld's own agents do.
        """

        def __init__(self, model_name: str, llm_base_url: str, api_key: str | None = "empty", **kwargs: Any):
            options = {**_env_options(os.environ), **{k: kwargs.pop(k) for k in list(kwargs) if k in _OPTIONS}}
            super().__init__(**kwargs)
            self.model_name = model_name
            self.max_tokens = options.pop("max_tokens", 2048)
            self.temperature = options.pop("temperature", 0.0)
            self.build_openai_client(llm_base_url, api_key)
            self.agent = MobileWorldAgent(self._complete, **options)

        def _complete(self, messages: list[dict[str, Any]]) -> str | None:
            return self.openai_chat_completions_create(
                self.model_name, to_openai(messages), temperature=self.temperature, max_tokens=self.max_tokens
            )

        def initialize(self, instruction: str) -> bool:
            super().initialize(instruction)
            return self.agent.initialize(instruction)

        def predict(self, observation: dict[str, Any]) -> tuple[str | None, Any]:
            return self.agent.predict(observation)

        def reset(self) -> None:
            self.agent.reset()

        def done(self) -> None:
            super().done()
            self.agent.done()


_OPTIONS = ("max_steps", "on_invalid", "history_n", "actions", "max_tokens", "temperature")

__all__ = ["MobileWorldAgent", "default_action_factory", "to_json_action"] + (
    ["VerlMopdMobileWorldAgent"] if _BaseAgent is not None else []
)
