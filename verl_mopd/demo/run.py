"""The UI-MOPD demo on CPU: both stages, every baseline, several seeds, on tiny local models.

- stage 0, the pretrained bases (the paper's Qwen3-VL-32B / -8B), shared by every seed: a
  ``teacher_size`` teacher base and a ``size`` student base, each trained from random init on
  fresh tasks of a platform mix (``pretrain_mobile_share``) until its greedy acc on a validation
  stream reaches its target (``teacher_base_acc`` / ``base_acc``; the step count is the cap), so
  that both are part-way through learning to click (the student base more so than the bigger
  teacher base) and every stage-2 method has room to improve on both platforms;
- stage 1 (per seed): finite, imbalanced per-platform SFT corpora (``sft_desktop`` :
  ``sft_mobile``; the paper's Uni-GUI is ~2 : 1); one teacher per platform, each fine-tuned from
  the ONE shared teacher base on its platform's corpus;
- stage 2 (per seed): the student base trained with GRPO + routed teachers + gated ``mopd_k3`` on
  separate RL prompts (disjoint from the corpora and the eval set; their ground truth is used only
  by the reward);
- baselines (per seed): GRPO without the KL term (same prompts and sampling seeds: common random
  numbers), mixed SFT of the student base on the union of the corpora (the stage-1 recipe: as many
  SFT steps as the two teachers together, at their lr and batch), the two single-platform SFTs of
  the student base (each teacher's recipe on the student base) and their weight average and TIES
  merge (``verl_mopd.eval.merge``): the paper's merges are of its 8B single-platform SFTs;
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
- merges: ``verl_mopd.eval.merge.merge_checkpoints`` (average; TIES over the student base).

One optimizer step per rollout batch (on-policy: ``old_log_probs`` are the current policy's), one
micro-batch: a demonstration and an integration test, not a second trainer.
"""

from __future__ import annotations

import contextlib
import json
import os
import time
import warnings
from dataclasses import asdict, replace
from pathlib import Path

import numpy as np
import torch

from verl_mopd.demo.baselines import run_baselines
from verl_mopd.demo.config import BASELINES, METRIC_FIELDS, MODELS, PLATFORMS, DemoConfig, _plural, _seed
from verl_mopd.demo.models import build_tokenizer
from verl_mopd.demo.progress import Progress, ProgressLine, stage_plan
from verl_mopd.demo.report import _plot, aggregate, comparison_table, difference_table
from verl_mopd.demo.stages import (
    _HEADER,
    TeacherScorer,
    _load,
    _stamp,
    _save,
    corpus_batches,
    eval_set,
    evaluate,
    make_tasks,
    pretrain_base,
    rl,
    sft,
)

__all__ = ["BASELINES", "METRIC_FIELDS", "MODELS", "SUMMARY", "DemoConfig", "keep_finished_run", "run", "run_seed"]

#: the run's summary and its completion marker: written last, atomically (:func:`run`)
SUMMARY = "summary.json"


def beside(out: Path) -> Path:
    """``out`` when it holds no finished run (no :data:`SUMMARY`), else the first of ``out.2``,
    ``out.3``, ... that holds none (an interrupted run there is replaced, as in ``out``)."""
    n = 2
    path = out
    while (path / SUMMARY).exists():
        path = out.with_name(f"{out.name}.{n}")
        n += 1
    return path


def _bases_match(cfg: DemoConfig, bases: Path) -> bool:
    """Whether both pretrained bases in ``bases`` were made with ``cfg``'s knobs (:func:`pretrain_base` reuses them)."""
    for role in ("teacher", "student"):
        stamp_file = bases / role / "pretrain.json"
        if not stamp_file.exists():
            return False
        cached = json.loads(stamp_file.read_text())
        if any(cached.get(k) != v for k, v in _stamp(cfg, role).items()):
            return False
    return True


def keep_finished_run(cfg: DemoConfig) -> tuple[DemoConfig, str]:
    """A finished run in ``cfg.out`` is never written into: ``(cfg, "")`` when ``cfg.out`` holds none,
    else ``(cfg with out = the folder beside it, the line that says so)``. The run beside reuses the
    finished run's bases (default ``--bases``) when their knobs match, and pretrains its own when not."""
    out = Path(cfg.out)
    target = beside(out)
    if target == out:
        return cfg, ""
    bases = cfg.bases
    own = out / "bases"
    if not bases and _bases_match(cfg, own):
        bases = str(own)
    note = (f"verl-mopd demo: {out} holds a finished run ({SUMMARY}); it is kept as it is, and this run writes to "
            f"{target}" + (f" (reusing the bases of {own})" if bases == str(own) else ""))
    return replace(cfg, out=str(target), bases=bases), note



