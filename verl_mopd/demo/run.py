"""The UI-MOPD demo loop on CPU: stage 1 (one SFT teacher per platform), stage 2 (GRPO + routed
teachers + gated ``mopd_k3`` + the action reward), and the baselines, on tiny local models.

Why a loop of its own: verl 0.9.1's trainer cannot start without GPUs (GPU-only resource pools,
engines registered for cuda/npu, rollout servers only). So this short loop drives the same
components a real run uses, and calls verl's functions wherever verl has one:

- rollouts: ``transformers`` ``generate`` (``do_sample``, temperature 1.0, full distribution);
- reward: ``verl_mopd.rewards.compute_score`` (strict mode: +1 correct, -0.5 partial, -1 invalid);
- advantages: verl's ``compute_grpo_outcome_advantage``;
- gate: ``verl_mopd.losses.reward_gate`` over whole GRPO groups (``MOPDGateConfig``: recipe
  ``tau_kl=0.5`` on ``acc``);
- teachers: ``PlatformTeacherGroup`` (``hf`` backend workers on a local Ray cluster), which splits
  the batch by ``platform`` with the router, scores each part with its platform's teacher and
  merges back in order; or, with ``teachers="local"``, the hf backend's ``score_rows`` in-process
  through the same router ``split`` / ``merge`` (no Ray start-up);
- loss: verl's ``distillation_ppo_loss`` with ``loss_mode=mopd_k3`` (PG + beta * K3, beta 0.01) on
  the TensorDict micro-batch layout verl's engines pass (nested, ``no_padding_2_padding``); the
  no-KL baseline uses verl's ``ppo_loss`` on the same batch.

One optimizer step per rollout batch (on-policy: ``old_log_probs`` are the current policy's), one
micro-batch: a demonstration and an integration test, not a second trainer.
"""

from __future__ import annotations

import json
import time
from collections import defaultdict
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import torch

from verl_mopd.demo.models import SIZES, build_model, build_tokenizer
from verl_mopd.demo.tasks import Task, make_tasks
from verl_mopd.rewards import compute_score

__all__ = ["DemoConfig", "Policy", "run", "sft", "evaluate", "rl", "TeacherScorer", "METRIC_FIELDS"]

PLATFORMS = ("desktop", "mobile")
#: every per-step record of ``metrics.jsonl`` has these keys
METRIC_FIELDS = (
    "run", "step", "time_s", "loss", "pg_loss", "mask_on_fraction",
    *[f"{k}/{p}" for k in ("reward", "acc", "k3", "teacher_samples") for p in PLATFORMS],
)


