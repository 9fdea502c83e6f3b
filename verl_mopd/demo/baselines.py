"""The demo's baselines, per seed, from the same bases, corpora and RL prompts as MOPD:

- GRPO without the KL term (the same prompts and sampling seeds as MOPD: common random numbers);
- mixed SFT of the student base on the union of the two stage-1 corpora (``cfg.mixed_steps`` steps);
- the weight average and the TIES merge of the two teachers (``verl_mopd.eval.merge``; TIES over the teacher base).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

from verl_mopd.demo.config import DemoConfig, _seed
from verl_mopd.demo.stages import _load, corpus_batches, rl, sft
from verl_mopd.demo.tasks import Task


def run_baselines(cfg: DemoConfig, seed: int, bases: dict[str, str], corpora: dict[str, list[Task]],
                  paths: dict[str, str], prompts: Callable[[int], list[Task]], root: Path, tok,
                  ev: Callable, timed: Callable[[str, float], None], log) -> tuple[list[dict], int]:
    """Train and evaluate (``ev(name, policy)``) every baseline of ``seed``; ``paths`` are its two teachers,
    ``timed(stage, t0)`` records the stage times ``grpo`` and ``baselines``. Merges go under ``root/merged``.
    Returns ``(the GRPO run's per-step records, the mixed-SFT baseline's SFT steps)``."""
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
    mixed_steps = len(sft(mixed, batches, cfg.sft_lr))
    ev("mixed SFT", mixed)
    for method, name in (("average", "weight average"), ("ties", "TIES")):
        merged = root / "merged" / method
        merge_checkpoints(MergeConfig(method=method, models=(paths["desktop"], paths["mobile"]),
                                      base=bases["teacher"] if method == "ties" else None,
                                      density=cfg.ties_density), str(merged))
        ev(name, _load(str(merged), tok))
    timed("baselines", t0)
    return records, mixed_steps
