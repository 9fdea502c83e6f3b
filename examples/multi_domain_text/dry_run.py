"""One driver step of the multi-domain run on CPU: reward -> reward gate -> routing to three teachers.

No model: a simulated student answers the generated prompts (its skill differs by domain), and
everything after that is the code the trainer runs: this example's reward, verl-mopd's gate
(``verl_mopd.trainer.gate.compute_reward_gate``, whole GRPO groups, per-domain metrics) and router
(``verl_mopd.teachers.router``: split by the ``domain`` column, refusing values with no teacher,
merge back in batch order), with the teachers and keys of ``recipe.yaml``.

    python examples/multi_domain_text/make_data.py && python examples/multi_domain_text/dry_run.py
"""

from __future__ import annotations

import argparse
import importlib.util
import random
import sys
from pathlib import Path

import torch
from tensordict import NonTensorStack, TensorDict

HERE = Path(__file__).parent
#: probability that the simulated student answers a prompt of each domain correctly
SKILL = {"arithmetic": 0.85, "strings": 0.4, "sorting": 0.1}


def _reward_module():
    spec = importlib.util.spec_from_file_location("multi_domain_reward", HERE / "reward.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def simulated_response(answer: str, domain: str, rng: random.Random) -> str:
    """Right with probability ``SKILL[domain]``; else a wrong answer or (1 in 4) no answer line."""
    if rng.random() < SKILL[domain]:
        return f"<think>...</think>\nAnswer: {answer}"
    return "<think>...</think>\nI am not sure." if rng.random() < 0.25 else f"Answer: {answer}0"


def recipe_mopd_and_teachers():
    """recipe.yaml composed as verl would (hydra + verl-mopd's defaults): its ``mopd`` block, and
    ``{domain: model_path}`` of the teachers it declares in verl's ``distillation.teacher_models``."""
    from verl_mopd.checks.recipe_cli import compose_recipe
    from verl_mopd.checks.validate import run_teachers
    from verl_mopd.config import MOPDConfig

    config = compose_recipe(str(HERE / "recipe.yaml"))
    mopd = MOPDConfig.from_mapping(config.mopd)  # the whole mopd block: the gate and the routing key
    return mopd, {domain: t.model_path for domain, t in run_teachers(config, mopd).items()}


def step_batch(rows: list[dict], n: int, seed: int) -> tuple[TensorDict, list[dict]]:
    """The step's samples as the trainer stores them: ``n`` rollouts per prompt, a ``uid`` per group."""
    compute_score = _reward_module().compute_score
    rng = random.Random(seed)
    uids, domains, acc, lengths, rewards = [], [], [], [], []
    for i, row in enumerate(rows):
        truth = row["reward_model"]["ground_truth"]
        for _ in range(n):
            text = simulated_response(truth, row["domain"], rng)
            result = compute_score(row["data_source"], text, truth, row["extra_info"])
            uids.append(f"prompt{i}")
            domains.append(row["domain"])
            acc.append(result["acc"])
            rewards.append(result)
            lengths.append(len(text.split()))
    data = TensorDict({
        "uid": NonTensorStack(*uids),
        "domain": NonTensorStack(*domains),
        "acc": torch.tensor(acc),
        "response_mask": torch.nested.as_nested_tensor([torch.ones(k, dtype=torch.int64) for k in lengths],
                                                       layout=torch.jagged),
    }, batch_size=len(uids))
    return data, rewards


def main(argv: list[str] | None = None) -> dict:
    import pyarrow.parquet as pq

    from verl_mopd.losses import KL_MASK_KEY
    from verl_mopd.teachers.router import merge, routing_keys, split
    from verl_mopd.trainer.gate import compute_reward_gate

    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--data", default=str(HERE / "data" / "train.parquet"), help="make_data.py output")
    p.add_argument("--prompts", type=int, default=48, help="prompts in the step (recipe: train_batch_size)")
    p.add_argument("--n", type=int, default=8, help="rollouts per prompt (recipe: rollout.n)")
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    if not Path(args.data).is_file():
        sys.exit(f"{args.data} not found: run python examples/multi_domain_text/make_data.py first")

    mopd, teachers = recipe_mopd_and_teachers()
    rows = pq.read_table(args.data).slice(0, args.prompts).to_pylist()
    data, _ = step_batch(rows, args.n, args.seed)

    fields, metrics = compute_reward_gate(mopd, data)
    gate = fields[KL_MASK_KEY]                                     # (bs,) per sample, from whole groups
    domains = routing_keys(data, mopd.routing_key)             # (bs,) the routing column
    routed = split(domains, known=list(teachers), field=mopd.routing_key)  # refuses a domain without a teacher
    # each teacher's output comes back to its own rows (here the "teacher output" is the row index)
    outputs = {d: torch.as_tensor(rows_d, dtype=torch.float32) for d, rows_d in routed.items()}
    back = merge(outputs, routed, len(domains))
    assert back.tolist() == list(range(len(domains)))

    print(f"one step: {args.prompts} prompts x {args.n} rollouts, routed by `{mopd.routing_key}`; "
          f"gate on {mopd.gate_metric}: K3 off for groups with mean > tau_kl={mopd.tau_kl}")
    print(f"{'domain':<11} {'teacher':<32} {'rollouts':>8} {'acc':>5} {'KL on':>6}")
    summary = {}
    for d, model_path in teachers.items():
        rows_d = torch.as_tensor(domains == d)
        summary[d] = {"rollouts": len(routed.get(d, ())), "acc": float(data["acc"][rows_d].mean()),
                      "kl_on": metrics[f"mopd/kl_mask_on_fraction/{d}"]}
        s = summary[d]
        print(f"{d:<11} {model_path[-32:]:<32} {s['rollouts']:>8} {s['acc']:>5.2f} "
              f"{s['kl_on']:>6.2f}")
    print(f"{'all':<11} {'':<32} {len(domains):>8} {float(data['acc'].mean()):>5.2f} "
          f"{float(gate.mean()):>6.2f}")
    return summary


if __name__ == "__main__":
    main()
