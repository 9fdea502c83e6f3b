"""The launch-time room: every check that runs before a run starts.

The house rule: a check of one field lives in its dataclass (``__post_init__`` or ``from_mapping``,
e.g. ``verl_mopd.config.MOPDConfig``); a check across sections lives here, in :mod:`.validate`;
both run on every hydra launch (:mod:`.launch`, the callback every recipe registers through
``mopd_base.yaml``, stock ``python -m verl.trainer.main_ppo`` included) and in ``verl-mopd
validate-recipe`` (:mod:`.recipe_cli`). Every config check raises or reports
``verl_mopd.errors.ConfigError`` sentences that name the key, the value and what is allowed.

- :mod:`.validate`: the cross-section checks (``validate``, ``validate_composed``);
- :mod:`.cluster_checks`: GPU counts, the async trainers' asserts, colocation slots, checkpoint folder;
- :mod:`.recipe_safety`: validation runs no code from a recipe;
- :mod:`.overrides`: a ``+key`` override that nothing reads;
- :mod:`.launch`: the hydra callback;
- :mod:`.recipe_cli`: ``verl-mopd validate-recipe``, the composing UI around the checks.
"""