@dataclass
class DemoConfig:
    """Sizes and knobs of the demo (defaults: the full demo, ~4-5 minutes on 2 idle cores).

    steps: stage-2 RL steps (MOPD, and the no-KL GRPO baseline); the mixed-SFT baseline gets the
        same number of optimizer steps on the same number of samples per step.
    teacher_steps / teacher_lr: stage-1 SFT of each teacher; base_steps: mixed-SFT steps of the
        student base (200: it parses, but gets the conventions only half right, see the table).
    prompts_per_step x rollout_n: the rollout batch (GRPO groups of rollout_n).
    beta: ``distillation_loss_coef``; tau_kl / gate_metric: the reward gate.
    teachers: ``ray`` (PlatformTeacherGroup, hf workers on local Ray) or ``local`` (in-process).
    baselines: also run mixed SFT, GRPO without the KL term, and the teachers' weight average.
    size / teacher_size: the student's / the teachers' model size (``models.SIZES``): ``small``
        teachers reach ~1.0 greedy accuracy on both seeds tried in 400 steps, ``tiny`` ones need
        twice as many and still stall on one intent (copying a word or a coordinate) on some seeds.
    max_new_tokens: 32 fits the longest target (mobile ``swipe``: 31 tokens + ``<eos>``).
    """

    steps: int = 150
    teacher_steps: int = 400
    base_steps: int = 200
    prompts_per_step: int = 16
    rollout_n: int = 4
    sft_batch: int = 64
    sft_lr: float = 5e-3
    teacher_lr: float = 3e-3
    rl_lr: float = 1e-3
    beta: float = 0.01
    tau_kl: float = 0.5
    gate_metric: str = "acc"
    size: str = "tiny"
    teacher_size: str = "small"
    eval_tasks: int = 128
    max_new_tokens: int = 32
    teachers: str = "ray"
    baselines: bool = True
    seed: int = 0
    threads: int = 2
    log_every: int = 5
    out: str = "mopd_demo"
    plot: bool = True

    def __post_init__(self):
        for name in ("steps", "teacher_steps", "base_steps", "prompts_per_step", "rollout_n", "sft_batch",
                     "eval_tasks", "max_new_tokens", "threads", "log_every"):
            v = getattr(self, name)
            if not isinstance(v, int) or v < (0 if name.endswith("steps") else 1):
                raise ValueError(f"demo.{name}={v!r}: must be an integer >= {0 if name.endswith('steps') else 1}")
        if self.rollout_n < 2:
            raise ValueError(f"demo.rollout_n={self.rollout_n}: GRPO needs >= 2 rollouts per prompt")
        if self.prompts_per_step % 2:
            raise ValueError(f"demo.prompts_per_step={self.prompts_per_step}: must be even (both platforms)")
        if self.teachers not in ("ray", "local"):
            raise ValueError(f"demo.teachers={self.teachers!r}: allowed 'ray', 'local'")
        for name in ("size", "teacher_size"):
            if getattr(self, name) not in SIZES:
                raise ValueError(f"demo.{name}={getattr(self, name)!r}: allowed {sorted(SIZES)}")
        if self.gate_metric not in ("acc", "score"):
            raise ValueError(f"demo.gate_metric={self.gate_metric!r}: allowed 'acc', 'score'")


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


def sft(policy: Policy, tasks_fn, steps: int, batch: int, lr: float, seed: int, desc: str) -> list:
    """Plain cross-entropy on the target tokens of ``tasks_fn(n, seed)`` batches, torch AdamW with
    a linear warm-up over the first 10% of ``steps``, then linear decay to 0, and grad-norm clip 1
    (without them a tiny model at this lr sometimes stalls on one intent). Returns per-step losses.
    """
    from tqdm.auto import tqdm

    opt = torch.optim.AdamW(policy.model.parameters(), lr=lr, weight_decay=0.0)
    warmup = max(1, steps // 10)
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda s: min((s + 1) / warmup, (steps - s) / max(1, steps - warmup)))
    losses = []
    policy.model.train()
    for step in tqdm(range(steps), desc=desc, leave=False, disable=steps == 0):
        tasks = tasks_fn(batch, seed * 100_003 + step)
        prompts, targets = policy.prompt_ids(tasks), policy.target_ids(tasks)
        logps = sequence_log_probs(policy.model, prompts, targets)
        nll = torch.cat([-lp[len(p) - 1 : -1] for lp, p in zip(logps, prompts, strict=True)])
        loss = nll.mean()
        opt.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(policy.model.parameters(), 1.0)
        opt.step()
        sched.step()
        losses.append(loss.item())
    return losses


def score(tasks: list[Task], texts: list[str]) -> list[dict]:
    """``compute_score`` (strict) of each decoded response against its task's ground truth."""
    return [compute_score("demo", text, t.ground_truth, mode="strict") for t, text in zip(tasks, texts, strict=True)]


def evaluate(policy: Policy, tasks: list[Task], max_new_tokens: int) -> dict:
    """Greedy decoding on ``tasks``: ``{platform: {"reward", "acc"}}`` (means), for platforms present."""
    _, responses = policy.generate(tasks, max_new_tokens, sample=False)
    results = score(tasks, [policy.decode(r) for r in responses])
    out = {}
    for p in PLATFORMS:
        rs = [r for r, t in zip(results, tasks, strict=True) if t.platform == p]
        if rs:
            out[p] = {"reward": float(np.mean([r["score"] for r in rs])), "acc": float(np.mean([r["acc"] for r in rs]))}
    return out


# ------------------------------------------------------------------------------ teachers