def run_seed(cfg: DemoConfig, seed: int, bases: dict[str, str], log=print, report=None) -> dict:
    """Stages 1-2 and every baseline for one ``seed`` from the pretrained ``bases`` (``{"teacher",
    "student"}`` checkpoint folders); checkpoints under ``cfg.out/seed{seed}``. ``report((seed, stage),
    seconds)``, when given, is called as each stage of ``stage_s`` ends (the progress line).

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
        if report is not None:
            report((seed, name), stage_s[name])

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
        log(f"seed {seed}  stage 1 {p} teacher: {_plural(len(losses), 'SFT step')} on {len(corpora[p])} tasks, "
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
    _save(student, root / "students" / "mopd")
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
        grpo_records, baseline_steps = run_baselines(cfg, seed, bases, corpora, prompts, root, tok,
                                                     ev, timed, log)
        records += grpo_records
        sft_steps |= baseline_steps

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


#: the driver's event queue, in a worker process only (set by :func:`_worker_init`; a queue can reach a
#: pool worker only at its start)
_EVENTS = None


def _worker_init(events, log_dir: str) -> None:
    """A pool worker: Ctrl-C is the driver's to handle (no traceback per worker); everything the
    worker or a library prints goes to ``log_dir/worker-PID.log``; log lines and stage ends go to the
    driver through ``events``, which prints them whole under one progress line."""
    import os
    import signal
    import sys

    global _EVENTS
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    Path(log_dir).mkdir(parents=True, exist_ok=True)
    fd = os.open(str(Path(log_dir) / f"worker-{os.getpid()}.log"), os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    for stream, target in ((sys.stdout, 1), (sys.stderr, 2)):
        stream.flush()
        os.dup2(fd, target)  # C-level output (torch, Ray) too
    os.close(fd)
    _EVENTS = events
    _quiet()


def _send_log(text: str) -> None:
    _EVENTS.put(("log", text))


def _send_stage(key: tuple, seconds: float) -> None:
    _EVENTS.put(("stage", key, seconds))


def _pretrain_worker(cfg: DemoConfig, role: str) -> str:
    t0 = time.perf_counter()
    path = pretrain_base(cfg, role, log=_send_log)
    _send_stage(("base", role), time.perf_counter() - t0)
    return path


def _seed_worker(cfg: DemoConfig, seed: int, bases: dict[str, str]) -> dict:
    return run_seed(cfg, seed, bases, log=_send_log, report=_send_stage)


# ------------------------------------------------------------------------------ all seeds


def _tree_cpu() -> float:
    """CPU seconds of this process and of its reaped children (the seed workers), user + system."""
    import resource

    return sum(r.ru_utime + r.ru_stime for r in map(resource.getrusage, (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN)))


@contextlib.contextmanager
def _sigint_ignored():
    """Ctrl-C ignored in this process while the block starts processes, which inherit the ignored
    SIGINT through exec (Python installs its KeyboardInterrupt handler only where SIGINT is at its
    default), so a worker still importing torch prints no traceback. A Ctrl-C that arrives within
    the block is lost; the driver's next one is not."""
    import signal
    import threading

    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)


def _run_in_pool(cfg: DemoConfig, seeds: list[int], roles: tuple[str, ...], log, report) -> tuple[list, dict]:
    """The bases, then every seed, in ``cfg.n_workers`` spawned processes; their events are handled
    here as they come. Ctrl-C stops the workers at once (they ignore SIGINT, so they print no
    traceback) and is raised again for the CLI to report."""
    import multiprocessing as mp
    import queue as queue_errors
    from concurrent.futures import ProcessPoolExecutor, wait

    ctx = mp.get_context("spawn")
    with _sigint_ignored():
        events = ctx.Queue()  # may start multiprocessing's resource tracker

    def drain(futures):
        pending = set(futures)
        while True:
            try:
                event = events.get(timeout=0.2)
            except queue_errors.Empty:
                pending = {f for f in pending if not f.done()}
                if not pending:
                    break
                continue
            if event[0] == "log":
                log(event[1])
            else:
                report(event[1], event[2])
        wait(futures)
        while not events.empty():  # what was sent just before the last worker finished
            event = events.get()
            log(event[1]) if event[0] == "log" else report(event[1], event[2])
        return [f.result() for f in futures]

    pool = ProcessPoolExecutor(max(2, cfg.n_workers), mp_context=ctx, initializer=_worker_init,
                               initargs=(events, str(Path(cfg.out) / "logs")))

    def submit(fn, *args):
        with _sigint_ignored():  # a worker is started by submit: it must never see Ctrl-C, even while importing
            return pool.submit(fn, *args)

    try:
        bases = dict(zip(roles, drain([submit(_pretrain_worker, cfg, r) for r in roles]), strict=True))
        per_seed = drain([submit(_seed_worker, cfg, s, bases) for s in seeds])
    except KeyboardInterrupt:
        for process in list(getattr(pool, "_processes", {}).values()):  # no public way to stop busy workers
            process.terminate()
        pool.shutdown(wait=False, cancel_futures=True)
        raise
    pool.shutdown()
    return per_seed, bases


