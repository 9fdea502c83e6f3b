"""Every shipped recipe composes with verl's config and validates on CPU; bad ones fail clearly."""

import pathlib
import subprocess
import sys

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from verl_mopd.checks.recipe_cli import compose_recipe, config_group_problem, partial_recipe_problem, validate_recipe_cli
from verl_mopd.checks.validate import surviving_group_min_mean, validate

ROOT = pathlib.Path(__file__).parents[2]
RECIPES = sorted(p for p in (ROOT / "recipes").rglob("*.yaml")
                 if not partial_recipe_problem(str(p)) and not config_group_problem(str(p)))
STAGE2 = ROOT / "recipes" / "ui_mopd" / "stage2_mopd_qwen3vl8b.yaml"


def test_the_recipes_are_found():
    assert {p.name for p in RECIPES} >= {
        "stage1_teacher_sft_desktop.yaml", "stage1_teacher_sft_mobile.yaml",
        "stage2_mopd_qwen3vl8b.yaml", "stage2_mopd_small.yaml",
    }


@pytest.mark.parametrize("recipe", RECIPES, ids=lambda p: p.name)
def test_recipe_validates(recipe, capsys):
    assert validate_recipe_cli(str(recipe), []) == 0, capsys.readouterr().err


def test_a_config_group_option_names_the_recipe_and_the_override_to_compose_it_with(capsys):
    from verl_mopd.errors import UsageError

    layout = ROOT / "recipes" / "ui_mopd" / "layout" / "stage2_cpu.yaml"
    smoke = ROOT / "recipes" / "ui_mopd" / "smoke" / "stage2_cpu.yaml"
    assert "stage2_mopd_qwen3vl8b.yaml layout=stage2_cpu" in config_group_problem(str(layout))
    assert "+smoke=stage2_cpu" in config_group_problem(str(smoke))
    with pytest.raises(UsageError, match="config group 'smoke'"):
        validate_recipe_cli(str(smoke), [])
    assert config_group_problem(str(STAGE2)) is None


def test_stage2_recipe_is_the_paper_setup():
    cfg = compose_recipe(str(STAGE2))
    assert cfg.trainer.v1.trainer_mode == "mopd_sync"
    assert cfg.distillation.distillation_loss.loss_mode == "mopd_k3"
    assert cfg.distillation.distillation_loss.distillation_loss_coef == 0.01
    assert cfg.actor_rollout_ref.actor.strategy == "megatron"
    assert cfg.actor_rollout_ref.rollout.name == "sglang" and cfg.actor_rollout_ref.rollout.n == 8
    assert cfg.trainer.nnodes * cfg.trainer.n_gpus_per_node == 64
    assert cfg.reward.custom_reward_function.path == "pkg://verl_mopd.rewards.score"
    assert sorted(cfg.mopd.teachers) == ["desktop", "mobile"]
    assert cfg.trainer.v1.sampler.custom_sampler.name == "QuotaReplayBuffer"
    assert cfg.trainer.v1.sampler.sampler_kwargs.kl_only_max_score == cfg.mopd.tau_kl == 0.5


def _problems(overrides, recipe=STAGE2):
    problems, warnings = validate(compose_recipe(str(recipe), overrides))
    return "\n".join(problems), "\n".join(warnings)


@pytest.fixture(scope="module")
def two_platform_parquet(tmp_path_factory):
    path = tmp_path_factory.mktemp("data") / "train.parquet"
    pq.write_table(pa.table({"platform": ["desktop", "mobile", "mobile"], "data_source": ["a", "b", "b"]}), path)
    return str(path)


