"""Reward of the one-GPU smoke run (verl's custom reward function hook).

The smoke's tiny random student never solves a task, so the real reward would give every group the
same mean and the reward gate would be all-on or all-off. This reward is fixed per prompt instead:
``acc = 1`` for prompts with ``index % 4`` in (0, 1), else 0. With ``data.shuffle=false`` and 4 prompts
a step, every step has, per platform, one GRPO group whose KL the gate switches off (mean acc 1 > tau)
and one it keeps on (mean acc 0), so both teachers score and the gate fraction is strictly in (0, 1).
"""


def smoke_score(data_source, solution_str, ground_truth, extra_info=None, **kwargs):
    acc = float(int((extra_info or {})["index"]) % 4 in (0, 1))
    return {"score": acc, "acc": acc}
