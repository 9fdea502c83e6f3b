"""``verl-mopd validate-recipe`` on what a user may give it: a recipe partial, a YAML that is no
trainer config, a mistyped key, a plain verl run, an MOPD loss without its block."""

import pathlib

import pytest
from omegaconf import OmegaConf

from verl_mopd import cli
from verl_mopd.checks.overrides import nearest_key as _nearest_key
from verl_mopd.checks.recipe_cli import compose_recipe, partial_recipe_problem, validate_recipe_cli
from verl_mopd.checks.validate import validate

ROOT = pathlib.Path(__file__).parents[2]
PARTIALS = sorted((ROOT / "recipes").glob("*/_*.yaml"))  # a recipe folder's partials (not a config group's)
SMALL = ROOT / "recipes" / "ui_mopd" / "stage2_mopd_small.yaml"
REWARD_ONLY = ROOT / "examples" / "reward_only" / "grpo_gui_reward.yaml"


def test_the_partials_are_found():
    assert [p.name for p in PARTIALS] == ["_stage1_ui_mopd.yaml", "_stage2_ui_mopd.yaml"]


@pytest.mark.parametrize("partial", PARTIALS, ids=lambda p: p.name)
def test_a_shipped_partial_is_named_with_the_recipes_that_compose_it(partial, capsys, monkeypatch):
    monkeypatch.chdir(ROOT)
    rel = partial.relative_to(ROOT)
    users = sorted(p.relative_to(ROOT) for p in partial.parent.glob("[!_]*.yaml")
                   if partial.stem in (OmegaConf.load(p).get("defaults") or []))
    assert users  # each shipped partial is composed by a recipe
    assert cli.main(["validate-recipe", str(rel)]) == 2
    err = capsys.readouterr().err
    assert err == (f"verl-mopd validate-recipe: error: {rel} is a recipe partial (its keys are composed into "
                   f"recipes), not a recipe: validate {' or '.join(map(str, users))}, which compose it\n")


@pytest.mark.parametrize("users", [[], ["a.yaml"], ["a.yaml", "b.yml"]])
def test_any_partial_names_exactly_the_recipes_that_list_it(tmp_path, users):
    (tmp_path / "_part.yaml").write_text("data: {train_batch_size: 8}\n")
    (tmp_path / "_other.yaml").write_text("defaults: [_part]\n")  # a partial composing a partial is no recipe
    (tmp_path / "c.yaml").write_text("defaults: [ppo_trainer, {override model_engine: megatron}, _self_]\n")
    (tmp_path / "d.yaml").write_text("not: [valid yaml\n")
    for name in users:
        (tmp_path / name).write_text("defaults:\n  - ppo_trainer\n  - _part\n  - _self_\n")
    message = partial_recipe_problem(str(tmp_path / "_part.yaml"))
    assert message.startswith(f"{tmp_path / '_part.yaml'} is a recipe partial")
    if users:
        assert message.endswith(f"validate {' or '.join(str(tmp_path / u) for u in users)}, "
                                f"which compose{'s' if len(users) == 1 else ''} it")
    else:
        assert message.endswith("validate a recipe that lists it in its defaults")
    assert partial_recipe_problem(str(tmp_path / "c.yaml")) is None


def test_a_yaml_that_is_no_trainer_config_is_a_problem_not_an_internal_error(tmp_path, capsys):
    path = tmp_path / "notes.yaml"
    path.write_text("a: 1\nb: {c: 2}\n")
    assert validate_recipe_cli(str(path), []) == 1
    err = capsys.readouterr().err.splitlines()
    assert err == [f"ERROR: not a verl trainer config: no data, actor_rollout_ref, critic, algorithm, trainer section; "
                   "a recipe lists verl's ppo_trainer (or verl_mopd's mopd_base) in its defaults",
                   f"{path}: 1 problem"]


@pytest.mark.parametrize("typed, nearest", [
    ("mopd.tau_k", "mopd.tau_kl"),
    ("mopd.tua_kl", "mopd.tau_kl"),
    ("mopd.teachers.desktop.model_pth", "mopd.teachers.desktop.model_path"),
    ("algorithm.mopd.tau", "mopd.tau_kl"),  # under the wrong section: looked up again from the root
    ("actor_rollout_ref.rollout.nn", "actor_rollout_ref.rollout.n"),
    ("mopd.xyz", None),
    ("completely.unrelated.key", None),
])
def test_the_nearest_real_key_of_a_mistyped_one(typed, nearest):
    config = OmegaConf.create({
        "mopd": {"tau_kl": 0.1, "gate_metric": "acc",
                 "teachers": {"desktop": {"model_path": "/x", "backend": "hf"}}},
        "algorithm": {"adv_estimator": "grpo"},
        "actor_rollout_ref": {"rollout": {"n": 8, "name": "sglang"}},
    })
    assert _nearest_key(config, typed) == nearest


def test_a_key_with_no_near_one_keeps_hydras_message_but_not_its_plus_advice(capsys):
    assert validate_recipe_cli(str(SMALL), ["mopd.zzzzzz=1"]) == 1
    err = capsys.readouterr().err.splitlines()[-1]
    assert err.startswith(f"{SMALL}: cannot compose: Could not override 'mopd.zzzzzz'. mopd.zzzzzz is not a key of this "
                          "recipe, and hydra's '+mopd.zzzzzz=1' would add a key that verl may never read"), err
    assert "To append to your config" not in err


def test_a_mistyped_key_given_with_plus_is_named_too():
    problems, _ = validate(compose_recipe(str(SMALL), ["+mopd.tau_k=0.3"]))
    assert any(p.startswith("mopd.tau_k: unknown key; did you mean mopd.tau_kl? allowed:") for p in problems), problems


def test_a_plain_verl_run_with_our_reward_validates(capsys):
    assert validate_recipe_cli(str(REWARD_ONLY), []) == 0, capsys.readouterr().err
    assert capsys.readouterr().err.splitlines()[-1] == f"{REWARD_ONLY}: valid"


@pytest.mark.parametrize("overrides, needs", [
    (["distillation.distillation_loss.loss_mode=mopd_k3"], "distillation.distillation_loss.loss_mode=mopd_k3 needs it"),
    (["trainer.v1.trainer_mode=mopd_sync"], "trainer.v1.trainer_mode=mopd_sync needs it"),
])
def test_an_mopd_loss_or_trainer_without_the_mopd_block_is_a_problem(overrides, needs):
    problems, _ = validate(compose_recipe(str(REWARD_ONLY), overrides))
    assert any(p.startswith("mopd: the block is missing; ") and needs in p for p in problems), problems


def test_one_problem_is_one_problem(capsys):
    assert validate_recipe_cli(str(SMALL), ["distillation.distillation_loss.distillation_loss_coef=-1"]) == 1
    assert capsys.readouterr().err.splitlines()[-1] == f"{SMALL}: 1 problem"
