"""The demo's baselines, per seed, from the same bases, corpora and RL prompts as MOPD:

- GRPO without the KL term (the same prompts and sampling seeds as MOPD: common random numbers);
- mixed SFT of the student base on the union of the two stage-1 corpora (``cfg.mixed_steps`` steps);
- the two single-platform SFTs of the student base (the stage-1 recipe on one corpus: the paper's
  "8B SFT on OSWorld / MobileWorld"), and their weight average and TIES merge over the student
  base (``verl_mopd.eval.merge``). The paper merges at the student's size: its TIES model is
  compared with the 8B base on the static benchmarks, and its 8B single-platform SFTs are released
  as the baselines; merging the bigger teachers would compare the student with a model 5x its size.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

from verl_mopd.demo.config import PLATFORMS, DemoConfig, _seed
from verl_mopd.demo.stages import _load, _save, corpus_batches, rl, sft
from verl_mopd.demo.tasks import Task


def run_baselines(cfg: DemoConfig, seed: int, bases: dict[str, str], corpora: dict[str, list[Task]],
                  prompts: Callable[[int], list[Task]], root: Path, tok,
                  ev: Callable, timed: Callable[[str, float], None], log) -> tuple[list[dict], dict[str, int]]:
    """Train and evaluate (``ev(name, policy)``) every baseline of ``seed``; ``timed(stage, t0)`` records
    the stage times ``grpo`` and ``baselines``. The single-platform SFTs go under ``root/sft``, the merges
    under ``root/merged``. Returns ``(the GRPO run's per-step records, {baseline: its SFT steps})``."""
    from verl_mopd.eval.merge import MergeConfig, merge_checkpoints

    t0 = time.perf_counter()
    grpo = _load(bases["student"], tok)
    records = rl(grpo, cfg, None, "grpo", seed, prompts, log)
    ev("GRPO, no KL", grpo)
    timed("grpo", t0)
    t0 = time.perf_counter()
    mixed = _load(bases["student"], tok)
    union = corpora["desktop"] + corpora["mobile"]
    batches = corpus_batches(union, cfg.sft_batch, cfg.mixed_steps, _seed(seed, "mixed"))
    sft_steps = {"mixed SFT": len(sft(mixed, batches, cfg.sft_lr))}
    ev("mixed SFT", mixed)
    experts = {}
    for p in PLATFORMS:  # the teachers' recipe (corpus, steps, batch order, lr), from the student base
        expert = _load(bases["student"], tok)
        batches = corpus_batches(corpora[p], cfg.sft_batch, cfg.teacher_steps, _seed(seed, f"teacher:{p}"))
        sft_steps[f"{p} SFT"] = len(sft(expert, batches, cfg.sft_lr))
        ev(f"{p} SFT", expert)
        experts[p] = _save(expert, root / "sft" / p)
    for method, name in (("average", "weight average"), ("ties", "TIES")):
        merged = root / "merged" / method
        merge_checkpoints(MergeConfig(method=method, models=(experts["desktop"], experts["mobile"]),
                                      base=bases["student"] if method == "ties" else None,
                                      density=cfg.ties_density), str(merged))
        ev(name, _load(str(merged), tok))
    timed("baselines", t0)
    return records, sft_steps
