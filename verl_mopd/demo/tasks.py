"""Seeded synthetic cross-platform GUI tasks: compact text screens, instructions, ground-truth actions.

A screen is a 4 x 4 grid of cells on the 0-1000 relative grid; named elements sit in distinct
cells, listed in focus order (a ``click`` targets the focused, first-listed element, so grounding
is a fixed-offset copy a 2-layer model learns in a few hundred steps: the demo is about the
platforms' conflicting action spaces, not about grounding). The instruction is one of a few intents, and the SAME intent has a DIFFERENT
correct action on each platform, which is what makes one policy trained on both platforms'
data average the two behaviours:

=============  =================================  ==========================================
intent         desktop (``computer_use``)          mobile (``mobile_use``)
=============  =================================  ==========================================
click NAME     ``left_click`` at the element       ``click`` at the element
back           ``key`` ``["alt", "left"]``         ``system_button`` ``Back``
scroll down    ``scroll`` ``pixels: -5``           ``swipe`` ``[500, 750] -> [500, 250]``
type "WORD"    ``type`` ``text: WORD``             ``type`` ``text: WORD`` (shared)
task done      ``terminate`` ``success``           ``terminate`` ``success`` (shared)
=============  =================================  ==========================================

Ground truths are the reward's own layout (``{"platform", "action", "bbox"}``, see
``verl_mopd.rewards``) and targets are rendered with ``verl_mopd.rewards.render_tool_call``, so
the demo scores with exactly the reward a real run uses.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from verl_mopd.rewards import PLATFORMS, normalize_action, render_tool_call

__all__ = ["ELEMENTS", "WORDS", "INTENTS", "CELL_CENTERS", "Task", "make_task", "make_tasks", "corpus"]

ELEMENTS = ("ok", "cancel", "search", "settings", "mail", "photos", "music", "share", "save", "delete")
WORDS = ("hello", "cats", "news", "maps", "pizza", "train")
CELL_CENTERS = (125, 375, 625, 875)
HALF_CELL = 125
N_ELEMENTS = 2
#: intent -> sampling weight
INTENTS = {"click": 0.5, "back": 0.15, "scroll": 0.15, "type": 0.12, "done": 0.08}


@dataclass(frozen=True)
class Task:
    """One step prompt.

    platform: ``"desktop"`` or ``"mobile"`` (the routing key).
    prompt: compact text screen + instruction, e.g.
        ``desktop | ok 125 375 | mail 625 125 | save 875 875 | click mail``.
    ground_truth: ``{"platform", "action": {"action": NAME, ...}, "bbox"?}`` as the reward reads it.
    target: the correct response, ``<tool_call> {...} </tool_call>``.
    intent: the intent name (for per-intent diagnostics).
    """

    platform: str
    prompt: str
    ground_truth: dict
    target: str
    intent: str


def _action(platform: str, intent: str, element: tuple | None, word: str | None) -> tuple[dict, list | None]:
    desktop = platform == "desktop"
    if intent == "click":
        _, x, y = element
        box = [x - HALF_CELL, y - HALF_CELL, x + HALF_CELL, y + HALF_CELL]
        return {"action": "left_click" if desktop else "click", "coordinate": [x, y]}, box
    if intent == "back":
        return ({"action": "key", "keys": ["alt", "left"]} if desktop
                else {"action": "system_button", "button": "Back"}), None
    if intent == "scroll":
        return ({"action": "scroll", "pixels": -5} if desktop
                else {"action": "swipe", "coordinate": [500, 750], "coordinate2": [500, 250]}), None
    if intent == "type":
        return {"action": "type", "text": word}, None
    if intent == "done":
        return {"action": "terminate", "status": "success"}, None
    raise ValueError(f"intent={intent!r}: allowed {sorted(INTENTS)}")


def make_task(platform: str, rng: np.random.Generator) -> Task:
    """One random task of ``platform`` drawn with ``rng``."""
    if platform not in PLATFORMS:
        raise ValueError(f"platform={platform!r}: allowed {list(PLATFORMS)}")
    names = rng.choice(len(ELEMENTS), size=N_ELEMENTS, replace=False)
    cells = rng.choice(len(CELL_CENTERS) ** 2, size=N_ELEMENTS, replace=False)
    elements = [(ELEMENTS[n], CELL_CENTERS[c % 4], CELL_CENTERS[c // 4]) for n, c in zip(names, cells)]
    intent = str(rng.choice(list(INTENTS), p=np.array(list(INTENTS.values())) / sum(INTENTS.values())))
    element = elements[0] if intent == "click" else None  # the focused element is listed first
    word = str(rng.choice(WORDS)) if intent == "type" else None
    instruction = {"click": f"click {element[0] if element else ''}", "back": "go back", "scroll": "scroll down",
                   "type": f'type "{word}"', "done": "task done"}[intent]
    screen = " | ".join(f"{n} {x} {y}" for n, x, y in elements)
    action, box = _action(platform, intent, element, word)
    ground_truth = {"platform": platform, "action": action}
    if box is not None:
        ground_truth["bbox"] = box
    target = render_tool_call(normalize_action(platform, action)).replace("\n", " ")
    return Task(platform, f"{platform} | {screen} | {instruction}", ground_truth, target, intent)


def make_tasks(n: int, seed: int, platforms: tuple[str, ...] = ("desktop", "mobile")) -> list[Task]:
    """``n`` tasks, platforms alternating in the order given (so a batch is balanced), seeded."""
    if n < 0:
        raise ValueError(f"n={n}: must be >= 0")
    rng = np.random.default_rng(seed)
    return [make_task(platforms[i % len(platforms)], rng) for i in range(n)]


def corpus() -> list[str]:
    """Texts that together contain every token a task can produce (for building the vocabulary)."""
    texts = []
    for platform in PLATFORMS:
        for intent in INTENTS:
            for x in CELL_CENTERS:
                for y in CELL_CENTERS:
                    texts.append(_render(platform, intent, ("ok", x, y), WORDS[0]))
        texts += [_render(platform, "type", None, w) for w in WORDS]
    texts.append(" ".join(f"{n} | click {n}" for n in ELEMENTS))
    texts.append(" ".join(f'type "{w}"' for w in WORDS))
    texts.append("go back scroll down task done " + " ".join(PLATFORMS))
    return texts


def _render(platform: str, intent: str, element, word) -> str:
    action, _ = _action(platform, intent, element, word)
    return render_tool_call(normalize_action(platform, action)).replace("\n", " ")