class TeacherScorer:
    """The platform teachers behind one call: ``score(batch) -> (teacher_logprobs (bs, R), metrics)``.

    ``mode="ray"``: verl_mopd's ``PlatformTeacherGroup`` (one ``hf`` worker group per platform on a
    local Ray cluster). ``mode="local"``: the same router ``split``/``merge`` around the hf backend's
    ``score_rows`` in this process. Both record which platforms each call sent to each teacher.
    """

    def __init__(self, paths: dict[str, str], mode: str, threads: int = 1):
        from verl_mopd.teachers import TeachersConfig

        self.mode = mode
        self.config = TeachersConfig.from_mapping({"skip_gated": False, "teachers": {
            p: {"model_path": path, "backend": "hf", "device": "cpu", "dtype": "float32", "micro_batch_tokens": 4096}
            for p, path in paths.items()}})
        self.queried: dict[str, list[str]] = defaultdict(list)  # teacher -> platforms of the rows it scored
        self._started_ray = False
        if mode == "ray":
            import ray

            from verl_mopd.teachers import PlatformTeacherGroup

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


def rl_step(policy, opt, tasks, cfg: DemoConfig, scorer: TeacherScorer | None, rng_seed: int) -> dict:
    """One GRPO(+MOPD) step on ``tasks`` (each repeated ``rollout_n`` times). Returns the step's metrics.

    ``scorer=None`` is the no-KL baseline (verl's ``ppo_loss``); otherwise verl's
    ``distillation_ppo_loss`` with ``mopd_k3`` and the reward gate.
    """
    from verl.protocol import DataProto
    from verl.trainer.distillation.losses import distillation_ppo_loss
    from verl.trainer.ppo.core_algos import compute_grpo_outcome_advantage
    from verl.utils import tensordict_utils as tu
    from verl.workers.config import ActorConfig, DistillationConfig
    from verl.workers.utils.losses import ppo_loss

    from verl_mopd.config import MOPDDistillationLossConfig, MOPDGateConfig
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
    metrics = {f"k3/{p}": float("nan") for p in PLATFORMS} | {f"teacher_samples/{p}": 0.0 for p in PLATFORMS}
    if scorer is not None:
        gate_cfg = MOPDGateConfig(tau_kl=cfg.tau_kl, gate_metric=cfg.gate_metric)
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
    else:
        metrics["mask_on_fraction"] = 0.0
    data = tu.get_tensordict(fields)
    tu.assign_non_tensor(data, dp_size=1, batch_num_tokens=int(response_mask.sum()), global_batch_size=len(rollouts))
    model_output = {"log_probs": torch.nested.nested_tensor_from_jagged(
        torch.cat(logps), torch.tensor([0] + [len(lp) for lp in logps]).cumsum(0))}
    if scorer is not None:
        dist = DistillationConfig(enabled=False, distillation_loss=MOPDDistillationLossConfig(
            distillation_loss_coef=cfg.beta))
        loss, loss_metrics = distillation_ppo_loss(actor, dist, model_output=model_output, data=data)
    else:
        loss, loss_metrics = ppo_loss(actor, model_output, data)
    opt.zero_grad()
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


def rl(policy, cfg: DemoConfig, scorer, name: str, log) -> list[dict]:
    """``cfg.steps`` RL steps on fresh mixed-platform prompts; one record per step."""
    from tqdm.auto import tqdm

    opt = torch.optim.AdamW(policy.model.parameters(), lr=cfg.rl_lr, weight_decay=0.0)
    records, start = [], time.perf_counter()
    bar = tqdm(range(cfg.steps), desc=name, leave=False, disable=cfg.steps == 0)
    for step in bar:
        tasks = make_tasks(cfg.prompts_per_step, seed=cfg.seed * 7919 + 10_000 + step)
        m = rl_step(policy, opt, tasks, cfg, scorer, rng_seed=cfg.seed * 7919 + step)
        rec = {"run": name, "step": step + 1, "time_s": round(time.perf_counter() - start, 3)} | m
        records.append(rec)
        bar.set_postfix(desktop=f"{m['reward/desktop']:+.2f}", mobile=f"{m['reward/mobile']:+.2f}")
        if (step + 1) % cfg.log_every == 0 or step == 0 or step + 1 == cfg.steps:
            log(_row(rec))
    return records


