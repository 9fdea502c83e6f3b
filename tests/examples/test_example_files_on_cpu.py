"""Every example YAML validates; every example folder has a README and runnable code; the tour links them."""

from pathlib import Path

import pytest
from omegaconf import OmegaConf

from verl_mopd.checks.recipe_cli import compose_recipe, validate_recipe_cli

ROOT = Path(__file__).parents[2]
EXAMPLES = ROOT / "examples"
YAMLS = sorted(EXAMPLES.rglob("*.yaml"))
FOLDERS = sorted(p for p in EXAMPLES.iterdir() if p.is_dir())


def test_the_examples_are_found():
    assert [p.name for p in FOLDERS] == ["custom_trainer", "multi_domain_text", "reward_only"]
    assert [p.relative_to(EXAMPLES).as_posix() for p in YAMLS] == [
        "custom_trainer/my_mopd.yaml", "multi_domain_text/recipe.yaml", "reward_only/grpo_gui_reward.yaml"]


@pytest.mark.parametrize("path", YAMLS, ids=lambda p: p.relative_to(EXAMPLES).as_posix())
def test_example_yaml_validates(path, capsys):
    # the reward-only one too: a plain verl GRPO run needs no mopd block
    assert validate_recipe_cli(str(path), []) == 0, capsys.readouterr().err
    cfg = compose_recipe(str(path))
    if OmegaConf.select(cfg, "mopd") is not None:
        return
    # a plain verl run (the reward alone): the reward loads through verl and grades
    from verl.trainer.ppo.reward import get_custom_reward_fn

    fn = get_custom_reward_fn(cfg)
    call = ('<tool_call>{"name": "computer_use", "arguments": {"action": "left_click", "coordinate": [10, 10]}}'
            "</tool_call>")
    truth = {"platform": "desktop", "action": {"action": "left_click", "coordinate": [12, 9]}}
    assert fn(None, call, truth)["score"] == 1.0


@pytest.mark.parametrize("folder", FOLDERS, ids=lambda p: p.name)
def test_each_example_has_a_readme_with_its_command_and_code(folder):
    readme = (folder / "README.md").read_text()
    for part in ("**What it shows.**", "**The one command**", "**What you should see**"):
        assert part in readme, part
    assert list(folder.glob("*.py"))
    for script in folder.glob("*.py"):
        assert f"examples/{folder.name}/{script.name}" in readme or script.name in readme, script.name


def test_the_readme_tour_links_every_example():
    readme = (ROOT / "README.md").read_text()
    for folder in FOLDERS:
        assert f"](examples/{folder.name}/)" in readme, folder.name
