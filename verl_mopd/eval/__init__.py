"""Evaluation: offline step-level metrics scored by the reward, online OSWorld / MobileWorld agents, merges.

- :mod:`.offline`: verl parquet -> model -> :func:`verl_mopd.rewards.compute_score` -> per-platform
  parse rate, action-type accuracy, grounding accuracy, step success, reward histogram.
- :mod:`.messages`: chat messages with screenshots in the one neutral layout the clients
  (:mod:`verl_mopd.clients`: OpenAI-compatible HTTP, local ``transformers``) read.
- :mod:`.osworld`, :mod:`.mobileworld`: agents for the official harnesses (pyautogui code /
  MobileWorld ``JSONAction``), 30-step budget.
- :mod:`.merge`: weight-average and TIES (peft's ``merge_utils.ties``) checkpoint merges.
- :mod:`.cli`: ``verl-mopd eval offline | merge``.

Submodules are imported on use, so ``import verl_mopd.eval`` loads neither torch nor transformers.
"""
