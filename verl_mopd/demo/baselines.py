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
    the stage times ``grpo`` and ``baselines``. The GRPO student goes to ``root/students/grpo``, the
    single-platform SFTs under ``root/sft``, the merges under ``root/merged``. Returns ``(the GRPO run's per-step records, {baseline: its SFT steps})``."""
    from verl_mopd.eval.merge import MergeConfig, merge_checkpoints

    t0 = time.perf_counter()
    grpo = _load(bases["student"], tok)
    records = rl(grpo, cfg, None, "grpo", seed, prompts, log)
    _save(grpo, root / "students" / "grpo")
    ev("GRPO, no KL", grpo)
    timed("grpo", t0)
    t0 = time.perf_counter()
    # (name, platform or None, corpus, steps, batch-order stream): mixed SFT on the union at its budget,
    # then each teacher's recipe (corpus, steps, batch order, lr) from the student base
    recipes = [("mixed SFT", None, [t for p in PLATFORMS for t in corpora[p]], cfg.mixed_steps, "mixed")]
    recipes += [(f"{p} SFT", p, corpora[p], cfg.teacher_steps, f"teacher:{p}") for p in PLATFORMS]
    sft_steps, experts = {}, {}
    for name, platform, data, steps, stream in recipes:
        policy = _load(bases["student"], tok)
        batches = corpus_batches(data, cfg.sft_batch, steps, _seed(seed, stream))
        sft_steps[name] = len(sft(policy, batches, cfg.sft_lr))
        ev(name, policy)
        if platform is not None:  # merged below
            experts[platform] = _save(policy, root / "sft" / platform)
    for method, name in (("average", "weight average"), ("ties", "TIES")):
        merged = root / "merged" / method
        merge_checkpoints(MergeConfig(method=method, models=(experts["desktop"], experts["mobile"]),
                                      base=bases["student"] if method == "ties" else None,
                                      density=cfg.ties_density), str(merged))
        ev(name, _load(str(merged), tok))
    timed("baselines", t0)
    return records, sft_steps
