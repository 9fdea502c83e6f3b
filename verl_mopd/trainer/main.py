"""Entry point: verl's own PPO main with verl-mopd's config.

    python -m verl_mopd.trainer.main --config-path=$PWD/recipes/ui_mopd --config-name=stage2_mopd_qwen3vl8b \
        key=value ...

Every verl override works unchanged: this is ``verl.trainer.main_ppo.main`` (which validates the
config and runs ``run_ppo(config, TaskRunnerV1)``), after our registration. The recipe checks are
the hydra callback of ``mopd_base.yaml`` (``verl_mopd.checks.launch``), which runs before this
function on every hydra launch. Stock ``python -m verl.trainer.main_ppo --config-path=<recipes dir>
--config-name=...`` does the same: the ``verl.plugins`` entry point registers ``mopd_k3`` and the
``mopd_*`` trainers in every process, and the same callback checks the recipe.
"""

from __future__ import annotations

import hydra


@hydra.main(config_path="config", config_name="mopd", version_base=None)
def main(config):
    from verl.trainer import main_ppo

    from verl_mopd.plugin import register

    register()
    main_ppo.main(config)  # hydra passes an already-composed config straight through


if __name__ == "__main__":
    main()
