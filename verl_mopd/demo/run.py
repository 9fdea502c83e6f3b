"""The UI-MOPD demo on CPU: both stages, every baseline, several seeds, on tiny local models.

- stage 0, the pretrained bases (the paper's Qwen3-VL-32B / -8B), shared by every seed: a
  ``teacher_size`` teacher base and a ``size`` student base, each trained from random init on
  fresh tasks of a platform mix (``pretrain_mobile_share``) for a few steps only, so that both are
  part-way through learning to click (the student base more so than the bigger teacher base) and
  every stage-2 method has room to improve on both platforms;
- stage 1 (per seed): finite, imbalanced per-platform SFT corpora (``sft_desktop`` :
  ``sft_mobile``; the paper's Uni-GUI is ~2 : 1); one teacher per platform, each fine-tuned from
  the ONE shared teacher base on its platform's corpus;
- stage 2 (per seed): the student base trained with GRPO + routed teachers + gated ``mopd_k3`` on
  separate RL prompts (disjoint from the corpora and the eval set; their ground truth is used only
  by the reward);
- baselines (per seed): GRPO without the KL term (same prompts and sampling seeds: common random
  numbers), mixed SFT of the student base on the union of the corpora (the stage-1 recipe: as many
  SFT steps as the two teachers together, at their lr and batch),
  and the weight average and TIES merge of the two teachers (``verl_mopd.eval.merge``);
- greedy eval of every model on the same held-out ``eval_tasks`` tasks per platform (fixed, the
  same for every seed).

The seeds run in parallel processes (one torch thread each); the driver reports mean +- standard
error over seeds per platform and the paired differences MOPD - X per seed.

Why a loop of its own: verl 0.9.1's trainer cannot start without GPUs (GPU-only resource pools,
engines registered for cuda/npu, rollout servers only). So this short loop drives the same
components a real run uses, and calls verl's functions wherever verl has one:

- rollouts: ``transformers`` ``generate`` (``do_sample``, temperature 1.0, full distribution);
- reward: ``verl_mopd.rewards.compute_score`` (strict mode: +1 correct, -0.5 partial, -1 invalid);
- advantages: verl's ``compute_grpo_outcome_advantage``;
- gate: ``verl_mopd.losses.reward_gate`` over whole GRPO groups (``MOPDConfig``);
- teachers: ``PlatformTeacherGroup`` (``hf`` backend workers on a local Ray cluster), which splits
  the batch by ``platform`` with the router, scores each part with its platform's teacher and
  merges back in order; or, with ``teachers="local"``, the hf backend's ``score_rows`` in-process
  through the same router ``split`` / ``merge`` (no Ray start-up);
- loss: verl's ``distillation_ppo_loss`` with ``loss_mode=mopd_k3`` (PG + beta * K3) on the
  TensorDict micro-batch layout verl's engines pass (nested, ``no_padding_2_padding``); the no-KL
  baseline uses verl's ``ppo_loss`` on the same batch. Each MOPD step also takes verl's
  ``ppo_loss`` gradient alone, to log ``grad_ratio = beta*|grad K3| / |grad PG|``;
- merges: ``verl_mopd.eval.merge.merge_checkpoints`` (average; TIES over the shared teacher base).

One optimizer step per rollout batch (on-policy: ``old_log_probs`` are the current policy's), one
micro-batch: a demonstration and an integration test, not a second trainer.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import shutil
import time
import warnings
from collections import defaultdict
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import torch

from verl_mopd.demo.models import SIZES, build_model, build_tokenizer
from verl_mopd.demo.tasks import INTENTS, Task, make_tasks, sample_tasks
from verl_mopd.errors import UsageError
from verl_mopd.rewards import compute_score

__all__ = [
    "DemoConfig", "Policy", "run", "run_seed", "sft", "evaluate", "rl", "TeacherScorer", "METRIC_FIELDS",
    "MODELS", "aggregate", "comparison_table", "difference_table",
]

PLATFORMS = ("desktop", "mobile")
#: every per-step record of ``metrics.jsonl`` has these keys
METRIC_FIELDS = (
    "run", "seed", "step", "time_s", "loss", "pg_loss", "mask_on_fraction", "grad_ratio",
    *[f"{k}/{p}" for k in ("reward", "acc", "k3", "teacher_samples") for p in PLATFORMS],
)
#: the models every seed evaluates, in table order
MODELS = ("teacher:desktop", "teacher:mobile", "teacher base", "student base", "MOPD student", "GRPO, no KL",
          "mixed SFT", "weight average", "TIES")
#: the baselines MOPD is compared with, paired per seed
BASELINES = ("GRPO, no KL", "mixed SFT", "weight average", "TIES", "student base")
#: the fixed held-out eval set (the same tasks for every seed and method)
EVAL_SEED = 999_999
_STREAMS = {"teacher_init": 1, "student_init": 2, "teacher_base_data": 3, "student_base_data": 4,
            "sft:desktop": 5, "sft:mobile": 6, "teacher:desktop": 7, "teacher:mobile": 8, "mixed": 9,
            "rl_prompts": 10, "rollout": 11}  # the data roles: each draws its own seeds


def _seed(seed: int, stream: str, step: int = 0) -> int:
    """An independent 31-bit seed per (run seed, data role, step)."""
    return int(np.random.SeedSequence([seed, _STREAMS[stream], step]).generate_state(1)[0] >> 1)


@dataclass
class DemoConfig:
    """Sizes and knobs of the demo (defaults: the full demo, 3 seeds).

    seeds / seed: how many seeds, from ``seed`` on; workers: parallel processes (0: one per seed
        with ``teachers=local``, 1 with ``teachers=ray``); threads: torch threads per process.
    base_seed: seed of the two pretrained bases, which every seed shares (the paper's two
        Qwen3-VL checkpoints); pretrain_mobile_share: mobile share of their pretraining mix;
        teacher_base_steps / base_steps, teacher_pretrain_lr / pretrain_lr: their pretraining
        (constant lr, no warm-up, decay or clip: a warm-up + decay-to-0 schedule stalls the tiny
        base before it learns to copy coordinates).
    sft_desktop / sft_mobile: sizes of the finite stage-1 corpora; teacher_steps: each teacher's
        SFT steps on its corpus (passes over it, reshuffled); sft_lr: the stage-1 fine-tuning lr
        of the teachers and mixed SFT (a converged base fine-tuned at its pretraining lr can
        collapse in a few Adam steps).
    steps: stage-2 RL steps (MOPD and the no-KL GRPO baseline), ``prompts_per_step`` x
        ``rollout_n`` rollouts each (GRPO groups of ``rollout_n``).
    mixed_sft_steps: SFT steps of the mixed-SFT baseline on the union of the corpora (``sft_batch``
        samples at ``sft_lr``); 0 = the stage-1 budget, ``2 * teacher_steps`` (as many samples as
        the two teachers together), which is the paper's baseline: the stage-1 recipe on the
        mixed data. ``mixed_sft_steps = steps`` gives it as many optimizer steps as RL instead.
    beta: ``distillation_loss_coef`` (0.3: chosen by the logged sweep in the README; the paper's
        0.01 makes the K3 term ~2% of the update at this scale); tau_kl / gate_metric: the gate.
    eval_tasks: held-out tasks PER PLATFORM, the same for every seed and model.
    teachers: ``local`` (router + hf ``score_rows`` in-process) or ``ray`` (PlatformTeacherGroup,
        hf workers on local Ray).
    max_new_tokens: 32 fits the longest target (mobile ``swipe``: 31 tokens + ``<eos>``).
    out: output folder; bases: folder of the pretrained bases (default ``<out>/bases``), reused
        when their knobs match, so runs that differ only in stage-1/2 knobs can share them.
    """

    seeds: int = 3
    seed: int = 0
    base_seed: int = 0
    pretrain_mobile_share: float = 0.6
    teacher_base_steps: int = 80
    base_steps: int = 80
    sft_desktop: int = 128
    sft_mobile: int = 64
    teacher_steps: int = 20
    steps: int = 250
    mixed_sft_steps: int = 0
    prompts_per_step: int = 16
    rollout_n: int = 4
    sft_batch: int = 64
    pretrain_lr: float = 5e-3
    teacher_pretrain_lr: float = 3e-3
    sft_lr: float = 1e-3
    rl_lr: float = 1e-3
    beta: float = 0.3
    tau_kl: float = 0.5
    gate_metric: str = "acc"
    size: str = "tiny"
    teacher_size: str = "small"
    ties_density: float = 0.5
    eval_tasks: int = 512
    max_new_tokens: int = 32
    teachers: str = "local"
    baselines: bool = True
    workers: int = 0
    threads: int = 1
    log_every: int = 10
    out: str = "mopd_demo"
    bases: str = ""
    plot: bool = True

    def __post_init__(self):
        for name in ("seeds", "teacher_base_steps", "base_steps", "sft_desktop", "sft_mobile", "teacher_steps", "steps",
                     "mixed_sft_steps", "prompts_per_step", "rollout_n", "sft_batch", "eval_tasks", "max_new_tokens",
                     "threads", "log_every", "workers", "seed", "base_seed"):
            v = getattr(self, name)
            low = 0 if name.endswith("steps") or name in ("workers", "seed", "base_seed") else 1
            if not isinstance(v, int) or isinstance(v, bool) or v < low:
                raise ValueError(f"demo.{name}={v!r}: must be an integer >= {low}")
        if self.rollout_n < 2:
            raise ValueError(f"demo.rollout_n={self.rollout_n}: GRPO needs >= 2 rollouts per prompt")
        if self.prompts_per_step % 2:
            raise ValueError(f"demo.prompts_per_step={self.prompts_per_step}: must be even (both platforms)")
        if self.teachers not in ("ray", "local"):
            raise ValueError(f"demo.teachers={self.teachers!r}: allowed 'ray', 'local'")
        if self.teachers == "ray" and self.workers > 1:
            raise ValueError(f"demo.workers={self.workers} with teachers='ray': the Ray teacher group runs "
                             "in one driver process; use workers=1 (seeds run one after another) or teachers='local'")
        for name in ("size", "teacher_size"):
            if getattr(self, name) not in SIZES:
                raise ValueError(f"demo.{name}={getattr(self, name)!r}: allowed {sorted(SIZES)}")
        if self.gate_metric not in ("acc", "score"):
            raise ValueError(f"demo.gate_metric={self.gate_metric!r}: allowed 'acc', 'score'")
        for name in ("pretrain_lr", "teacher_pretrain_lr", "sft_lr", "rl_lr", "beta", "tau_kl"):
            v = getattr(self, name)
            if not isinstance(v, (int, float)) or not math.isfinite(v) or v < 0 or (name.endswith("lr") and v == 0):
                raise ValueError(f"demo.{name}={v!r}: must be a finite number "
                                 f"{'> 0' if name.endswith('lr') else '>= 0'}")
        if not 0.0 <= self.pretrain_mobile_share <= 1.0:
            raise ValueError(f"demo.pretrain_mobile_share={self.pretrain_mobile_share!r}: must be in [0, 1]")
        if not 0.0 < self.ties_density <= 1.0:
            raise ValueError(f"demo.ties_density={self.ties_density!r}: must be in (0, 1]")

    @property
    def mixed_steps(self) -> int:
        """SFT steps of the mixed-SFT baseline (``mixed_sft_steps``, or the stage-1 budget)."""
        return self.mixed_sft_steps or 2 * self.teacher_steps

    @property
    def n_workers(self) -> int:
        if self.teachers == "ray":
            return 1
        return min(self.seeds, self.workers or self.seeds)


# ------------------------------------------------------------------------------ model + data


class Policy:
    """A causal LM with the demo tokenizer: encode tasks, sample / greedy-decode tool calls."""

    def __init__(self, model, tokenizer):
        self.model, self.tok = model, tokenizer

    def prompt_ids(self, tasks: list[Task]) -> list[torch.Tensor]:
        return [torch.tensor(self.tok(t.prompt)["input_ids"]) for t in tasks]

    def target_ids(self, tasks: list[Task]) -> list[torch.Tensor]:
        return [torch.tensor(self.tok(t.target)["input_ids"] + [self.tok.eos_token_id]) for t in tasks]

    @torch.no_grad()
    def generate(self, tasks: list[Task], max_new_tokens: int, sample: bool) -> tuple[list, list]:
        """``(prompt ids, response ids)`` per task; a response ends at its first ``<eos>`` (kept)."""
        prompts = self.prompt_ids(tasks)
        width = max(len(p) for p in prompts)
        ids = torch.full((len(prompts), width), self.tok.pad_token_id)
        mask = torch.zeros_like(ids)
        for i, p in enumerate(prompts):  # left-padded, as verl's rollout batches
            ids[i, width - len(p):], mask[i, width - len(p):] = p, 1
        self.model.eval()
        out = self.model.generate(
            input_ids=ids, attention_mask=mask, max_new_tokens=max_new_tokens, do_sample=sample,
            temperature=1.0 if sample else None, top_k=0 if sample else None, top_p=1.0 if sample else None,
            pad_token_id=self.tok.pad_token_id, eos_token_id=self.tok.eos_token_id,
        )[:, width:]
        responses = []
        for row in out:
            eos = (row == self.tok.eos_token_id).nonzero()
            responses.append(row[: int(eos[0]) + 1] if len(eos) else row)
        return prompts, responses

    def decode(self, response: torch.Tensor) -> str:
        return self.tok.decode(response.tolist(), skip_special_tokens=True)


def sequence_log_probs(model, prompts: list[torch.Tensor], responses: list[torch.Tensor]) -> list[torch.Tensor]:
    """Per sample, the ``(L_i,)`` log-probs over the full sequence where position p holds
    ``log p(token p+1)`` (the last position 0): the layout of verl's ``model_output["log_probs"]``."""
    seqs = [torch.cat([p, r]) for p, r in zip(prompts, responses, strict=True)]
    width = max(len(s) for s in seqs)
    ids = torch.zeros(len(seqs), width, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for i, s in enumerate(seqs):  # right-padded: exact for a causal LM
        ids[i, : len(s)], mask[i, : len(s)] = s, 1
    logits = model(input_ids=ids, attention_mask=mask, use_cache=False).logits.float()
    logp = torch.log_softmax(logits[:, :-1], -1).gather(-1, ids[:, 1:, None])[..., 0]
    return [torch.cat([logp[i, : len(s) - 1], logp.new_zeros(1)]) for i, s in enumerate(seqs)]


def corpus_batches(tasks: list[Task], batch: int, steps: int, seed: int) -> list[list[Task]]:
    """``steps`` batches over a finite corpus: passes over it, reshuffled each pass (the last batch
    of a pass may be short), as many as ``steps`` needs."""
    if not tasks:
        raise ValueError("corpus_batches: the corpus is empty")
    rng = np.random.default_rng(seed)
    out = []
    while len(out) < steps:
        order = rng.permutation(len(tasks))
        out += [[tasks[i] for i in order[s : s + batch]] for s in range(0, len(tasks), batch)]
    return out[:steps]


def sft(policy: Policy, batches, lr: float) -> list[float]:
    """Plain cross-entropy on the target tokens of each batch of tasks, torch AdamW at a constant
    ``lr`` (no warm-up, decay or grad clip). Returns the per-step losses."""
    opt = torch.optim.AdamW(policy.model.parameters(), lr=lr, weight_decay=0.0)
    losses = []
    policy.model.train()
    for tasks in batches:
        prompts, targets = policy.prompt_ids(tasks), policy.target_ids(tasks)
        logps = sequence_log_probs(policy.model, prompts, targets)
        loss = torch.cat([-lp[len(p) - 1 : -1] for lp, p in zip(logps, prompts, strict=True)]).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses


def score(tasks: list[Task], texts: list[str]) -> list[dict]:
    """``compute_score`` (strict) of each decoded response against its task's ground truth."""
    return [compute_score("demo", text, t.ground_truth, mode="strict") for t, text in zip(tasks, texts, strict=True)]


def evaluate(policy: Policy, tasks: list[Task], max_new_tokens: int, batch: int = 256) -> dict:
    """Greedy decoding on ``tasks``: ``{platform: {"reward", "acc", "intents": {intent: acc}}}`` (means)."""
    results = []
    for s in range(0, len(tasks), batch):
        _, responses = policy.generate(tasks[s : s + batch], max_new_tokens, sample=False)
        results += score(tasks[s : s + batch], [policy.decode(r) for r in responses])
    out = {}
    for p in PLATFORMS:
        rs = [(r, t) for r, t in zip(results, tasks, strict=True) if t.platform == p]
        if rs:
            out[p] = {"reward": float(np.mean([r["score"] for r, _ in rs])),
                      "acc": float(np.mean([r["acc"] for r, _ in rs])),
                      "intents": {i: float(np.mean([r["acc"] for r, t in rs if t.intent == i]))
                                  for i in INTENTS if any(t.intent == i for _, t in rs)}}
    return out


# ------------------------------------------------------------------------------ teachers


class TeacherScorer:
    """The platform teachers behind one call: ``score(batch) -> (teacher_logprobs (bs, R), metrics)``.

    ``mode="ray"``: verl_mopd's ``PlatformTeacherGroup`` (one ``hf`` worker group per platform on a
    local Ray cluster). ``mode="local"``: the same router ``split``/``merge`` around the hf backend's
    ``score_rows`` in this process. Both record which platforms each call sent to each teacher.
    """

    def __init__(self, paths: dict[str, str], mode: str, threads: int = 1):
        from verl_mopd.config import MOPDConfig

        self.mode = mode
        self.config = MOPDConfig.from_mapping({"skip_gated": False, "teachers": {
            p: {"model_path": path, "backend": "hf", "device": "cpu", "dtype": "float32", "micro_batch_tokens": 4096}
            for p, path in paths.items()}})
        self.queried: dict[str, list[str]] = defaultdict(list)  # teacher -> platforms of the rows it scored
        self._started_ray = False
        if mode == "ray":
            import ray

            from verl_mopd.teachers.group import PlatformTeacherGroup

            if not ray.is_initialized():
                ray.init(num_cpus=len(paths), include_dashboard=False, log_to_driver=False,
                         runtime_env={"env_vars": {"OMP_NUM_THREADS": str(threads)}})
                self._started_ray = True
            self.group = PlatformTeacherGroup.build(self.config, use_gpu=False, num_threads=threads)
        else:
            from transformers import AutoModelForCausalLM

            self.models = {p: AutoModelForCausalLM.from_pretrained(path).eval() for p, path in paths.items()}

    def score(self, batch) -> tuple[torch.Tensor, dict]:
        """``batch``: verl DataProto (padded layout, ``platform`` column). Returns (bs, R) log-probs."""
        from verl_mopd.teachers.router import routing_keys

        keys = routing_keys(batch)
        if self.mode == "ray":
            logp, metrics = self.group.compute_teacher_logprobs(batch)
            for p in self.config.platforms:  # the group scores platform p's rows with teacher p only
                self.queried[p] += [p] * int(metrics[f"mopd_teacher/{p}/scored_samples"])
            return logp, {p: metrics[f"mopd_teacher/{p}/samples"] for p in self.config.platforms}
        from verl_mopd.teachers.backends.hf import pack_like_old_log_probs, rows_from_batch, score_rows
        from verl_mopd.teachers.router import merge, split, take_rows

        index = split(keys, known=self.config.platforms)
        parts = {}
        for p, rows in index.items():
            sub = take_rows(batch, rows)
            self.queried[p] += list(routing_keys(sub))
            scored, width = rows_from_batch(sub)
            with torch.no_grad():
                parts[p] = pack_like_old_log_probs(score_rows(self.models[p], scored, 4096), width)
        return merge(parts, index, len(keys)), {p: float(len(index.get(p, ()))) for p in self.config.platforms}

    def close(self):
        if self._started_ray:
            import ray

            ray.shutdown()


# ------------------------------------------------------------------------------ stage 2


def _nested(rows):
    return torch.nested.as_nested_tensor(rows, layout=torch.jagged)


def _pad(rows: list[torch.Tensor], width: int, value=0) -> torch.Tensor:
    out = torch.full((len(rows), width), value, dtype=rows[0].dtype)
    for i, r in enumerate(rows):
        out[i, : len(r)] = r
    return out


def _grad_norm(grads) -> float:
    return float(torch.sqrt(sum((g.double() ** 2).sum() for g in grads if g is not None)))


def rl_step(policy, opt, tasks, cfg: DemoConfig, scorer: TeacherScorer | None, rng_seed: int) -> dict:
    """One GRPO(+MOPD) step on ``tasks`` (each repeated ``rollout_n`` times). Returns the step's metrics.

    ``scorer=None`` is the no-KL baseline (verl's ``ppo_loss``); otherwise verl's
    ``distillation_ppo_loss`` with ``mopd_k3`` and the reward gate. For MOPD the step also takes the
    gradient of verl's ``ppo_loss`` alone: ``grad_ratio = |g_total - g_PG| / |g_PG|`` is
    ``beta*|grad K3| / |grad PG|`` (nan when no group has reward variance, so ``g_PG = 0``).
    """
    from verl.protocol import DataProto
    from verl.trainer.distillation.losses import distillation_ppo_loss
    from verl.trainer.ppo.core_algos import compute_grpo_outcome_advantage
    from verl.utils import tensordict_utils as tu
    from verl.workers.config import ActorConfig, DistillationConfig
    from verl.workers.utils.losses import ppo_loss

    from verl_mopd.config import MOPDDistillationLossConfig
    from verl_mopd.config import MOPDConfig
    from verl_mopd.losses import k3_kl, reward_gate

    rollouts = [t for t in tasks for _ in range(cfg.rollout_n)]
    uids = np.array([f"g{i // cfg.rollout_n}" for i in range(len(rollouts))], dtype=object)
    platforms = np.array([t.platform for t in rollouts], dtype=object)
    torch.manual_seed(rng_seed)
    prompts, responses = policy.generate(rollouts, cfg.max_new_tokens, sample=True)
    results = score(rollouts, [policy.decode(r) for r in responses])
    scores = torch.tensor([r["score"] for r in results], dtype=torch.float32)
    acc = torch.tensor([r["acc"] for r in results], dtype=torch.float32)

    R = max(len(r) for r in responses)
    response_mask = _pad([torch.ones(len(r), dtype=torch.long) for r in responses], R)
    token_rewards = torch.zeros(len(rollouts), R)
    token_rewards[torch.arange(len(rollouts)), response_mask.sum(-1) - 1] = scores  # outcome at the last token
    advantages, _ = compute_grpo_outcome_advantage(token_rewards, response_mask, uids)

    policy.model.train()
    logps = sequence_log_probs(policy.model, prompts, responses)
    resp_slice = [slice(len(p) - 1, len(p) - 1 + len(r)) for p, r in zip(prompts, responses, strict=True)]
    old = [lp.detach()[s] for lp, s in zip(logps, resp_slice, strict=True)]
    fields = {
        "prompts": _nested(prompts), "responses": _nested(responses),
        "response_mask": _nested([torch.ones(len(r), dtype=torch.long) for r in responses]),
        "old_log_probs": _nested(old),
        "advantages": _nested([advantages[i, : len(r)] for i, r in enumerate(responses)]),
    }
    actor = ActorConfig(strategy="fsdp", ppo_mini_batch_size=len(tasks), ppo_micro_batch_size_per_gpu=len(rollouts),
                        rollout_n=cfg.rollout_n)
    metrics = ({f"k3/{p}": float("nan") for p in PLATFORMS} | {f"teacher_samples/{p}": 0.0 for p in PLATFORMS}
               | {"grad_ratio": float("nan"), "mask_on_fraction": 0.0})
    if scorer is not None:
        gate_cfg = MOPDConfig(tau_kl=cfg.tau_kl, gate_metric=cfg.gate_metric)
        gate = reward_gate(acc if gate_cfg.gate_metric == "acc" else scores, uids, gate_cfg.tau_kl)
        P = max(len(p) for p in prompts)
        seqs = [torch.cat([p, r]) for p, r in zip(prompts, responses, strict=True)]
        input_ids = torch.stack([torch.cat([torch.zeros(P - len(p), dtype=torch.long), s, torch.zeros(R - len(r), dtype=torch.long)])
                                 for p, r, s in zip(prompts, responses, seqs, strict=True)])
        attention_mask = torch.cat([_pad([torch.ones(len(p), dtype=torch.long).flip(0) for p in prompts], P).flip(1),
                                    response_mask], dim=1)
        old_padded = _pad(old, R, 0.0)
        batch = DataProto.from_dict(
            tensors={"input_ids": input_ids, "attention_mask": attention_mask, "responses": input_ids[:, P:],
                     "response_mask": response_mask, "old_log_probs": old_padded, "mopd_kl_mask": gate},
            non_tensors={"platform": platforms})
        teacher, sent = scorer.score(batch)  # (bs, R), 0.0 after each response
        with torch.no_grad():
            k3 = k3_kl(old_padded, teacher) * response_mask
        for p in PLATFORMS:
            rows = torch.as_tensor(platforms == p)
            metrics[f"k3/{p}"] = float(k3[rows].sum() / response_mask[rows].sum().clamp_min(1))
            metrics[f"teacher_samples/{p}"] = float(sent.get(p, 0.0))
        # verl's layout: teacher log-probs over the full sequence, (L_i, 1), at the student's positions
        full = [torch.zeros(len(lp)) for lp in logps]
        for f, s, t, r in zip(full, resp_slice, teacher, responses, strict=True):
            f[s] = t[: len(r)]
        fields["teacher_logprobs"] = _nested([f.unsqueeze(-1) for f in full])
        fields["mopd_kl_mask"] = gate
        metrics["mask_on_fraction"] = float(gate.mean())
    data = tu.get_tensordict(fields)
    tu.assign_non_tensor(data, dp_size=1, batch_num_tokens=int(response_mask.sum()), global_batch_size=len(rollouts))
    model_output = {"log_probs": torch.nested.nested_tensor_from_jagged(
        torch.cat(logps), torch.tensor([0] + [len(lp) for lp in logps]).cumsum(0))}
    params = [p for p in policy.model.parameters() if p.requires_grad]
    opt.zero_grad()
    if scorer is not None:
        pg_only, _ = ppo_loss(actor, model_output, data)
        g_pg = torch.autograd.grad(pg_only, params, retain_graph=True, allow_unused=True)
        dist = DistillationConfig(enabled=False, distillation_loss=MOPDDistillationLossConfig(
            distillation_loss_coef=cfg.beta))
        loss, loss_metrics = distillation_ppo_loss(actor, dist, model_output=model_output, data=data)
        loss.backward()
        pg_norm = _grad_norm(g_pg)
        kl_norm = _grad_norm([p.grad - (g if g is not None else 0.0) for p, g in zip(params, g_pg, strict=True)
                              if p.grad is not None])
        metrics["grad_ratio"] = kl_norm / pg_norm if pg_norm > 0 else float("nan")
    else:
        loss, loss_metrics = ppo_loss(actor, model_output, data)
        loss.backward()
    opt.step()
    pg = loss_metrics.get("actor/pg_loss")
    metrics["loss"] = float(loss.detach())
    metrics["pg_loss"] = float(pg.values[0]) if pg is not None and hasattr(pg, "values") else metrics["loss"]
    for p in PLATFORMS:
        rows = torch.as_tensor(platforms == p)
        metrics[f"reward/{p}"] = float(scores[rows].mean())
        metrics[f"acc/{p}"] = float(acc[rows].mean())
    return metrics


def rl(policy, cfg: DemoConfig, scorer, name: str, seed: int, prompts, log) -> list[dict]:
    """``cfg.steps`` RL steps on ``prompts(step)``; one record per step. Rollout sampling seeds
    depend on (seed, step) only, so MOPD and GRPO draw with common random numbers."""
    opt = torch.optim.AdamW(policy.model.parameters(), lr=cfg.rl_lr, weight_decay=0.0)
    records, start = [], time.perf_counter()
    for step in range(cfg.steps):
        m = rl_step(policy, opt, prompts(step), cfg, scorer, rng_seed=_seed(seed, "rollout", step))
        rec = {"run": name, "seed": seed, "step": step + 1, "time_s": round(time.perf_counter() - start, 3)} | m
        records.append(rec)
        if (step + 1) % cfg.log_every == 0 or step == 0 or step + 1 == cfg.steps:
            log(_row(rec))
    return records


_HEADER = (f"{'run':<5} {'seed':>4} {'step':>4}  {'reward desk':>11} {'reward mob':>10}  {'K3 desk':>8} {'K3 mob':>8}  "
           f"{'mask on':>7}  {'grad ratio':>10}  {'loss':>8}")


def _row(r: dict) -> str:
    def f(v, spec):
        return format(v, spec) if v == v else "-".rjust(len(format(0.0, spec)))

    return (f"{r['run']:<5} {r['seed']:>4} {r['step']:>4}  {f(r['reward/desktop'], '+11.3f')} "
            f"{f(r['reward/mobile'], '+10.3f')}  {f(r['k3/desktop'], '8.4f')} {f(r['k3/mobile'], '8.4f')}  "
            f"{f(r['mask_on_fraction'], '7.2f')}  {f(r['grad_ratio'], '10.3f')}  {r['loss']:+8.4f}")


# ------------------------------------------------------------------------------ one seed


def _save(policy: Policy, path: Path) -> str:
    policy.model.save_pretrained(path)
    policy.tok.save_pretrained(path)
    return str(path)


def _load(path: str, tok) -> Policy:
    from transformers import AutoModelForCausalLM

    return Policy(AutoModelForCausalLM.from_pretrained(path).eval(), tok)


def _plural(n: int, one: str, many: str | None = None) -> str:
    """``1 seed``, ``3 seeds``."""
    return f"{n} {one if n == 1 else (many or one + 's')}"


def eval_set(n_per_platform: int) -> list[Task]:
    """The fixed held-out set: ``n_per_platform`` tasks per platform (alternating), seed ``EVAL_SEED``."""
    return make_tasks(2 * n_per_platform, seed=EVAL_SEED)


def _stamp(cfg: DemoConfig, role: str) -> dict:
    """What a pretrained base depends on: its knobs, the vocabulary and the first pretraining batch
    (so a change to the task definitions invalidates a cached base)."""
    size, steps = (cfg.teacher_size, cfg.teacher_base_steps) if role == "teacher" else (cfg.size, cfg.base_steps)
    first = sample_tasks(cfg.sft_batch, _seed(cfg.base_seed, f"{role}_base_data"), cfg.pretrain_mobile_share,
                         exclude=frozenset(t.prompt for t in eval_set(cfg.eval_tasks)))
    digest = hashlib.sha256(json.dumps([[t.prompt, t.target] for t in first]).encode()).hexdigest()[:16]
    lr = cfg.teacher_pretrain_lr if role == "teacher" else cfg.pretrain_lr
    return {"role": role, "size": size, "steps": steps, "lr": lr, "batch": cfg.sft_batch,
            "mobile_share": cfg.pretrain_mobile_share, "base_seed": cfg.base_seed, "eval_tasks": cfg.eval_tasks,
            "vocab": len(build_tokenizer()), "first_batch": digest}


def _stale_cache_message(path: Path, cached: dict, stamp: dict) -> str:
    knobs = {"size": "size/teacher_size", "steps": "base_steps/teacher_base_steps", "lr": "pretrain_lr",
             "batch": "sft_batch", "mobile_share": "pretrain_mobile_share"}
    differ = [f"{knobs.get(k, k)}: {cached.get(k)!r} there, {stamp.get(k)!r} now"
              for k in sorted(set(cached) | set(stamp)) if cached.get(k) != stamp.get(k)]
    return (f"--bases {path.parent}: the cached {stamp['role']} base in {path} was pretrained with other knobs "
            f"({'; '.join(differ)}); not overwriting it: give another --bases folder (or --out), "
            "or delete that folder to retrain")


def pretrain_base(cfg: DemoConfig, role: str, log=print) -> str:
    """Stage 0 for ``role`` (``teacher`` or ``student``): SFT from random init on fresh tasks of the
    ``pretrain_mobile_share`` platform mix, constant lr. Saved to ``{cfg.bases or cfg.out/bases}/{role}``; a base saved
    there with the same stamp (knobs, vocabulary, first batch) is reused. A base saved there with another
    stamp is never overwritten: a ``UsageError`` names the knobs that differ. The weights and the stamp
    are written to a temporary folder that is then renamed, so a folder with a stamp is always complete.
    Returns the folder."""
    torch.set_num_threads(cfg.threads)
    path = Path(cfg.bases or Path(cfg.out) / "bases") / role
    stamp = _stamp(cfg, role)
    if (path / "pretrain.json").exists():
        cached = json.loads((path / "pretrain.json").read_text())
        if cached == stamp:
            log(f"stage 0  {role} base: reusing {path}")
            return str(path)
        raise UsageError(_stale_cache_message(path, cached, stamp))
    t0 = time.perf_counter()
    tok = build_tokenizer()
    held = frozenset(t.prompt for t in eval_set(cfg.eval_tasks))
    policy = Policy(build_model(tok, stamp["size"], seed=_seed(cfg.base_seed, f"{role}_init")), tok)
    batches = (sample_tasks(cfg.sft_batch, _seed(cfg.base_seed, f"{role}_base_data", s), cfg.pretrain_mobile_share,
                            exclude=held) for s in range(stamp["steps"]))
    losses = sft(policy, batches, stamp["lr"])
    staging = path.parent / f".{role}.partial-{os.getpid()}"
    shutil.rmtree(staging, ignore_errors=True)
    _save(policy, staging)
    (staging / "pretrain.json").write_text(json.dumps(stamp, indent=2))
    shutil.rmtree(path, ignore_errors=True)  # a folder without a stamp: an interrupted older save
    os.replace(staging, path)
    log(f"stage 0  {role} base ({stamp['size']}): {stamp['steps']} steps, final loss "
        f"{losses[-1] if losses else float('nan'):.4f}, {time.perf_counter() - t0:.0f} s")
    return str(path)


def run_seed(cfg: DemoConfig, seed: int, bases: dict[str, str], log=print) -> dict:
    """Stages 1-2 and every baseline for one ``seed`` from the pretrained ``bases`` (``{"teacher",
    "student"}`` checkpoint folders); checkpoints under ``cfg.out/seed{seed}``.

    Returns ``{"seed", "eval": {model: {platform: {reward, acc, intents}}}, "records": [...],
    "teacher_queries": {teacher: {platform: rows}}, "stage_s": {...}, "cpu_s", "wall_s",
    "sft_sizes": {platform: n}, "sft_steps": {"teacher:<platform>" | "mixed SFT": n}}``.
    """
    from verl_mopd.eval.merge import MergeConfig, merge_checkpoints

    torch.set_num_threads(cfg.threads)
    wall0, cpu0 = time.perf_counter(), time.process_time()
    root = Path(cfg.out) / f"seed{seed}"
    tok = build_tokenizer()
    evals, stage_s, sft_steps = {}, {}, {}
    held_out = eval_set(cfg.eval_tasks)
    held = frozenset(t.prompt for t in held_out)

    def timed(name, t0):
        stage_s[name] = round(time.perf_counter() - t0, 2)

    def ev(name, policy):
        evals[name] = evaluate(policy, held_out, cfg.max_new_tokens)
        log(f"seed {seed}  {name:<16} " + "  ".join(
            f"{p} acc {evals[name][p]['acc']:.3f} reward {evals[name][p]['reward']:+.3f}" for p in PLATFORMS))

    # stage 1: finite, imbalanced per-platform corpora; one teacher per platform from the shared base
    t0 = time.perf_counter()
    corpora = {p: make_tasks(getattr(cfg, f"sft_{p}"), _seed(seed, f"sft:{p}"), platforms=(p,), exclude=held)
               for p in PLATFORMS}
    paths = {}
    for p in PLATFORMS:
        teacher = _load(bases["teacher"], tok)
        batches = corpus_batches(corpora[p], cfg.sft_batch, cfg.teacher_steps, _seed(seed, f"teacher:{p}"))
        losses = sft(teacher, batches, cfg.sft_lr)
        sft_steps[f"teacher:{p}"] = len(losses)
        paths[p] = _save(teacher, root / "teachers" / p)
        log(f"seed {seed}  stage 1 {p} teacher: {len(losses)} SFT steps on {len(corpora[p])} tasks, "
            f"final loss {losses[-1] if losses else float('nan'):.4f}")
    timed("teachers", t0)

    # stage 2: MOPD from the student base on separate RL prompts
    t0 = time.perf_counter()
    sft_prompts = frozenset(t.prompt for c in corpora.values() for t in c)
    rl_excluded = held | sft_prompts

    def prompts(step):
        return make_tasks(cfg.prompts_per_step, _seed(seed, "rl_prompts", step), exclude=rl_excluded)

    records = []
    scorer = TeacherScorer(paths, cfg.teachers, threads=1)
    try:
        log(f"seed {seed}  stage 2 MOPD: {cfg.steps} steps x {cfg.prompts_per_step} prompts x {cfg.rollout_n} "
            f"rollouts, beta={cfg.beta}, tau_kl={cfg.tau_kl} on {cfg.gate_metric}, teachers={cfg.teachers}")
        student = _load(bases["student"], tok)
        records += rl(student, cfg, scorer, "mopd", seed, prompts, log)
        queries = {t: {p: ps.count(p) for p in PLATFORMS} for t, ps in scorer.queried.items()}
    finally:
        scorer.close()
    timed("mopd", t0)

    # greedy evals (the held-out set is disjoint from every training stream by construction)
    t0 = time.perf_counter()
    for p in PLATFORMS:
        ev(f"teacher:{p}", _load(paths[p], tok))
    ev("teacher base", _load(bases["teacher"], tok))
    ev("MOPD student", student)
    ev("student base", _load(bases["student"], tok))
    timed("evals", t0)

    if cfg.baselines:
        t0 = time.perf_counter()
        grpo = _load(bases["student"], tok)
        records += rl(grpo, cfg, None, "grpo", seed, prompts, log)
        ev("GRPO, no KL", grpo)
        timed("grpo", t0)
        t0 = time.perf_counter()
        mixed = _load(bases["student"], tok)
        union = corpora["desktop"] + corpora["mobile"]
        batches = corpus_batches(union, cfg.sft_batch, cfg.mixed_steps, _seed(seed, "mixed"))
        sft_steps["mixed SFT"] = len(sft(mixed, batches, cfg.sft_lr))
        ev("mixed SFT", mixed)
        for method, name in (("average", "weight average"), ("ties", "TIES")):
            merged = root / "merged" / method
            merge_checkpoints(MergeConfig(method=method, models=(paths["desktop"], paths["mobile"]),
                                          base=bases["teacher"] if method == "ties" else None,
                                          density=cfg.ties_density), str(merged))
            ev(name, _load(str(merged), tok))
        timed("baselines", t0)

    return {"seed": seed, "eval": evals, "records": records, "teacher_queries": queries, "stage_s": stage_s,
            "sft_sizes": {p: len(c) for p, c in corpora.items()}, "sft_steps": sft_steps,
            "wall_s": time.perf_counter() - wall0, "cpu_s": time.process_time() - cpu0}


def _quiet():
    """Workers: no progress bars, and not verl's list of optional engines it cannot import on CPU."""
    import transformers

    transformers.utils.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()
    warnings.filterwarnings("ignore", message=".*engine is not available", category=UserWarning)
    warnings.filterwarnings("ignore", module="megatron")


def _pretrain_worker(cfg: DemoConfig, role: str) -> str:
    _quiet()
    return pretrain_base(cfg, role, log=lambda s: print(s, flush=True))


def _seed_worker(cfg: DemoConfig, seed: int, bases: dict[str, str]) -> dict:
    _quiet()
    return run_seed(cfg, seed, bases, log=lambda s: print(s, flush=True))


# ------------------------------------------------------------------------------ all seeds


def _tree_cpu() -> float:
    """CPU seconds of this process and of its reaped children (the seed workers), user + system."""
    import resource

    return sum(r.ru_utime + r.ru_stime for r in map(resource.getrusage, (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN)))


def _mean_se(v: list[float]) -> tuple[float, float]:
    a = np.asarray(v, dtype=float)
    return float(a.mean()), float(a.std(ddof=1) / math.sqrt(len(a))) if len(a) > 1 else float("nan")


def aggregate(per_seed: list[dict]) -> dict:
    """Mean and standard error over seeds, per model and platform, of ``acc`` and ``reward``; and
    the paired differences MOPD - X per seed (``{"mean", "se", "verdict"}``: ``above`` / ``below``
    when the mean is more than 2 standard errors from 0, else ``tie``)."""
    models = [m for m in MODELS if all(m in s["eval"] for s in per_seed)]
    table = {m: {p: {k: _mean_se([s["eval"][m][p][k] for s in per_seed]) for k in ("acc", "reward")}
                 for p in PLATFORMS} for m in models}
    diffs = {}
    for m in (b for b in BASELINES if b in models):
        diffs[m] = {}
        for p in PLATFORMS:
            mean, se = _mean_se([s["eval"]["MOPD student"][p]["acc"] - s["eval"][m][p]["acc"] for s in per_seed])
            verdict = ("above" if mean > 2 * se else "below" if mean < -2 * se else "tie") if se == se else "n/a"
            if se == 0:
                verdict = "above" if mean > 0 else "below" if mean < 0 else "tie"
            diffs[m][p] = {"mean": mean, "se": se, "verdict": verdict}
    return {"table": table, "diffs": diffs, "n_seeds": len(per_seed)}


def _pm(ms: tuple[float, float], spec: str) -> str:
    m, s = ms
    return f"{m:{spec}} ± {s:.3f}" if s == s else f"{m:{spec}}"


def comparison_table(agg: dict) -> str:
    """Greedy eval per platform, mean ± standard error over seeds (acc = fully correct fraction,
    reward in [-1, 1]), markdown."""
    lines = [f"| model ({_plural(agg['n_seeds'], 'seed')}) | desktop acc | mobile acc | desktop reward | mobile reward |",
             "|---|---|---|---|---|"]
    for name, e in agg["table"].items():
        lines.append(f"| {name} | " + " | ".join([_pm(e[p]["acc"], ".3f") for p in PLATFORMS]
                                                 + [_pm(e[p]["reward"], "+.3f") for p in PLATFORMS]) + " |")
    return "\n".join(lines)


def difference_table(agg: dict) -> str:
    """MOPD acc - baseline acc, paired per seed: mean ± standard error, and the verdict."""
    lines = ["| MOPD acc minus | desktop | mobile |", "|---|---|---|"]
    for name, d in agg["diffs"].items():
        lines.append(f"| {name} | " + " | ".join(
            f"{_pm((d[p]['mean'], d[p]['se']), '+.3f')} ({d[p]['verdict']})" for p in PLATFORMS) + " |")
    return "\n".join(lines)


def _plot(records: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 4, figsize=(17, 4))
    runs = list(dict.fromkeys(r["run"] for r in records))

    def curve(run, key):
        seeds = sorted({r["seed"] for r in records if r["run"] == run})
        rows = np.array([[r[key] for r in records if r["run"] == run and r["seed"] == s] for s in seeds], dtype=float)
        rows = np.array([_smooth(list(row)) for row in rows])
        steps = np.arange(1, rows.shape[1] + 1)
        with warnings.catch_warnings():  # all-nan columns (steps without reward variance) plot as gaps
            warnings.simplefilter("ignore", RuntimeWarning)
            mean = np.nanmean(rows, 0)
            se = np.nanstd(rows, 0, ddof=1) / math.sqrt(len(rows)) if len(rows) > 1 else np.zeros_like(mean)
        return steps, mean, se

    for ax, p in zip(axes[:2], PLATFORMS, strict=True):
        for run in runs:
            steps, mean, se = curve(run, f"reward/{p}")
            ax.plot(steps, mean, label={"mopd": "MOPD", "grpo": "GRPO, no KL"}.get(run, run))
            ax.fill_between(steps, mean - se, mean + se, alpha=0.25)
        ax.set(title=f"{p}: rollout reward (mean of 5 steps, ± SE)", xlabel="step", ylabel="reward")
        ax.legend(fontsize=8)
    if "mopd" in runs:
        for p, style in zip(PLATFORMS, ("-", "--"), strict=True):
            steps, mean, se = curve("mopd", f"k3/{p}")
            axes[2].plot(steps, mean, style, label=f"MOPD {p}")
        steps, mean, _ = curve("mopd", "grad_ratio")
        axes[3].plot(steps, mean)
    axes[2].set(title="MOPD: K3 to the routed teacher per token", xlabel="step", ylabel="K3", yscale="log")
    axes[3].set(title="MOPD: beta |grad K3| / |grad PG|", xlabel="step", ylabel="ratio", yscale="log")
    axes[2].legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def _smooth(v: list[float], k: int = 5) -> list[float]:
    out = []
    for i in range(len(v)):
        w = [x for x in v[max(0, i - k + 1) : i + 1] if x == x]
        out.append(float(np.mean(w)) if w else float("nan"))
    return out


def run(cfg: DemoConfig, log=None) -> dict:
    """Every seed (in ``cfg.n_workers`` processes), then the aggregate table, ``metrics.jsonl``,
    ``summary.json`` and ``demo.png`` in ``cfg.out``.

    Returns the summary: ``{"config", "wall_s", "cpu_s" (this process and its workers, imports
    included), "per_seed": [{seed, eval, stage_s, cpu_s, ...}], "aggregate": {"table", "diffs"},
    "grad_ratio": {median, q10, q90, steps}, "records": [...]}``.
    """
    log_fn = log or (lambda s: print(s, flush=True))
    out = Path(cfg.out)
    out.mkdir(parents=True, exist_ok=True)
    t0, cpu0 = time.perf_counter(), _tree_cpu()
    seeds = list(range(cfg.seed, cfg.seed + cfg.seeds))
    log_fn(f"verl-mopd demo: {_plural(len(seeds), 'seed')} in {_plural(cfg.n_workers, 'process', 'processes')}; "
           f"per-step rows:\n{_HEADER}")
    roles = ("teacher", "student")
    if cfg.n_workers == 1:
        bases = {r: pretrain_base(cfg, r, log=log_fn) for r in roles}
        per_seed = [run_seed(cfg, s, bases, log=log_fn) for s in seeds]
    else:
        import multiprocessing as mp
        from concurrent.futures import ProcessPoolExecutor

        with ProcessPoolExecutor(max(2, cfg.n_workers), mp_context=mp.get_context("spawn")) as pool:
            bases = dict(zip(roles, pool.map(_pretrain_worker, [cfg] * 2, roles), strict=True))
            per_seed = list(pool.map(_seed_worker, [cfg] * len(seeds), seeds, [bases] * len(seeds)))
    wall, cpu = time.perf_counter() - t0, _tree_cpu() - cpu0  # the pool's workers are reaped by now
    records = [r for s in per_seed for r in s.pop("records")]
    with open(out / "metrics.jsonl", "w") as f:
        for r in records:
            f.write(json.dumps(r) + "\n")
    if cfg.plot and records:
        _plot(records, out / "demo.png")
    agg = aggregate(per_seed)
    ratios = [r["grad_ratio"] for r in records if r["run"] == "mopd" and r["grad_ratio"] == r["grad_ratio"]]
    grad_ratio = ({"median": float(np.median(ratios)), "q10": float(np.quantile(ratios, 0.1)),
                   "q90": float(np.quantile(ratios, 0.9)), "steps": len(ratios)} if ratios else {})
    summary = {"config": asdict(cfg), "wall_s": wall, "cpu_s": cpu, "per_seed": per_seed, "aggregate": agg,
               "grad_ratio": grad_ratio}
    (out / "summary.json").write_text(json.dumps(summary, indent=2))
    log_fn("")
    log_fn(comparison_table(agg))
    if agg["diffs"]:
        log_fn("")
        log_fn(difference_table(agg))
    if grad_ratio:
        log_fn(f"\nbeta={cfg.beta}: beta*|grad K3| / |grad PG| median {grad_ratio['median']:.3f} "
               f"(10-90%: {grad_ratio['q10']:.3f}-{grad_ratio['q90']:.3f}) over {grad_ratio['steps']} MOPD steps")
    log_fn(f"{wall:.0f} s wall, {cpu:.0f} s CPU in all; wrote {out / 'summary.json'}, {out / 'metrics.jsonl'}"
           + (f", {out / 'demo.png'}" if cfg.plot and records else ""))
    return summary | {"records": records}
