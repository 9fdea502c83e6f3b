"""Entry point: verl's own PPO main with verl-mopd's config and checks.

    python -m verl_mopd.trainer.main --config-path=$PWD/recipes/ui_mopd --config-name=stage2_mopd_qwen3vl8b \
        key=value ...

Every verl override works unchanged: this is ``verl.trainer.main_ppo.main`` (which validates the
config and runs ``run_ppo(config, TaskRunnerV1)``), preceded by our registration and recipe checks.
Stock ``python -m verl.trainer.main_ppo --config-path=<recipes dir> --config-name=...`` works too:
the ``verl.plugins`` entry point registers ``mopd_k3`` and the ``mopd_*`` trainers in every process.
"""

from __future__ import annotations

import hydra


@hydra.main(config_path="config", config_name="mopd", version_base=None)
def main(config):
    from verl.trainer import main_ppo

    from verl_mopd.losses import require_registered
    from verl_mopd.plugin import register
    from verl_mopd.errors import ConfigError
    from verl_mopd.trainer.validate import validate

    register()
    require_registered("the launcher")
    problems, warnings = validate(config)
    for warning in warnings:
        print(f"[verl-mopd] WARNING: {warning}")
    if problems:
        raise ConfigError(problems, "recipe")
    main_ppo.main(config)  # hydra passes an already-composed config straight through


if __name__ == "__main__":
    main()