_HEADER = (f"{'run':<6} {'step':>4}  {'reward desk':>11} {'reward mob':>10}  {'K3 desk':>8} {'K3 mob':>8}  "
           f"{'mask on':>7}  {'loss':>8}")


def _row(r: dict) -> str:
    def f(v, spec):
        return format(v, spec) if v == v else "-".rjust(len(format(0.0, spec)))

    return (f"{r['run']:<6} {r['step']:>4}  {f(r['reward/desktop'], '+11.3f')} {f(r['reward/mobile'], '+10.3f')}  "
            f"{f(r['k3/desktop'], '8.4f')} {f(r['k3/mobile'], '8.4f')}  {f(r['mask_on_fraction'], '7.2f')}  "
            f"{r['loss']:+8.4f}")


# ------------------------------------------------------------------------------ the whole demo


def _plot(records: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax_r, ax_k) = plt.subplots(1, 2, figsize=(11, 4))
    for run in dict.fromkeys(r["run"] for r in records):
        rs = [r for r in records if r["run"] == run]
        for p, style in zip(PLATFORMS, ("-", "--"), strict=True):
            steps = [r["step"] for r in rs]
            ax_r.plot(steps, _smooth([r[f"reward/{p}"] for r in rs]), style, label=f"{run} {p}")
            k3 = [r[f"k3/{p}"] for r in rs]
            if any(v == v for v in k3):
                ax_k.plot(steps, k3, style, label=f"{run} {p}")
    ax_r.set(title="rollout reward (moving mean of 5)", xlabel="step", ylabel="reward")
    ax_k.set(title="K3(student || routed teacher) per token", xlabel="step", ylabel="K3", yscale="log")
    ax_r.legend(fontsize=8)
    ax_k.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _smooth(v: list[float], k: int = 5) -> list[float]:
    return [float(np.mean(v[max(0, i - k + 1) : i + 1])) for i in range(len(v))]


def _average(models) -> torch.nn.Module:
    import copy

    avg = copy.deepcopy(models[0])
    states = [m.state_dict() for m in models]
    avg.load_state_dict({k: sum(s[k] for s in states) / len(states) for k in states[0]})
    return avg


