"""``verl-mopd demo``: both UI-MOPD stages end to end on CPU with tiny local models (no GPU, no download).

- :mod:`~verl_mopd.demo.config`: ``DemoConfig`` (every knob), the platforms, models and seed streams (no torch);
- :mod:`~verl_mopd.demo.tasks`: seeded synthetic desktop/mobile GUI tasks with conflicting conventions;
- :mod:`~verl_mopd.demo.models`: word-level tokenizer and tiny Qwen3 causal LMs;
- :mod:`~verl_mopd.demo.stages`: the policy, stage 0 (the bases), SFT, greedy eval, the teachers, the RL step;
- :mod:`~verl_mopd.demo.baselines`: GRPO without KL, mixed SFT, the single-platform SFTs and their merges;
- :mod:`~verl_mopd.demo.report`: mean ± SE over seeds, the paired differences, the tables, the plot;
- :mod:`~verl_mopd.demo.run`: the orchestration (stage 0, then every seed in its own process, then the report);
- :mod:`~verl_mopd.demo.cli`: ``add_demo_arguments`` / ``run_demo`` for ``verl-mopd demo``.
"""

from verl_mopd.demo.config import DemoConfig

__all__ = ["DemoConfig"]
