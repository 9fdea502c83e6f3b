"""MOPD in a plain PyTorch loop: a tiny causal LM learns a task on its own samples from a tiny teacher.

No verl trainer, no Ray, no GPU: the loss pieces alone, as they sit in any training loop.

    L = L_PG + beta * token-mean( gate_i * K3(log p_teacher - log p_student) )

- task: continue a counting sequence mod 16 (prompt ``a, a+s, a+2s, a+3s``, s in {1, 2});
  reward = fraction of the continuation that is right, ``acc`` = 1 iff all of it is;
- teacher: a tiny Qwen3 LM trained on the task for a few seconds (supervised);
- student: the same architecture, random init, trained on its own rollouts (temperature 1);
- GRPO advantages by verl's ``compute_grpo_outcome_advantage`` (groups of ``--group`` rollouts);
- ``reward_gate``: KL off for every rollout of a group whose mean reward exceeds ``--tau``;
- ``mopd_kl_loss``: gated K3 on the sampled tokens, token-mean through verl's ``agg_loss``;
  the policy-gradient term is verl's ``agg_loss`` too.

    python examples/custom_trainer/pure_torch.py             # about 20 s on 2 CPU cores
    python examples/custom_trainer/pure_torch.py --beta 0    # GRPO alone, for comparison
"""

from __future__ import annotations

import argparse
import time

import numpy as np
import torch
from transformers import AutoModelForCausalLM, Qwen3Config
from verl.trainer.ppo.core_algos import agg_loss, compute_grpo_outcome_advantage

from verl_mopd.losses import mopd_kl_loss, reward_gate

MOD = 16            # tokens 0..15 are numbers
BOS = MOD           # token 16 starts every prompt
PROMPT_NUMBERS = 4
STEPS = (1, 2)


def tiny_lm(seed: int) -> torch.nn.Module:
    """A 2-layer Qwen3 causal LM over the 17-token vocabulary, random init (nothing downloaded)."""
    torch.manual_seed(seed)
    cfg = Qwen3Config(vocab_size=MOD + 1, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, head_dim=16, max_position_embeddings=32,
                      tie_word_embeddings=True, bos_token_id=BOS, eos_token_id=None, pad_token_id=None)
    return AutoModelForCausalLM.from_config(cfg, dtype=torch.float32)


def make_tasks(n: int, length: int, gen: torch.Generator) -> torch.Tensor:
    """(n, 1 + PROMPT_NUMBERS + length) token ids: BOS, then the whole counting sequence."""
    start = torch.randint(0, MOD, (n, 1), generator=gen)
    step = torch.tensor(STEPS)[torch.randint(0, len(STEPS), (n, 1), generator=gen)]
    numbers = (start + step * torch.arange(PROMPT_NUMBERS + length)) % MOD
    return torch.cat([torch.full((n, 1), BOS), numbers], dim=1)


def response_log_probs(model, seq: torch.Tensor, prompt_len: int) -> torch.Tensor:
    """(bs, response_len) log p(token) of every response token of ``seq`` under ``model``."""
    logits = model(input_ids=seq).logits[:, prompt_len - 1 : -1].float()
    return torch.log_softmax(logits, dim=-1).gather(-1, seq[:, prompt_len:, None]).squeeze(-1)