def run(cfg: DemoConfig, log=None) -> dict:
    """Both stages and the baselines; writes ``metrics.jsonl``, ``summary.json``, ``demo.png`` to ``cfg.out``.

    Returns the summary: ``{"config", "runtime_s", "stage_s", "eval": {model: {platform: {reward,
    acc}}}, "teacher_queries": {teacher: {platform: rows}}, "records": [...]}``.
    """
    import copy

    from tqdm.auto import tqdm

    log_fn = log or tqdm.write
    torch.set_num_threads(cfg.threads)
    out = Path(cfg.out)
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    stage_s = {}
    tok = build_tokenizer()
    eval_tasks = make_tasks(cfg.eval_tasks, seed=cfg.seed + 999_999)
    per_platform = {p: [t for t in eval_tasks if t.platform == p] for p in PLATFORMS}
    evals = {}

    # stage 1: one teacher per platform, SFT on its own platform's data
    teachers, paths = {}, {}
    for i, p in enumerate(PLATFORMS):
        teacher = Policy(build_model(tok, cfg.teacher_size, seed=cfg.seed + 1 + i), tok)
        losses = sft(teacher, lambda n, s, p=p: make_tasks(n, s, platforms=(p,)), cfg.teacher_steps, cfg.sft_batch,
                     cfg.teacher_lr, seed=cfg.seed + 1 + i, desc=f"stage 1: {p} teacher SFT")
        paths[p] = str(out / "teachers" / p)
        teacher.model.save_pretrained(paths[p])
        tok.save_pretrained(paths[p])
        teachers[p] = teacher
        evals[f"teacher:{p}"] = evaluate(teacher, per_platform[p], cfg.max_new_tokens)
        log_fn(f"stage 1  {p} teacher: {cfg.teacher_steps} SFT steps, final loss "
               f"{losses[-1] if losses else float('nan'):.4f}, greedy reward on {p} "
               f"{evals[f'teacher:{p}'][p]['reward']:+.3f} (acc {evals[f'teacher:{p}'][p]['acc']:.2f})")
    stage_s["stage1"] = time.perf_counter() - t0

    # the student base: briefly mixed-SFT'd (knows the format, not yet the platforms' conventions)
    t1 = time.perf_counter()
    base = Policy(build_model(tok, cfg.size, seed=cfg.seed + 100), tok)
    sft(base, make_tasks, cfg.base_steps, cfg.sft_batch, cfg.sft_lr, seed=cfg.seed + 100, desc="student base")
    evals["student base"] = evaluate(base, eval_tasks, cfg.max_new_tokens)
    base_state = copy.deepcopy(base.model.state_dict())

    # stage 2: GRPO + routed teachers + gated mopd_k3
    records = []
    scorer = TeacherScorer(paths, cfg.teachers, threads=1)
    try:
        stage_s["teacher_startup"] = time.perf_counter() - t1
        log_fn(f"stage 2  MOPD: {cfg.steps} steps x {cfg.prompts_per_step} prompts x {cfg.rollout_n} rollouts, "
               f"beta={cfg.beta}, tau_kl={cfg.tau_kl} on {cfg.gate_metric}, teachers={cfg.teachers}")
        log_fn(_HEADER)
        t2 = time.perf_counter()
        student = Policy(base.model, tok)
        records += rl(student, cfg, scorer, "mopd", log_fn)
        evals["MOPD student"] = evaluate(student, eval_tasks, cfg.max_new_tokens)
        stage_s["stage2"] = time.perf_counter() - t2
        queries = {t: {p: ps.count(p) for p in PLATFORMS} for t, ps in scorer.queried.items()}
    finally:
        scorer.close()

    if cfg.baselines:
        t3 = time.perf_counter()
        grpo = Policy(build_model(tok, cfg.size, seed=cfg.seed + 100), tok)
        grpo.model.load_state_dict(base_state)
        records += rl(grpo, cfg, None, "grpo", log_fn)
        evals["GRPO, no KL"] = evaluate(grpo, eval_tasks, cfg.max_new_tokens)
        mixed = Policy(build_model(tok, cfg.size, seed=cfg.seed + 100), tok)
        mixed.model.load_state_dict(base_state)
        sft(mixed, make_tasks, cfg.steps, cfg.prompts_per_step * cfg.rollout_n, cfg.sft_lr,
            seed=cfg.seed + 200, desc="baseline: mixed SFT")
        evals["mixed SFT"] = evaluate(mixed, eval_tasks, cfg.max_new_tokens)
        evals["teacher weight avg"] = evaluate(Policy(_average([t.model for t in teachers.values()]), tok),
                                               eval_tasks, cfg.max_new_tokens)
        stage_s["baselines"] = time.perf_counter() - t3

    runtime = time.perf_counter() - t0
    with open(out / "metrics.jsonl", "w") as f:
        for r in records:
            f.write(json.dumps(r) + "\n")
    if cfg.plot and records:
        _plot(records, out / "demo.png")
    summary = {"config": asdict(cfg), "runtime_s": runtime, "stage_s": stage_s, "eval": evals,
               "teacher_queries": queries}
    (out / "summary.json").write_text(json.dumps(summary, indent=2))
    log_fn("")
    log_fn(comparison_table(evals))
    log_fn(f"\n{runtime:.0f} s in all ({', '.join(f'{k} {v:.0f} s' for k, v in stage_s.items())}); "
           f"wrote {out / 'metrics.jsonl'}" + (f", {out / 'demo.png'}" if cfg.plot and records else ""))
    return summary | {"records": records}


def comparison_table(evals: dict) -> str:
    """Greedy eval per platform (reward in [-1, 1], acc = fully correct fraction), markdown."""
    lines = ["| model | desktop reward | desktop acc | mobile reward | mobile acc |", "|---|---|---|---|---|"]
    for name, e in evals.items():
        cells = []
        for p in PLATFORMS:
            cells += [f"{e[p]['reward']:+.3f}", f"{e[p]['acc']:.2f}"] if p in e else ["", ""]
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    return "\n".join(lines)
