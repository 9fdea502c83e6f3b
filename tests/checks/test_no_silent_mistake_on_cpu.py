"""Mistakes a recipe composes without complaint are one-line errors on every launch path: a ``+key``
that nothing reads (``verl_mopd.checks.overrides``), a gate or filter metric the reward cannot
produce, and what the quota sampler cannot serve (``verl_mopd.checks.validate``)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from hydra.core.global_hydra import GlobalHydra
from hypothesis import given, settings
from hypothesis import strategies as st
from omegaconf import OmegaConf

from verl_mopd.checks.launch import CheckRecipe
from verl_mopd.checks.overrides import nearest_keys, unread_additions
from verl_mopd.checks.recipe_cli import compose_recipe, validate_recipe_cli
from verl_mopd.checks.validate import validate

ROOT = Path(__file__).resolve().parents[2]
SMALL = ROOT / "recipes" / "ui_mopd" / "stage2_mopd_small.yaml"
MULTI_DOMAIN = ROOT / "examples" / "multi_domain_text" / "recipe.yaml"  # its own reward file


def errors(capsys) -> list[str]:
    return [line for line in capsys.readouterr().err.splitlines() if line.startswith("ERROR: ")]


# ------------------------------------------------------------------ +key that nothing reads


def test_plus_rollout_n_names_the_real_key(capsys):
    assert validate_recipe_cli(str(SMALL), ["+rollout.n=8"]) == 1
    assert errors(capsys) == [
        "ERROR: +rollout.n=8: nothing reads rollout.n: the recipe has no 'rollout' section and verl reads only its "
        "own top-level sections; did you mean actor_rollout_ref.rollout.n (or reward.reward_model.rollout.n)?; "
        "set actor_rollout_ref.rollout.n=8, without '+'"
    ]


def test_without_plus_hydras_advice_is_replaced_by_the_real_key(capsys):
    assert validate_recipe_cli(str(SMALL), ["rollout.n=8"]) == 1
    assert capsys.readouterr().err.splitlines()[-1] == (
        f"{SMALL}: cannot compose: rollout.n is not a key of this recipe (rollout.n=8); did you mean "
        "actor_rollout_ref.rollout.n or reward.reward_model.rollout.n?"
    )


def test_a_plus_key_a_verl_dataclass_lacks_names_its_nearest_field():
    config = compose_recipe(str(SMALL), ["+actor_rollout_ref.rollout.nn=3"])
    choices = set(compose_recipe(str(SMALL), ["+actor_rollout_ref.rollout.nn=3"], True).hydra.runtime.choices)
    problems, _ = unread_additions(config, ["+actor_rollout_ref.rollout.nn=3"],
                                   lambda o: compose_recipe(str(SMALL), o), choices.__contains__)
    assert problems == [
        "+actor_rollout_ref.rollout.nn=3: nothing reads actor_rollout_ref.rollout.nn: actor_rollout_ref.rollout is "
        "verl's RolloutConfig (verl.workers.config.RolloutConfig), which has no field 'nn'; did you mean "
        "actor_rollout_ref.rollout.n?; set actor_rollout_ref.rollout.n=3, without '+'"
    ]


@pytest.fixture
def tiny_recipe(tmp_path):
    """A real hydra config folder: a root that interpolates ``${scale}``, a verl dataclass section, a
    plain section and a config group."""
    (tmp_path / "main.yaml").write_text(
        "defaults:\n  - _self_\n"
        "algorithm:\n  _target_: verl.trainer.config.AlgoConfig\n  gamma: 1.0\n"
        "trainer:\n  total_epochs: 1\n"
        "lr: ${oc.select:scale,1}\n"
    )
    (tmp_path / "extra").mkdir()
    (tmp_path / "extra" / "big.yaml").write_text("# @package _global_\ntrainer:\n  total_epochs: 9\n")

    def run(overrides):
        GlobalHydra.instance().clear()
        with initialize_config_dir(config_dir=str(tmp_path), version_base=None):
            full = compose("main", overrides=overrides, return_hydra_config=True)
            choices = set(full.hydra.runtime.choices)
            return unread_additions(full, overrides, lambda o: compose("main", overrides=o), choices.__contains__)

    return run


@pytest.mark.parametrize("override", [
    "+scale=2",                         # a new top-level key that the recipe interpolates
    "+algorithm.lam=0.9",               # AlgoConfig has a lam field the YAML does not set
    "+trainer.resume_from=/x",          # a plain section: verl may .get() it; no near sibling
    "+extra=big",                       # a config group option, not a key
    "++trainer.total_epochs=3",         # ++ of an existing key
])
def test_additions_that_something_reads_pass(tiny_recipe, override):
    assert tiny_recipe([override]) == ([], [])


def test_additions_that_nothing_reads_are_problems_and_near_misses_warnings(tiny_recipe):
    problems, warnings = tiny_recipe(["+gamma=0.5", "+algorithm.gama=0.5", "+trainer.total_epoch=2"])
    assert problems == [
        "+gamma=0.5: nothing reads gamma: the recipe has no 'gamma' section and verl reads only its own top-level "
        "sections; did you mean algorithm.gamma?; set algorithm.gamma=0.5, without '+'",
        "+algorithm.gama=0.5: nothing reads algorithm.gama: algorithm is verl's AlgoConfig "
        "(verl.trainer.config.AlgoConfig), which has no field 'gama'; did you mean algorithm.gamma?; set "
        "algorithm.gamma=0.5, without '+'",
    ]
    assert warnings == ["+trainer.total_epoch=2: trainer has no key 'total_epoch' in the recipe (verl reads it only "
                        "if its code asks for that name); did you mean trainer.total_epochs?"]


NAME = st.from_regex(r"[a-z]{1,6}", fullmatch=True)
TREE = st.recursive(st.integers(0, 3), lambda kids: st.dictionaries(NAME, kids, min_size=1, max_size=4), max_leaves=12)


@settings(max_examples=150, deadline=None)
@given(tree=st.dictionaries(NAME, TREE, min_size=1, max_size=5), data=st.data())
def test_the_nearest_keys_of_a_real_keys_tail_are_real_and_never_empty(tree, data):
    config = OmegaConf.create(tree)
    paths = [p for p in _leaf_paths(tree) if p.count(".") >= 1]
    if not paths:
        return
    path = data.draw(st.sampled_from(paths))
    parts = path.split(".")
    cut = data.draw(st.integers(1, len(parts) - 1))
    tail = ".".join(parts[cut:])
    found = nearest_keys(config, tail)
    assert found, (tail, tree)
    assert all(OmegaConf.select(config, key, default=None) is not None for key in found), found
    if parts[cut] not in config and len([p for p in _leaf_paths(tree) if p.endswith("." + tail)]) == 1 \
            and not nearest_keys_by_typo(config, tail):
        assert found == [path]


def nearest_keys_by_typo(config, tail):
    from verl_mopd.checks.overrides import nearest_key

    return nearest_key(config, tail)


def _leaf_paths(tree, prefix=""):
    for key, value in tree.items():
        yield f"{prefix}{key}"
        if isinstance(value, dict):
            yield from _leaf_paths(value, f"{prefix}{key}.")


# ------------------------------------------------------------------ metrics the reward cannot produce


def test_a_gate_metric_typo_is_one_line_naming_the_allowed_ones():
    problems, _ = validate(compose_recipe(str(SMALL), ["mopd.gate_metric=rm_score"]))
    assert problems == [
        "mopd.gate_metric='rm_score': the configured reward (pkg://verl_mopd.rewards.score:compute_score) does not "
        "produce it; did you mean rm_scores? allowed: rm_scores, score, acc, thought_length, parsed, action_match, "
        "args_match"
    ]
    for fine in ("rm_scores", "acc", "score"):
        problems, _ = validate(compose_recipe(str(SMALL), [f"mopd.gate_metric={fine}"]))
        assert not [p for p in problems if "gate_metric" in p], problems
    problems, _ = validate(compose_recipe(str(SMALL), ["mopd.gate_metric=rm_score", "mopd.enable=false"]))
    assert not [p for p in problems if "gate_metric" in p]  # the gate is off: nothing reads it


def test_a_filter_metric_typo_is_refused_too():
    problems, _ = validate(compose_recipe(str(SMALL), ["trainer.v1.sampler.sampler_kwargs.filter_metric=ac"]))
    assert ("trainer.v1.sampler.sampler_kwargs.filter_metric='ac': the configured reward "
            "(pkg://verl_mopd.rewards.score:compute_score) does not produce it; did you mean acc? allowed: reward, "
            "score, acc, thought_length, parsed, action_match, args_match") in problems


def test_another_reward_functions_metrics_are_not_guessed():
    problems, _ = validate(compose_recipe(str(MULTI_DOMAIN), ["mopd.gate_metric=anything_it_returns"]))
    assert not [p for p in problems if "gate_metric" in p], problems


# ------------------------------------------------------------------ what the quota sampler cannot serve


@pytest.mark.parametrize("overrides, problem", [
    (["trainer.v1.sampler.custom_sampler.name=QuotaReplayBufferAsync"],
     "trainer.v1.sampler.custom_sampler.name=QuotaReplayBufferAsync: the async trainers' sampler; allowed with "
     "trainer.v1.trainer_mode=mopd_sync: QuotaReplayBuffer"),
    (["trainer.v1.sampler.custom_sampler.name=QuotaReplayBuffr"],
     "trainer.v1.sampler.custom_sampler.name=QuotaReplayBuffr: not a sampler of verl_mopd.batching.sampler; "
     "allowed with trainer.v1.trainer_mode=mopd_sync: QuotaReplayBuffer"),
    (["algorithm.filter_groups.enable=false"],
     "data.gen_batch_size=None (so verl draws prompts 32 at a time) with the sync quota sampler and "
     "algorithm.filter_groups.enable=false: the sampler refills any number of prompts, and verl's "
     "_next_train_batch refuses a count that is not a multiple of it; allowed: algorithm.filter_groups.enable=true "
     "(verl then draws one prompt at a time) or data.gen_batch_size=1"),
])
def test_what_the_quota_sampler_cannot_serve_is_refused(overrides, problem):
    problems, _ = validate(compose_recipe(str(SMALL), overrides))
    assert problem in problems, problems


def test_what_it_can_serve_passes():
    for overrides in (["algorithm.filter_groups.enable=false", "data.gen_batch_size=1"],
                      ["actor_rollout_ref.rollout.n=2"]):
        problems, _ = validate(compose_recipe(str(SMALL), overrides))
        assert not [p for p in problems if "sampler" in p or "gen_batch_size" in p], problems


def test_the_quota_sampler_counts_the_routing_column():
    problems, _ = validate(compose_recipe(str(SMALL), ["trainer.v1.sampler.sampler_kwargs.domain_key=domain"]))
    assert ("trainer.v1.sampler.sampler_kwargs.domain_key='domain' but mopd.routing_key='platform': the quotas "
            "would count one column while the teachers, the gate and the metrics read the other; set "
            "domain_key: ${mopd.routing_key}") in problems
    problems, _ = validate(compose_recipe(str(SMALL), ["~trainer.v1.sampler.sampler_kwargs.domain_key",
                                                       "mopd.routing_key=device"]))
    assert any(p.startswith("trainer.v1.sampler.sampler_kwargs.domain_key='platform' (its default) but "
                            "mopd.routing_key='device'") for p in problems), problems
    problems, _ = validate(compose_recipe(str(SMALL)))  # the recipes interpolate it
    assert not [p for p in problems if "domain_key" in p]


# ------------------------------------------------------------------ a real launch


def test_the_callback_reports_every_problem_at_once():
    with pytest.raises(SystemExit) as stop:
        CheckRecipe().on_job_start(compose_recipe(str(SMALL), ["mopd.gate_metric=rm_score"]))
    assert str(stop.value.code).startswith("verl-mopd: mopd.gate_metric='rm_score': the configured reward")


def test_stock_main_ppo_refuses_both_mistakes_before_starting_ray(tmp_path):
    out = subprocess.run(
        [sys.executable, "-m", "verl.trainer.main_ppo", f"--config-path={SMALL.parent}", f"--config-name={SMALL.stem}",
         "+rollout.n=8", "mopd.gate_metric=rm_score"],
        capture_output=True, text=True, timeout=300, cwd=tmp_path,  # hydra writes outputs/ in the cwd
    )
    assert out.returncode != 0
    assert ("verl-mopd: the config has problems:\n"
            "  - +rollout.n=8: nothing reads rollout.n: the recipe has no 'rollout' section") in out.stderr, \
        out.stderr[-3000:]
    assert "  - mopd.gate_metric='rm_score': the configured reward" in out.stderr
    assert "Started a local Ray instance" not in out.stderr
