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

import json
import time
import warnings
from dataclasses import asdict
from pathlib import Path

import numpy as np
import torch

from verl_mopd.demo.baselines import run_baselines
from verl_mopd.demo.config import BASELINES, METRIC_FIELDS, MODELS, PLATFORMS, DemoConfig, _plural, _seed
from verl_mopd.demo.models import build_tokenizer
from verl_mopd.demo.report import _plot, aggregate, comparison_table, difference_table
from verl_mopd.demo.stages import (
    _HEADER,
    TeacherScorer,
    _load,
    _save,
    corpus_batches,
    eval_set,
    evaluate,
    make_tasks,
    pretrain_base,
    rl,
    sft,
)

__all__ = ["BASELINES", "METRIC_FIELDS", "MODELS", "DemoConfig", "run", "run_seed"]



def run_seed(cfg: DemoConfig, seed: int, bases: dict[str, str], log=print) -> dict:
    """Stages 1-2 and every baseline for one ``seed`` from the pretrained ``bases`` (``{"teacher",
    "student"}`` checkpoint folders); checkpoints under ``cfg.out/seed{seed}``.

    Returns ``{"seed", "eval": {model: {platform: {reward, acc, intents}}}, "records": [...],
    "teacher_queries": {teacher: {platform: rows}}, "stage_s": {...}, "cpu_s", "wall_s",
    "sft_sizes": {platform: n}, "sft_steps": {"teacher:<platform>" | "mixed SFT": n}}``.
    """
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
        grpo_records, sft_steps["mixed SFT"] = run_baselines(cfg, seed, bases, corpora, paths, prompts, root, tok,
                                                             ev, timed, log)
        records += grpo_records

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