@pytest.mark.parametrize(
    "overrides, message",
    [
        (["distillation.distillation_loss.distillation_loss_coef=-0.5"],
         "distillation.distillation_loss.distillation_loss_coef=-0.5 (beta): must be a number >= 0"),
        (["+mopd.beta=0.01"], "mopd.beta was removed: beta is verl's distillation.distillation_loss.distillation_loss_coef"),
        (["+mopd.tau_k1=0.5"], "mopd.tau_k1: unknown key; did you mean mopd.tau_kl?"),
        (["distillation.distillation_loss.loss_mode=k9"], "loss_mode='k9' is not a registered distillation loss"),
        (["mopd.teachers.desktop.nnodes=16"], "colocated with the actor but needs 128 devices"),
        (["mopd.teachers.mobile.backend=vllm"], "mopd.teachers.mobile.backend='vllm': allowed values"),
        (["actor_rollout_ref.rollout.temperature=0.7"], "temperature=0.7: must be 1.0"),
        (["mopd.tau=0.3"], None),  # unknown key: hydra itself refuses a new key without '+'
        (["+mopd.tau=0.3"], "mopd.tau: unknown key; did you mean mopd.tau_kl?"),
        (["mopd.normalization=tokens"], "mopd.normalization='tokens': allowed values"),
        (["trainer.v1.sampler.sampler_kwargs.quota.shares={desktop: 0.5, mobile: 0.6}"], "sums to"),
        (["~trainer.v1.sampler.sampler_kwargs.quota.shares.mobile", "+trainer.v1.sampler.sampler_kwargs.quota.shares.web=0.5"],
         "quota.shares has domains ['desktop', 'web'] but the teachers serve ['desktop', 'mobile']"),
        (["distillation.enabled=true"], "mopd.teachers ['desktop', 'mobile'] run as worker groups, and "
         "distillation.enabled=true starts verl's teacher loop too: one teacher system per run."
         " Keep mopd.teachers (hf/megatron) with distillation.enabled=false, or declare the teachers only in "
         "distillation.teacher_models"),
        (["mopd.teachers.mobile.backend=server"], "mopd.teachers.mobile.backend='server': inference-server teachers "
         "are declared once, in verl's distillation.teacher_models.<name> (key: <routing value>, model_path, "
         "num_replicas, inference) with distillation.enabled=true and distillation.teacher_key=${mopd.routing_key}; "
         "remove them from mopd.teachers (examples/multi_domain_text/recipe.yaml shows the block)"),
    ],
)
def test_bad_overrides_fail_with_a_clear_message(overrides, message):
    if message is None:
        with pytest.raises(Exception, match="tau"):
            compose_recipe(str(STAGE2), overrides)
        return
    problems, _ = _problems(overrides)
    assert message in problems


def test_missing_teacher_for_a_platform_in_the_data(two_platform_parquet):
    problems, _ = _problems([f"data.train_files={two_platform_parquet}", "~mopd.teachers.mobile"])
    assert "train data has platform value(s) ['mobile'] with no teacher; configured: ['desktop']" in problems


def test_gate_that_masks_every_surviving_group_warns():
    # the public release's combination: DAPO filter on acc, n = 8, gate acc > 0.1
    _, warnings = _problems(["trainer.v1.sampler.sampler_kwargs.uniform_groups=drop",
                             "trainer.v1.sampler.sampler_kwargs.kl_only_max_score=null", "mopd.tau_kl=0.1"])
    assert "the reward gate masks every group" in warnings and "0.125 > mopd.tau_kl=0.1" in warnings
    _, warnings = _problems(["trainer.v1.sampler.custom_sampler.path=null", "algorithm.filter_groups.enable=true",
                             "mopd.tau_kl=0.1"])  # verl's own DAPO filter, the release's setting
    assert "the reward gate masks every group" in warnings
    _, warnings = _problems([])  # our recipe: all-failure groups kept for the KL, tau 0.5
    assert "masks every group" not in warnings


def test_the_gates_levels_come_from_the_reward_config():
    """``rm_scores`` takes compute_score's levels with the recipe's own ``reward_kwargs`` (the release's
    in ``ui_mopd`` mode, the recipe's; strict mode's ScoreConfig otherwise), which are checked too."""
    unfiltered = ["mopd.gate_metric=rm_scores", "trainer.v1.sampler.custom_sampler.path=null",
                  "algorithm.filter_groups.enable=false", "mopd.tau_kl=1.0"]
    _, warnings = _problems(unfiltered)
    assert "mopd.tau_kl=1.0 >= the highest rm_scores level 1.0: the gate never masks anything" in warnings
    problems, _ = _problems([*unfiltered, "+reward.custom_reward_function.reward_kwargs.correct=2.0"])
    assert ("reward.custom_reward_function.reward_kwargs: mode='ui_mopd' reproduces the release and takes no "
            "tolerances; got ['correct']") in problems
    unfiltered.append("reward.custom_reward_function.reward_kwargs.mode=strict")
    _, warnings = _problems([*unfiltered, "+reward.custom_reward_function.reward_kwargs.correct=2.0"])
    assert "never masks" not in warnings  # the reward's own highest level, 2.0, is above tau
    problems, _ = _problems([*unfiltered, "+reward.custom_reward_function.reward_kwargs.correct=-2.0"])
    assert ("reward.custom_reward_function.reward_kwargs: correct=-2.0, partial=-0.5, "
            "invalid=-1.0: need correct > partial >= invalid") in problems


