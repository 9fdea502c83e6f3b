"""``verl-mopd demo``: both UI-MOPD stages end to end on CPU with tiny local models (no GPU, no download).

- :mod:`~verl_mopd.demo.tasks`: seeded synthetic desktop/mobile GUI tasks with conflicting conventions;
- :mod:`~verl_mopd.demo.models`: word-level tokenizer and tiny Qwen3 causal LMs;
- :mod:`~verl_mopd.demo.run`: the loop (stage 1 teacher SFT, stage 2 GRPO + routed teachers + mopd_k3);
- :mod:`~verl_mopd.demo.cli`: ``add_demo_arguments`` / ``run_demo`` for ``verl-mopd demo`` and
  ``python -m verl_mopd.demo``.
"""

from verl_mopd.demo.run import DemoConfig, run

__all__ = ["DemoConfig", "run"]