def task_reward(seq: torch.Tensor, tasks: torch.Tensor, prompt_len: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(bs,) reward = fraction of the continuation that is right, and acc = 1 iff all of it is."""
    right = (seq[:, prompt_len:] == tasks[:, prompt_len:]).float()
    return right.mean(-1), right.min(-1).values


@torch.no_grad()
def sample(model, prompts: torch.Tensor, length: int, gen: torch.Generator) -> torch.Tensor:
    """Append ``length`` tokens drawn from the model at temperature 1 (on-policy rollouts)."""
    seq = prompts
    for _ in range(length):
        probs = torch.softmax(model(input_ids=seq).logits[:, -1].float(), dim=-1)
        seq = torch.cat([seq, torch.multinomial(probs, 1, generator=gen)], dim=1)
    return seq


def train_teacher(steps: int, length: int, seed: int) -> torch.nn.Module:
    teacher = tiny_lm(seed + 1)
    opt = torch.optim.AdamW(teacher.parameters(), lr=3e-3)
    gen = torch.Generator().manual_seed(seed + 2)
    for _ in range(steps):
        seq = make_tasks(64, length, gen)
        loss = -response_log_probs(teacher, seq, 1).mean()  # every number after BOS
        opt.zero_grad()
        loss.backward()
        opt.step()
    return teacher.eval().requires_grad_(False)


def run(args: argparse.Namespace) -> list[dict]:
    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    gen = torch.Generator().manual_seed(args.seed)
    prompt_len, length = 1 + PROMPT_NUMBERS, args.length
    teacher = train_teacher(args.teacher_steps, length, args.seed)
    tasks = make_tasks(256, length, gen)
    reward, acc = task_reward(sample(teacher, tasks[:, :prompt_len], length, gen), tasks, prompt_len)
    print(f"teacher, sampled at temperature 1: reward {reward.mean():.3f}, acc {acc.mean():.2f}")
    student = tiny_lm(args.seed)
    opt = torch.optim.AdamW(student.parameters(), lr=args.lr)
    history = []
    print(f"{'step':>4} {'reward':>7} {'acc':>5} {'KL on':>6} {'K3':>7} {'loss':>8}")
    for step in range(args.steps):
        tasks = make_tasks(args.prompts, length, gen).repeat_interleave(args.group, dim=0)
        uids = np.repeat(np.arange(args.prompts), args.group)        # GRPO group of each rollout
        seq = sample(student, tasks[:, :prompt_len], length, gen)
        mask = torch.ones(len(seq), length)                           # (bs, response_len)

        reward, acc = task_reward(seq, tasks, prompt_len)             # (bs,)
        token_reward = torch.zeros_like(mask)
        token_reward[:, -1] = reward                                  # outcome reward on the last token
        advantages, _ = compute_grpo_outcome_advantage(token_reward, mask, uids,
                                                       norm_adv_by_std_in_grpo=False)
        gate = reward_gate(reward, uids, tau=args.tau)                # (bs,) 1 = KL on; whole groups

        logp = response_log_probs(student, seq, prompt_len)           # (bs, response_len)
        with torch.no_grad():
            teacher_logp = response_log_probs(teacher, seq, prompt_len)
        kl_loss, kl_metrics = mopd_kl_loss(logp, teacher_logp, mask, kl_mask=gate)
        ratio = torch.exp(logp - logp.detach())                       # 1, with the gradient of log p
        pg_loss = agg_loss(loss_mat=-advantages * ratio, loss_mask=mask, loss_agg_mode="token-mean")
        loss = pg_loss + args.beta * kl_loss
        opt.zero_grad()
        loss.backward()
        opt.step()

        row = {"step": step, "reward": reward.mean().item(), "acc": acc.mean().item(),
               "kl_on": gate.mean().item(), "k3": kl_metrics["mopd/k3_mean"], "loss": loss.item()}
        history.append(row)
        if step % args.log_every == 0 or step == args.steps - 1:
            print(f"{step:>4} {row['reward']:>7.3f} {row['acc']:>5.2f} {row['kl_on']:>6.2f} "
                  f"{row['k3']:>7.3f} {row['loss']:>8.4f}", flush=True)
    return history


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--steps", type=int, default=60, help="student RL steps")
    p.add_argument("--teacher-steps", type=int, default=300, help="teacher supervised steps")
    p.add_argument("--prompts", type=int, default=8, help="prompts per step")
    p.add_argument("--group", type=int, default=4, help="rollouts per prompt (GRPO group)")
    p.add_argument("--length", type=int, default=6, help="response tokens")
    p.add_argument("--beta", type=float, default=1.0, help="weight of the K3 term (UI-MOPD uses 0.01)")
    p.add_argument("--tau", type=float, default=0.5, help="KL off for groups whose mean reward exceeds this")
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--log-every", type=int, default=5)
    p.add_argument("--threads", type=int, default=1, help="torch threads (tiny tensors: 1 is fastest)")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> list[dict]:
    start, cpu_start = time.perf_counter(), time.process_time()
    history = run(parse_args(argv))
    k = max(1, len(history) // 5)

    def mean(key, part):
        return float(np.mean([r[key] for r in part]))

    first, last = history[:k], history[-k:]
    print(f"mean of the first {k} -> last {k} steps: K3 {mean('k3', first):.3f} -> {mean('k3', last):.3f}, "
          f"reward {mean('reward', first):.3f} -> {mean('reward', last):.3f}, "
          f"KL on {mean('kl_on', first):.2f} -> {mean('kl_on', last):.2f}")
    print(f"{time.perf_counter() - start:.1f} s wall, {time.process_time() - cpu_start:.1f} s CPU "
          f"({torch.get_num_threads()} threads)")
    return history


if __name__ == "__main__":
    main()
