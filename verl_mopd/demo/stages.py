"""The demo's stages: the policy, stage 0 (the pretrained bases), SFT, greedy eval, the teachers and the RL step.

See :mod:`verl_mopd.demo.run` for what each stage does and why the demo has a loop of its own.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import time
from collections import defaultdict
from pathlib import Path

import numpy as np
import torch

from verl_mopd.demo.config import EVAL_SEED, PLATFORMS, DemoConfig, _plural, _seed
from verl_mopd.demo.models import build_model, build_tokenizer
from verl_mopd.demo.tasks import INTENTS, Task, make_tasks, sample_tasks
from verl_mopd.errors import UsageError
from verl_mopd.rewards import compute_score

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

    from verl_mopd.config import MOPDDistillationLossConfig, MOPDConfig
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




def _save(policy: Policy, path: Path) -> str:
    policy.model.save_pretrained(path)
    policy.tok.save_pretrained(path)
    return str(path)


def _load(path: str, tok) -> Policy:
    from transformers import AutoModelForCausalLM

    return Policy(AutoModelForCausalLM.from_pretrained(path).eval(), tok)


def eval_set(n_per_platform: int) -> list[Task]:
    """The fixed held-out set: ``n_per_platform`` tasks per platform (alternating), seed ``EVAL_SEED``."""
    return make_tasks(2 * n_per_platform, seed=EVAL_SEED)


def base_val_set(cfg: DemoConfig) -> list[Task]:
    """The bases' validation stream: ``base_val_tasks`` fresh tasks per platform (alternating) of the
    base seed, disjoint from the held-out eval set."""
    held = frozenset(t.prompt for t in eval_set(cfg.eval_tasks))
    return make_tasks(2 * cfg.base_val_tasks, _seed(cfg.base_seed, "base_val"), exclude=held)


def _val_acc(policy: Policy, tasks: list[Task], max_new_tokens: int) -> float:
    """Greedy acc on ``tasks``, both platforms together; leaves the model in train mode."""
    e = evaluate(policy, tasks, max_new_tokens)
    policy.model.train()
    return float(np.mean([e[p]["acc"] for p in PLATFORMS if p in e]))


def _stamp(cfg: DemoConfig, role: str) -> dict:
    """What a pretrained base depends on: its knobs, the vocabulary and the first pretraining batch
    (so a change to the task definitions invalidates a cached base)."""
    size, steps = (cfg.teacher_size, cfg.teacher_base_steps) if role == "teacher" else (cfg.size, cfg.base_steps)
    target = cfg.teacher_base_acc if role == "teacher" else cfg.base_acc
    first = sample_tasks(cfg.sft_batch, _seed(cfg.base_seed, f"{role}_base_data"), cfg.pretrain_mobile_share,
                         exclude=frozenset(t.prompt for t in eval_set(cfg.eval_tasks)))
    digest = hashlib.sha256(json.dumps([[t.prompt, t.target] for t in first]).encode()).hexdigest()[:16]
    lr = cfg.teacher_pretrain_lr if role == "teacher" else cfg.pretrain_lr
    return {"role": role, "size": size, "steps": steps, "lr": lr, "batch": cfg.sft_batch,
            "mobile_share": cfg.pretrain_mobile_share, "base_seed": cfg.base_seed, "eval_tasks": cfg.eval_tasks,
            "target_acc": target, "check_every": cfg.base_check_every if target else 0,
            "val_tasks": cfg.base_val_tasks if target else 0, "vocab": len(build_tokenizer()), "first_batch": digest}


def _stale_cache_message(path: Path, cached: dict, stamp: dict) -> str:
    knobs = {"size": "size/teacher_size", "steps": "base_steps/teacher_base_steps", "lr": "pretrain_lr",
             "batch": "sft_batch", "mobile_share": "pretrain_mobile_share", "target_acc": "base_acc/teacher_base_acc",
             "check_every": "base_check_every", "val_tasks": "base_val_tasks"}
    differ = [f"{knobs.get(k, k)}: {cached.get(k)!r} there, {stamp[k]!r} now" for k in stamp if cached.get(k) != stamp[k]]
    return (f"--bases {path.parent}: the cached {stamp['role']} base in {path} was pretrained with other knobs "
            f"({'; '.join(differ)}); not overwriting it: give another --bases folder (or --out), "
            "or delete that folder to retrain")


def pretrain_base(cfg: DemoConfig, role: str, log=print) -> str:
    """Stage 0 for ``role`` (``teacher`` or ``student``): SFT from random init on fresh tasks of the
    ``pretrain_mobile_share`` platform mix, constant lr, for ``teacher_base_steps`` / ``base_steps``
    steps; or, with the role's target ``teacher_base_acc`` / ``base_acc`` > 0, until the base is
    competent: every ``base_check_every`` steps its greedy acc on :func:`base_val_set` is measured,
    and pretraining stops at the first check that reaches the target (the step count is the cap), so
    that every ``base_seed`` gives bases of the same competence however fast it learns.
    Saved to ``{cfg.bases or cfg.out/bases}/{role}``; a base saved there with the same stamp (knobs,
    vocabulary, first batch) is reused. A base saved there with another stamp is never overwritten:
    a ``UsageError`` names the knobs that differ. The weights and ``pretrain.json`` (the stamp, the
    step it stopped at and its validation acc) are written to a temporary folder that is then
    renamed, so a folder with a stamp is always complete. Returns the folder."""
    torch.set_num_threads(cfg.threads)
    path = Path(cfg.bases or Path(cfg.out) / "bases") / role
    stamp = _stamp(cfg, role)
    if (path / "pretrain.json").exists():
        cached = json.loads((path / "pretrain.json").read_text())
        if all(cached.get(k) == v for k, v in stamp.items()):
            log(f"stage 0  {role} base: reusing {path}")
            return str(path)
        raise UsageError(_stale_cache_message(path, cached, stamp))
    t0 = time.perf_counter()
    tok = build_tokenizer()
    held = frozenset(t.prompt for t in eval_set(cfg.eval_tasks))
    policy = Policy(build_model(tok, stamp["size"], seed=_seed(cfg.base_seed, f"{role}_init")), tok)
    val = base_val_set(cfg) if stamp["target_acc"] else []
    trace: list[tuple[int, float]] = []  # (step, validation acc) of every check

    def batches():
        for step in range(stamp["steps"]):
            if val and step and step % stamp["check_every"] == 0:
                trace.append((step, _val_acc(policy, val, cfg.max_new_tokens)))
                if trace[-1][1] >= stamp["target_acc"]:
                    return
            yield sample_tasks(cfg.sft_batch, _seed(cfg.base_seed, f"{role}_base_data", step), cfg.pretrain_mobile_share,
                               exclude=held)

    losses = sft(policy, batches(), stamp["lr"])
    if val and (not trace or trace[-1][0] != len(losses)):  # stopped at the cap: measure where it ends
        trace.append((len(losses), _val_acc(policy, val, cfg.max_new_tokens)))
    reached = not val or trace[-1][1] >= stamp["target_acc"]
    staging = path.parent / f".{role}.partial-{os.getpid()}"
    shutil.rmtree(staging, ignore_errors=True)
    _save(policy, staging)
    (staging / "pretrain.json").write_text(json.dumps(stamp | {"stopped_at": len(losses), "reached": reached,
                                                               "val_acc": trace}, indent=2))
    shutil.rmtree(path, ignore_errors=True)  # a folder without a stamp: an interrupted older save
    os.replace(staging, path)
    competence = "" if not val else (
        f", validation acc {trace[-1][1]:.3f} " + (f">= its target {stamp['target_acc']}" if reached else
                                                   f"< its target {stamp['target_acc']} at the cap of {stamp['steps']}"))
    log(f"stage 0  {role} base ({stamp['size']}): {_plural(len(losses), 'step')}{competence}, final loss "
        f"{losses[-1] if losses else float('nan'):.4f}, {time.perf_counter() - t0:.0f} s")
    return str(path)
