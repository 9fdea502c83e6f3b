"""Seeded synthetic cross-platform GUI tasks: compact text screens, instructions, ground-truth actions.

A screen is a 4 x 4 grid of cells on the 0-1000 relative grid; named elements sit in distinct
cells, listed in focus order (a ``click`` targets the focused, first-listed element: grounding is
a copy of its coordinates; a click by name among several elements needs a content lookup that a
2-layer model does not learn in 500 steps, too slow for a CPU demo). The
instruction is one of a few intents, and the SAME screen and intent have a DIFFERENT correct
action on each platform:

=============  ==================================  ==========================================
intent         desktop (``computer_use``)           mobile (``mobile_use``)
=============  ==================================  ==========================================
click NAME     ``left_click`` at the element's      ``click`` at the element in the portrait
               listed ``[x, y]``                    frame: ``[1000 - y, x]``
back           ``key`` ``["alt", "left"]``          ``system_button`` ``Back``
scroll down    ``scroll`` ``pixels: -5``            ``swipe`` ``[500, 750] -> [500, 250]``
type "WORD"    ``type`` ``text: WORD``              ``type`` ``text: WORD`` (shared)
task done      ``terminate`` ``success``            ``terminate`` ``success`` (shared)
=============  ==================================  ==========================================

The mobile frame is the conflict that costs capacity: screens are listed in the landscape frame
and ``mobile_use`` clicks in portrait, a quarter turn, so the same listed screen asks the model to
copy ``x, y`` on desktop and ``1000 - y, x`` on mobile. The two platforms need different routing
of the same grounding circuit (which prompt token to copy first), not only a different action
name (a 1-token conflict is learned from the platform token in a few steps). No cell is its own
image, so a click in one platform's frame always misses on the other platform. A stand-in for the
platforms' different screen geometries and action spaces.

Reward boxes are +-``HALF_CELL`` = 100 around the cell centre; strict mode enlarges them by
``bbox_scale`` 1.2 to +-120, which stays inside the 250-wide cell, so no point scores on two cells.

Ground truths are the reward's own layout (``{"platform", "action", "bbox"}``, see
``verl_mopd.rewards``) and targets are rendered with ``verl_mopd.rewards.render_tool_call``, so
the demo scores with exactly the reward a real run uses.

Three disjoint task streams keep data roles apart as in the paper: the held-out eval set, the
finite stage-1 SFT corpora (teachers and the mixed-SFT baseline), and the stage-2 RL prompts
(their ground truth is used only by the reward); ``verl_mopd.demo.run`` draws each with
``exclude``, so none holds another's prompt. Pretraining batches of the bases are drawn fresh from
a platform mix (``DemoConfig.pretrain_mobile_share``).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from verl_mopd.rewards import PLATFORMS, normalize_action, render_tool_call

__all__ = [
    "ELEMENTS", "WORDS", "INTENTS", "CELL_CENTERS", "HALF_CELL", "Task", "make_task", "make_tasks",
    "sample_tasks", "corpus", "mobile_frame",
]

ELEMENTS = ("ok", "cancel", "search", "settings", "mail", "photos", "music", "share", "save", "delete")
WORDS = ("hello", "cats", "news", "maps", "pizza", "train")
CELL_CENTERS = (125, 375, 625, 875)
#: half-width of a click box; x bbox_scale 1.2 = 120 < 125, so enlarged boxes never overlap
HALF_CELL = 100
N_ELEMENTS = 2
#: intent -> sampling weight
INTENTS = {"click": 0.5, "back": 0.15, "scroll": 0.15, "type": 0.12, "done": 0.08}


@dataclass(frozen=True)
class Task:
    """One step prompt.

    platform: ``"desktop"`` or ``"mobile"`` (the routing key).
    prompt: compact text screen + instruction, e.g.
        ``desktop | ok 125 375 | mail 625 125 | click ok``.
    ground_truth: ``{"platform", "action": {"action": NAME, ...}, "bbox"?}`` as the reward reads it.
    target: the correct response, ``<tool_call> {...} </tool_call>``.
    intent: the intent name (for per-intent diagnostics).
    """

    platform: str
    prompt: str
    ground_truth: dict
    target: str
    intent: str


def mobile_frame(x: int, y: int) -> tuple[int, int]:
    """Listed (landscape) ``(x, y)`` -> the point ``mobile_use`` clicks (portrait): ``(1000 - y, x)``."""
    return 1000 - y, x


def _action(platform: str, intent: str, element: tuple | None, word: str | None) -> tuple[dict, list | None]:
    desktop = platform == "desktop"
    if intent == "click":
        _, x, y = element
        if not desktop:
            x, y = mobile_frame(x, y)
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


def _draw(platform_of, n: int, seed: int, exclude: frozenset[str] | set[str]) -> list[Task]:
    rng = np.random.default_rng(seed)
    out = []
    while len(out) < n:
        t = make_task(platform_of(len(out), rng), rng)
        if t.prompt not in exclude:
            out.append(t)
    return out


def make_tasks(n: int, seed: int, platforms: tuple[str, ...] = ("desktop", "mobile"),
               exclude: frozenset[str] | set[str] = frozenset()) -> list[Task]:
    """``n`` tasks, platforms alternating in the order given (so a batch is balanced), seeded.

    ``exclude``: prompts to skip (redrawn), so a training stream never contains a held-out prompt.
    """
    if n < 0:
        raise ValueError(f"n={n}: must be >= 0")
    return _draw(lambda i, rng: platforms[i % len(platforms)], n, seed, exclude)


def sample_tasks(n: int, seed: int, mobile_share: float, exclude: frozenset[str] | set[str] = frozenset()) -> list[Task]:
    """``n`` tasks whose platform is mobile with probability ``mobile_share`` (a skewed mix), seeded."""
    if n < 0:
        raise ValueError(f"n={n}: must be >= 0")
    if not 0.0 <= mobile_share <= 1.0:
        raise ValueError(f"mobile_share={mobile_share!r}: must be in [0, 1]")
    return _draw(lambda i, rng: "mobile" if rng.random() < mobile_share else "desktop", n, seed, exclude)


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
