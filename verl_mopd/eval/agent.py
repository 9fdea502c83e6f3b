"""What the online adapters share: the step prompt, the action history, grid -> screen pixels.

An online step is built like an offline step prompt: the platform's system prompt
(:func:`verl_mopd.rewards.system_prompt`, the tool the policy was trained with), then one user
turn with the task, the previous actions and the current screenshot. The user-turn text is a
template (``user_template``) so it can be set to exactly what ``verl-mopd prepare`` wrote into the
training prompts; the model's reply is parsed by :func:`verl_mopd.rewards.parse_action`, the
reward's parser, so an action executed online is an action the reward would have graded.
"""

from __future__ import annotations

import io
import json
import math
from dataclasses import dataclass, field
from typing import Any, Callable

from verl_mopd.rewards import Action, ParseError, parse_action, system_prompt
from verl_mopd.rewards.actions import GRID_MAX
from verl_mopd.rewards.prompts import USER_TEMPLATE

DEFAULT_USER_TEMPLATE = USER_TEMPLATE  # the user turn verl-mopd prepare writes, so online steps read like RL steps
DEFAULT_MAX_STEPS = 30  # the step budget of UI-MOPD's OSWorld and MobileWorld evaluations


def grid_to_pixel(gx: float, gy: float, width: int, height: int) -> tuple[int, int]:
    """A 0-1000 grid point -> integer pixels on a ``width x height`` screen.

    ``x = floor(gx / 1000 * width + 0.5)`` (round half up), clamped to ``[0, width - 1]`` so that
    the grid's edge (1000) lands on the last pixel instead of one past it; same for ``y``. The
    inverse of :func:`verl_mopd.rewards.to_grid` to within half a grid cell.
    """
    if not (isinstance(width, int) and isinstance(height, int) and width > 0 and height > 0):
        raise ValueError(f"screen size width={width!r}, height={height!r}: both must be positive ints")
    if not (0 <= gx <= GRID_MAX and 0 <= gy <= GRID_MAX):
        raise ValueError(f"grid point ({gx!r}, {gy!r}) is outside 0-{GRID_MAX}")
    x = min(width - 1, math.floor(gx / GRID_MAX * width + 0.5))
    y = min(height - 1, math.floor(gy / GRID_MAX * height + 0.5))
    return x, y


@dataclass
class StepPrompter:
    """Builds the neutral messages for one online step and keeps the action history.

    Attributes:
        platform: ``"desktop"`` or ``"mobile"``.
        user_template: formatted with ``instruction`` and ``history``; one ``<image>`` marks where
            the screenshot goes.
        history_n: how many previous actions to show (most recent last); None shows all (as
            ``prepare`` does by default), 0 none.
        actions: the actions the system prompt offers (default
            :data:`~verl_mopd.rewards.actions.DEFAULT_PROMPT_ACTIONS`, as ``prepare``); set it to
            the ``action_sets`` the student was trained with.
    """

    platform: str
    user_template: str = DEFAULT_USER_TEMPLATE
    history_n: int | None = None
    actions: tuple[str, ...] | None = None
    history: list[str] = field(default_factory=list)

    def __post_init__(self):
        if self.actions is not None:
            self.actions = tuple(self.actions)
        self.system = system_prompt(self.platform, self.actions)  # validates platform and actions
        if self.user_template.count("<image>") != 1:
            raise ValueError(f"user_template={self.user_template!r}: needs exactly one <image> for the screenshot")
        if self.history_n is not None and not (isinstance(self.history_n, int) and self.history_n >= 0):
            raise ValueError(f"history_n={self.history_n!r}: must be None or an int >= 0")

    def messages(self, instruction: str, screenshot: bytes) -> list[dict[str, Any]]:
        shown = self.history if self.history_n is None else self.history[len(self.history) - self.history_n :]
        start = len(self.history) - len(shown)
        history = "\n".join(f"Step {start + i + 1}: {h}" for i, h in enumerate(shown)) or "None"
        text = self.user_template.format(instruction=instruction, history=history)
        before, after = text.split("<image>")
        parts: list[dict[str, Any]] = []
        if before:
            parts.append({"type": "text", "text": before})
        parts.append({"type": "image", "image": screenshot})
        if after:
            parts.append({"type": "text", "text": after})
        return [{"role": "system", "content": self.system}, {"role": "user", "content": parts}]

    def record(self, action: Action | ParseError, note: str | None = None) -> None:
        entry = json.dumps(action.to_arguments(), ensure_ascii=False) if isinstance(action, Action) else "(invalid output)"
        self.history.append(entry if note is None else f"{entry} -> {note}")

    def reset(self) -> None:
        self.history.clear()


class Unsupported(ValueError):
    """A valid action that the harness cannot execute (e.g. a key with no keycode there)."""


@dataclass
class Outcome:
    """One online step: the last response, the harness action (None when there is none), why not."""

    response: str | None
    output: Any = None
    reason: str | None = None


def ask(
    complete: Callable[[list[dict[str, Any]]], str | None],
    prompter: StepPrompter,
    instruction: str,
    screenshot: bytes,
    translate: Callable[[Action], Any],
    attempts: int = 1,
) -> Outcome:
    """Ask the model until it gives an action the harness can execute, at most ``attempts`` times.

    Each reply is parsed by the reward's parser and translated; an unparseable reply or an
    :class:`Unsupported` action is recorded in the history (so the next ask reads differently, even
    with greedy decoding) and asked again. A client that returns None (it gave up) ends the step
    with ``response=None``.
    """
    outcome = Outcome(None)
    for _ in range(attempts):
        response = complete(prompter.messages(instruction, screenshot))
        if response is None:
            return Outcome(None, reason="the model client returned no response")
        action = parse_action(response, prompter.platform)
        if not action:
            prompter.record(action)
            outcome = Outcome(response, reason=f"unparseable response ({action.reason})")
            continue
        try:
            output = translate(action)
        except Unsupported as e:
            prompter.record(action, note=f"not executed: {e}")
            outcome = Outcome(response, reason=str(e))
            continue
        prompter.record(action)
        return Outcome(response, output)
    return outcome


def screenshot_size(screenshot: Any) -> tuple[int, int]:
    """``(width, height)`` of PNG/JPEG bytes or a PIL image."""
    if hasattr(screenshot, "size") and not isinstance(screenshot, (bytes, bytearray)):
        return tuple(screenshot.size)
    from PIL import Image

    with Image.open(io.BytesIO(screenshot)) as im:
        return im.size


def to_png(screenshot: Any) -> bytes:
    """Encoded bytes as given, or a PIL image encoded as PNG."""
    if isinstance(screenshot, (bytes, bytearray)):
        return bytes(screenshot)
    buf = io.BytesIO()
    screenshot.save(buf, format="PNG")
    return buf.getvalue()
