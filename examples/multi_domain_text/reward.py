"""Rule reward of the multi-domain text tasks, as verl's ``custom_reward_function``.

The answer is the text after the last ``Answer:`` of the response (the prompt asks for it on the
last line); thinking before it is ignored. Same three levels as the GUI reward, so the gate and
``verl-mopd validate-recipe``'s gate checks read it the same way:

- ``+1.0``: the answer equals the ground truth (whitespace collapsed, case kept);
- ``-0.5``: an answer is given but wrong;
- ``-1.0``: no ``Answer:`` line.

``acc`` is 1.0 iff correct: the recipe gates the KL term on it (``mopd.gate_metric: acc``).
"""

from __future__ import annotations

import re

_ANSWER = re.compile(r"Answer:\s*(.*)", re.IGNORECASE)


def extract_answer(response: str) -> str | None:
    """The text after the last ``Answer:`` up to the end of its line, whitespace collapsed; None if absent."""
    found = _ANSWER.findall(response.split("</think>")[-1])
    if not found:
        return None
    return " ".join(found[-1].strip().strip(".").split())


def compute_score(data_source, solution_str: str, ground_truth: str, extra_info=None, **verl_kwargs) -> dict:
    """verl's custom reward signature; ``verl_kwargs`` are what verl's reward managers may add
    (``reward_router_address``, ...), unused here."""
    answer = extract_answer(solution_str)
    correct = answer is not None and answer == " ".join(str(ground_truth).split())
    score = 1.0 if correct else (-0.5 if answer is not None else -1.0)
    return {"score": score, "acc": float(correct)}