def test_another_rewards_levels_are_said_to_be_unknown():
    multi_domain = ROOT / "examples" / "multi_domain_text" / "recipe.yaml"  # its own reward file
    _, warnings = validate(compose_recipe(str(multi_domain), ["mopd.gate_metric=rm_scores"]))
    assert any(w.startswith("the reward gate is not checked against the group filter: mopd.gate_metric=rm_scores")
               for w in warnings), warnings


def test_surviving_group_min_mean():
    assert surviving_group_min_mean((0.0, 1.0), 8, True) == 1 / 8
    assert surviving_group_min_mean((0.0, 1.0), 8, False) == 0.0
    assert surviving_group_min_mean((-1.0, -0.5, 1.0), 4, True) == pytest.approx((-3 - 0.5) / 4)


@pytest.mark.parametrize("override, problem", [
    ("distillation.distillation_loss.distillation_loss_coef=-1",
     "distillation.distillation_loss.distillation_loss_coef=-1 (beta): must be a number >= 0"),
    ("+mopd.tau_k1=0.5", "mopd.tau_k1: unknown key; did you mean mopd.tau_kl?"),
])
def test_entry_point_refuses_a_bad_recipe_before_starting_ray(override, problem):
    out = subprocess.run(
        [sys.executable, "-m", "verl_mopd.trainer.main", f"--config-path={STAGE2.parent}",
         f"--config-name={STAGE2.stem}", override],
        capture_output=True, text=True, timeout=300,
    )
    assert out.returncode != 0
    assert problem in out.stderr
    assert "ray init" not in out.stdout


STAGE1 = ROOT / "recipes" / "ui_mopd" / "stage1_teacher_sft_desktop.yaml"
SMALL = ROOT / "recipes" / "ui_mopd" / "stage2_mopd_small.yaml"


def test_checkpoints_go_to_an_absolute_folder_from_ckpt_dir(monkeypatch):
    monkeypatch.delenv("CKPT_DIR", raising=False)
    for recipe in (STAGE2, SMALL, STAGE1):
        assert compose_recipe(str(recipe)).trainer.default_local_dir.startswith("/"), recipe.name
    monkeypatch.setenv("CKPT_DIR", "/mnt/ckpt")
    assert compose_recipe(str(STAGE2)).trainer.default_local_dir == "/mnt/ckpt/UI-MOPD/stage2-qwen3vl8b-mopd"
    assert compose_recipe(str(STAGE1)).trainer.default_local_dir == "/mnt/ckpt/UI-MOPD/stage1-desktop-teacher-sft"


@pytest.mark.parametrize("recipe, overrides, nodes", [
    (STAGE2, [], 8),
    (STAGE1, [], 4),
    (SMALL, ["actor_rollout_ref.rollout.nnodes=1", "actor_rollout_ref.rollout.n_gpus_per_node=8"], 2),
])
def test_a_relative_checkpoint_folder_is_refused_on_more_than_one_node(recipe, overrides, nodes, capsys):
    args = ["trainer.default_local_dir=checkpoints/run", *overrides]
    assert validate_recipe_cli(str(recipe), args) == 1
    assert (f"trainer.default_local_dir=checkpoints/run is relative, but the job runs on {nodes} nodes"
            in capsys.readouterr().err)


def test_a_relative_checkpoint_folder_is_fine_on_one_node(capsys):
    problems, _ = _problems(["trainer.default_local_dir=checkpoints/run"], recipe=SMALL)
    assert "default_local_dir" not in problems


@pytest.mark.parametrize("script", ["run_stage1.sh", "run_stage2.sh"])
@pytest.mark.parametrize("ckpt, message", [(None, "set CKPT_DIR to an absolute folder"),
                                           ("ckpt", "CKPT_DIR=ckpt must be an absolute path")])
def test_the_launchers_require_an_absolute_ckpt_dir(script, ckpt, message):
    env = {"PATH": "/usr/bin:/bin"}  # no verl-mopd on PATH: the launcher must stop before it
    if ckpt is not None:
        env["CKPT_DIR"] = ckpt
    proc = subprocess.run(["bash", str(ROOT / "recipes" / "ui_mopd" / script), "desktop"], env=env,
                          capture_output=True, text=True)
    assert proc.returncode != 0 and message in proc.stderr


