"""validate-recipe runs no code from a recipe, and catches the values that fail, stall or go NaN on a cluster."""

import pathlib

import pytest

from verl_mopd import cli
from verl_mopd.checks.recipe_safety import code_target_problems, searchpath_problems
from verl_mopd.checks.recipe_cli import compose_recipe
from verl_mopd.checks.validate import validate

ROOT = pathlib.Path(__file__).parents[2]
SMALL = ROOT / "recipes" / "ui_mopd" / "stage2_mopd_small.yaml"  # one node of 8 GPUs


def _check(overrides):
    problems, warnings = validate(compose_recipe(str(SMALL), overrides))
    return "\n".join(problems), "\n".join(warnings)


@pytest.fixture
def canary(tmp_path, monkeypatch):
    """A package whose import, or a callable whose call, leaves a file: proof that code ran."""
    flag = tmp_path / "ran"
    pkg = tmp_path / "site" / "canarypkg"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text(f"open({str(flag)!r}, 'w').write('import')\n")
    (pkg / "conf.yaml").write_text("x: 1\n")
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    return flag


@pytest.mark.parametrize(
    "override",
    [
        "+distillation.extra={_target_: canarypkg.boom, path: x}",  # a new node anywhere
        "+actor_rollout_ref.actor.optim.extra={_target_: os.makedirs, name: NEVER}",  # nested in a section verl converts
        "actor_rollout_ref.actor._target_=canarypkg.ActorConfig",  # replacing verl's own target
        "+trainer.hook={_target_: verl.utils.fs.copy, src: a, dst: b}",  # verl's package, but not a config class
    ],
)
def test_no_target_outside_verls_config_dataclasses_is_instantiated(canary, tmp_path, override, capsys):
    override = override.replace("NEVER", str(tmp_path / "made"))
    assert cli.main(["validate-recipe", str(SMALL), override]) == 1
    err = capsys.readouterr().err
    assert "_target_=" in err and "validation runs no code from a recipe" in err
    assert not canary.exists() and not (tmp_path / "made").exists()


def test_the_shipped_targets_are_all_allowed():
    assert code_target_problems(compose_recipe(str(SMALL))) == []


def test_a_pkg_searchpath_outside_verl_is_refused_before_composing(canary, capsys):
    assert searchpath_problems(str(SMALL), ["hydra.searchpath=[pkg://verl.trainer.config]"]) == []
    assert cli.main(["validate-recipe", str(SMALL), "hydra.searchpath=[pkg://canarypkg]"]) == 1
    assert "would import that package" in capsys.readouterr().err and not canary.exists()


@pytest.mark.parametrize(
    "override, problem",
    [
        ("distillation.distillation_loss.distillation_loss_coef=inf",
         "distillation.distillation_loss.distillation_loss_coef=inf: must be a finite number"),
        ("mopd.tau_kl=inf", "mopd.tau_kl=inf: must be a finite number"),
        ("actor_rollout_ref.rollout.tensor_model_parallel_size=3", "TP*DP*PP=3"),
        ("actor_rollout_ref.rollout.n=1",
         "actor_rollout_ref.rollout.n=1: the quota sampler cannot serve groups of fewer than min_valid_samples=2 "
         "valid rollouts (GRPO needs a std), so every group would be dropped and no batch could fill; allowed: "
         "n >= 2, or verl's own sampler (no trainer.v1.sampler.custom_sampler) for n = 1"),
        ("trainer.n_gpus_per_node=null", "trainer.n_gpus_per_node=None: must be a positive integer"),
        ("trainer.nnodes=0", "trainer.nnodes=0: must be a positive integer"),
    ],
)
def test_cluster_breaking_values_are_problems(override, problem):
    problems, _ = _check([override])
    assert problem in problems and problems.count(problem) == 1, problems  # said once, by its one owner


def test_warnings_for_a_missing_teacher_path_and_the_unbounded_k3(tmp_path):
    missing = tmp_path / "no_such_teacher"
    _, warnings = _check([f"mopd.teachers.desktop.model_path={missing}",
                          "distillation.distillation_loss.k3_linear_above=inf"])
    assert f"mopd.teachers.desktop.model_path={missing} does not exist" in warnings
    assert "k3_linear_above=inf: the plain K3" in warnings


def test_a_missing_recipe_file_is_a_user_error(tmp_path, capsys):
    assert cli.main(["validate-recipe", str(tmp_path / "nope.yaml")]) == 2
    assert "nope.yaml: no such recipe file" in capsys.readouterr().err


def test_a_corrupt_data_file_is_a_problem_naming_it(tmp_path):
    bad = tmp_path / "train.parquet"
    bad.write_bytes(b"PAR1 not really")
    problems, _ = _check([f"data.train_files={bad}"])
    assert f"data.train_files: {bad} is not a readable parquet file" in problems


def test_an_interpolation_that_does_not_resolve_is_named():
    problems, _ = _check(["+trainer.ckpt_dir=${oc.env:VERL_MOPD_TEST_UNSET_VARIABLE}"])
    assert "trainer.ckpt_dir does not resolve" in problems and "VERL_MOPD_TEST_UNSET_VARIABLE" in problems