def run(cfg: DemoConfig, log=None, stream=None) -> dict:
    """Every seed (in ``cfg.n_workers`` processes), then the aggregate table, ``metrics.jsonl``,
    ``demo.png`` and, last, ``summary.json`` in ``cfg.out``: ``summary.json`` is the completion
    marker (written atomically when the run is done), so an interrupted run never looks complete.
    A folder that holds one is never written into: the run goes beside it (:func:`keep_finished_run`;
    the returned summary's ``config.out`` says where).

    ``log``: where whole lines go (default: printed); ``stream``: where the progress line goes
    (default stdout; redrawn in place on a terminal, one line per finished stage elsewhere). Pool
    workers print nothing themselves: their lines reach the driver whole, and anything else they
    print (library warnings included) goes to ``cfg.out/logs/worker-PID.log``.

    Returns the summary: ``{"config", "wall_s", "cpu_s" (this process and its workers, imports
    included), "per_seed": [{seed, eval, stage_s, cpu_s, ...}], "aggregate": {"table", "diffs"},
    "grad_ratio": {median, q10, q90, steps}, "records": [...]}``.
    """
    cfg, note = keep_finished_run(cfg)  # a finished run is never written into (the CLI has said so already)
    out = Path(cfg.out)
    out.mkdir(parents=True, exist_ok=True)
    t0, cpu0 = time.perf_counter(), _tree_cpu()
    seeds = list(range(cfg.seed, cfg.seed + cfg.seeds))
    roles = ("teacher", "student")
    line = ProgressLine(Progress(stage_plan(cfg, seeds, roles), start=t0), stream)
    if log is None:
        def log_fn(text):
            line.log(text)
    else:
        log_fn = log

    def report(key, seconds):
        line.stage_done(key, seconds, time.perf_counter())

    if note:
        log_fn(note)
    log_fn(f"verl-mopd demo: {_plural(len(seeds), 'seed')} in {_plural(cfg.n_workers, 'process', 'processes')}; "
           f"per-step rows:\n{_HEADER}")
    try:
        if cfg.n_workers == 1:
            bases = {}
            for r in roles:
                start = time.perf_counter()
                bases[r] = pretrain_base(cfg, r, log=log_fn)
                report(("base", r), time.perf_counter() - start)
            per_seed = [run_seed(cfg, s, bases, log=log_fn, report=report) for s in seeds]
        else:
            per_seed, bases = _run_in_pool(cfg, seeds, roles, log_fn, report)
    finally:
        line.close()
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
    partial = out / f".{SUMMARY}.partial"
    partial.write_text(json.dumps(summary, indent=2))
    os.replace(partial, out / SUMMARY)  # last, and atomic: the run is complete
    log_fn("")
    log_fn(comparison_table(agg))
    if agg["diffs"]:
        log_fn("")
        log_fn(difference_table(agg))
    if grad_ratio:
        log_fn(f"\nbeta={cfg.beta}: beta*|grad K3| / |grad PG| median {grad_ratio['median']:.3f} "
               f"(10-90%: {grad_ratio['q10']:.3f}-{grad_ratio['q90']:.3f}) over {grad_ratio['steps']} MOPD steps")
    log_fn(f"{wall:.0f} s wall, {cpu:.0f} s CPU in all; wrote {out / SUMMARY}, {out / 'metrics.jsonl'}"
           + (f", {out / 'demo.png'}" if cfg.plot and records else ""))
    return summary | {"records": records}