@pytest.mark.parametrize("mode", ["seq-mean-token-mean", "seq-mean-token-sum", "seq-mean-token-sum-norm", "token-sum"])
def test_kept_normalization_is_refused_unless_token_mean(mode):
    """N14: the gate realizes 'kept' as a token-count ratio, exact only for token-mean."""
    problems, _ = _problems(["mopd.normalization=kept", f"actor_rollout_ref.actor.loss_agg_mode={mode}"])
    assert f"mopd.normalization=kept with actor_rollout_ref.actor.loss_agg_mode={mode}" in problems
    problems, _ = _problems(["mopd.normalization=kept"])  # the recipe's token-mean
    assert "mopd.normalization=kept" not in problems
    problems, _ = _problems([f"actor_rollout_ref.actor.loss_agg_mode={mode}"])  # 'all' is exact for every mode
    assert "mopd.normalization" not in problems


def test_megatron_teacher_micro_batch_tokens_must_hold_the_longest_sequence():
    """N3: verl's Megatron engine asserts max_token_len >= the longest sequence (8192 + 512 here)."""
    problems, _ = _problems(["+mopd.teachers.mobile.micro_batch_tokens=8192"])
    assert ("mopd.teachers.mobile.micro_batch_tokens=8192 is below the longest sequence, data.max_prompt_length + "
            "data.max_response_length = 8704") in problems
    assert "mopd.teachers.desktop.micro_batch_tokens" not in problems
    problems, _ = _problems(["+mopd.teachers.mobile.micro_batch_tokens=8704"])
    assert "micro_batch_tokens" not in problems


def test_a_missing_teacher_path_is_an_error_on_the_head_node_only(tmp_path, two_platform_parquet, capsys):
    """validate-recipe --head (run_stage{1,2}.sh pass it): the run starts on this machine, so a typo'd teacher
    path is refused here; elsewhere it stays a warning (the path may exist on the cluster)."""
    typo = str(tmp_path / "desktop_teacher_typo")
    for name in ("student", "mobile_teacher"):  # present here (files: no tokenizer to compare)
        (tmp_path / name).touch()
    here = [f"actor_rollout_ref.model.path={tmp_path}/student", f"data.train_files={two_platform_parquet}",
            f"data.val_files={two_platform_parquet}", f"mopd.teachers.mobile.model_path={tmp_path}/mobile_teacher",
            f"trainer.default_local_dir={tmp_path}/ckpt"]
    key = "mopd.teachers.desktop.model_path"
    args = [*here, f"{key}={typo}"]
    assert validate_recipe_cli(str(SMALL), args) == 0
    assert f"WARNING: {key}={typo} does not exist on this machine (fine if it exists on the cluster)" in \
        capsys.readouterr().err
    assert validate_recipe_cli(str(SMALL), args, head=True) == 1
    errors = [line for line in capsys.readouterr().err.splitlines() if line.startswith("ERROR:")]
    assert errors == [(f"ERROR: {key}={typo} does not exist on this machine, the cluster's head node (--head), "
                       "where the run starts")], errors
    # a model path that reads as a Hugging Face Hub id stays a warning there; a missing data file does not
    problems, warnings = validate(compose_recipe(str(SMALL), [*here, f"{key}=Qwen/Qwen3-VL-8B-Thinking",
                                                              "data.val_files=/no/such/val.parquet"]), head=True)
    assert not any("Qwen/Qwen3-VL-8B-Thinking" in p for p in problems)
    assert any(w.startswith(f"{key}=Qwen/Qwen3-VL-8B-Thinking does not exist") for w in warnings)
    assert any(p.startswith("data.val_files=/no/such/val.parquet does not exist on this machine, the cluster's head")
               for p in problems)


@pytest.mark.parametrize("script", ["run_stage1.sh", "run_stage2.sh"])
def test_the_launchers_validate_as_the_head_node(script, tmp_path):
    """run_stage{1,2}.sh run on the head node: they call validate-recipe --head (stopped here by a stand-in)."""
    fake = tmp_path / "verl-mopd"
    fake.write_text(f'#!/bin/sh\necho "$@" > {tmp_path}/args\nexit 1\n')
    fake.chmod(0o755)
    proc = subprocess.run(["bash", str(ROOT / "recipes" / "ui_mopd" / script), "desktop", "x=1"],
                          env={"PATH": f"{tmp_path}:/usr/bin:/bin", "CKPT_DIR": "/mnt/ckpt"}, capture_output=True,
                          text=True, check=False)
    assert proc.returncode == 1
    argv = (tmp_path / "args").read_text().split()
    assert argv[:2] == ["validate-recipe", "--head"] and argv[-1] == "x=1", argv
