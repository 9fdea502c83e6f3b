"""examples/multi_domain_text: three text domains, three server teachers, the same router, gate and loss.

Nothing in the core is GUI-specific: the routing column is ``domain`` with three (and, in the
property tests, up to six) values, through the router, the gate and ``verl-mopd validate-recipe``.
"""

import importlib.util
import re
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from tensordict import NonTensorStack, TensorDict

from verl_mopd.config import MOPDConfig
from verl_mopd.teachers.router import UnknownRouteError, merge, routing_keys, split
from verl_mopd.trainer import hooks
from verl_mopd.trainer.gate import compute_reward_gate
from verl_mopd.checks.recipe_cli import compose_recipe, validate_recipe_cli
from verl_mopd.checks.validate import run_teachers, validate

ROOT = Path(__file__).parents[2]
HERE = ROOT / "examples" / "multi_domain_text"
RECIPE = HERE / "recipe.yaml"
DOMAINS = ["arithmetic", "strings", "sorting"]


def _load(name: str):
    spec = importlib.util.spec_from_file_location(f"multi_domain_{name}", HERE / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


make_data, reward = _load("make_data"), _load("reward")


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
    out = tmp_path_factory.mktemp("mdt")
    make_data.main(["--out", str(out), "--per-domain", "20", "--val-per-domain", "4"])
    return out


def _compose(data_dir, overrides=()):
    return compose_recipe(str(RECIPE), [f"data.train_files={data_dir}/train.parquet",
                                        f"data.val_files={data_dir}/val.parquet", *overrides])


# ------------------------------------------------------------------------------ data and reward


def test_data_is_seeded_balanced_and_has_the_routing_column(data_dir):
    table = pq.read_table(data_dir / "train.parquet")
    rows = table.to_pylist()
    assert [r["domain"] for r in rows[:6]] == DOMAINS * 2 and len(rows) == 60
    assert set(table.column_names) >= {"data_source", "prompt", "ability", "reward_model", "extra_info", "domain"}
    assert all(r["extra_info"]["domain"] == r["domain"] for r in rows)
    rows = make_data.make_rows(5, 0, "train")
    assert rows == make_data.make_rows(5, 0, "train") != make_data.make_rows(5, 1, "train")
    with pytest.raises(ValueError, match=r"domains \['poetry'\] unknown"):
        make_data.make_rows(1, 0, "train", ("arithmetic", "poetry"))


def _independent_answer(domain: str, question: str) -> str:
    if domain == "arithmetic":
        a, op, b, c = re.fullmatch(r"Compute (\d+) ([+-]) (\d+) \* (\d+)\.", question).groups()
        return str(int(a) + (1 if op == "+" else -1) * int(b) * int(c))
    if domain == "strings":
        return "".join(reversed(re.fullmatch(r'Reverse the letters of "(\w+)"\.', question).group(1)))
    return " ".join(str(n) for n in sorted(int(x) for x in question.split(":")[1].split()))


@settings(max_examples=30, deadline=None)
@given(seed=st.integers(0, 10_000))
def test_every_ground_truth_is_right_and_scores_plus_one(seed):
    for row in make_data.make_rows(3, seed, "train"):
        question, truth = row["prompt"][-1]["content"], row["reward_model"]["ground_truth"]
        assert truth == _independent_answer(row["domain"], question)
        assert reward.compute_score(row["data_source"], f"<think>x</think>Answer: {truth}", truth)["score"] == 1.0


@pytest.mark.parametrize("response, truth, score, acc", [
    ("Answer: 61", "61", 1.0, 1.0),
    ("Let me think.\nAnswer:   2 4  7 9 ", "2 4 7 9", 1.0, 1.0),            # whitespace collapsed
    ("Answer: 60\nwait, no.\nAnswer: 61.", "61", 1.0, 1.0),               # the last answer counts
    ("<think>Answer: 61</think> I give up.", "61", -1.0, 0.0),            # answers inside the thought ignored
    ("Answer: Tenalp", "tenalp", -0.5, 0.0),                              # case kept
    ("Answer: 62", "61", -0.5, 0.0),
    ("61", "61", -1.0, 0.0),                                              # no Answer: line
])
def test_reward_levels(response, truth, score, acc):
    assert reward.compute_score("multi_domain_text/x", response, truth) == {"score": score, "acc": acc}


# ------------------------------------------------------------------------------ the recipe


def test_recipe_validates_with_three_domains_and_three_teachers(data_dir, capsys):
    overrides = [f"data.train_files={data_dir}/train.parquet", f"data.val_files={data_dir}/val.parquet"]
    assert validate_recipe_cli(str(RECIPE), overrides) == 0, capsys.readouterr().err
    # the README's "five warnings": one per path not on this machine (3 placeholder teachers, the hub id)
    # and one that the teachers' tokenizers could not be compared with the student's (not local)
    warned = [line for line in capsys.readouterr().err.splitlines() if line.startswith("WARNING:")]
    missing = [w for w in warned if "does not exist on this machine" in w]
    assert len(warned) == 5 and len(missing) == 4, warned
    assert sum("distillation.teacher_models." in w for w in missing) == 3 and "Qwen/Qwen3-0.6B" in missing[-1]
    assert any("not compared with the student's" in w and "Qwen/Qwen3-0.6B" in w for w in warned)
    cfg = _compose(data_dir)
    mopd = hooks.mopd_config_from(cfg)
    assert mopd.teachers == {} and mopd.routing_key == "domain"  # declared once: in verl's block
    assert list(run_teachers(cfg, mopd)) == DOMAINS
    assert cfg.trainer.v1.trainer_mode == "mopd_sync" and cfg.distillation.distillation_loss.loss_mode == "mopd_k3"


@pytest.mark.parametrize("overrides, message", [
    # the README's one override: the recipe still composes and the domain left without a teacher is named
    (["~distillation.teacher_models.sorting", "distillation.nnodes=2"],
     "train data has domain value(s) ['sorting'] with no teacher; configured: ['arithmetic', 'strings']"),
    (["~distillation.teacher_models.sorting", "distillation.nnodes=2"],
     "val data has domain value(s) ['sorting'] with no teacher"),
    (["~distillation.teacher_models.sorting"],  # verl's pool-size error and ours, both
     "train data has domain value(s) ['sorting'] with no teacher; configured: ['arithmetic', 'strings']"),
    (["+distillation.teacher_models.poetry={key: poetry, model_path: /p, num_replicas: 1}", "distillation.nnodes=4"],
     "teacher(s) ['poetry'] have no samples in the train data"),
    (["distillation.teacher_key=data_source"],
     "distillation.teacher_key='data_source' but mopd.routing_key='domain'"),
    (["+mopd.teachers.poetry={model_path: /p}"], "one teacher system per run"),
    (["distillation.nnodes=4"], "must match the distillation resource pool size"),
    (["actor_rollout_ref.rollout.temperature=0.6"], "temperature=0.6: must be 1.0"),
])
def test_recipe_problems_are_named(data_dir, overrides, message):
    problems, _ = validate(_compose(data_dir, overrides))
    assert any(message in p for p in problems), problems


def test_the_teachers_validation_reads_are_the_ones_verls_trainer_builds(data_dir):
    """The recipe declares its teachers once, in verl's block (what stock main_ppo reads); the keys
    validation checks against the data are the keys of verl's own DistillationConfig."""
    from verl.utils.config import omega_conf_to_dataclass

    cfg = _compose(data_dir)
    verl_cfg = omega_conf_to_dataclass(cfg.distillation)  # verl's own checks: keys, pool sum
    ours = run_teachers(cfg, hooks.mopd_config_from(cfg))
    assert verl_cfg.teacher_key == cfg.mopd.routing_key == "domain"
    assert sorted(verl_cfg.teacher_models) == sorted(ours) == sorted(DOMAINS)
    for key, t in verl_cfg.teacher_models.items():
        assert t.model_path == ours[key].model_path and t.world_size == 1
        assert t.inference.skip_tokenizer_init and t.inference.name == "sglang"
    assert verl_cfg.distillation_loss.loss_mode == "mopd_k3"


def test_verl_loads_the_reward_function_from_the_recipe(data_dir, monkeypatch):
    from verl.trainer.ppo.reward import get_custom_reward_fn

    monkeypatch.chdir(ROOT)  # the recipe's paths are relative to the repository root, where it is launched
    fn = get_custom_reward_fn(_compose(data_dir))
    row = pq.read_table(data_dir / "val.parquet").slice(0, 1).to_pylist()[0]
    truth = row["reward_model"]["ground_truth"]
    assert fn(row["data_source"], f"Answer: {truth}", truth, row["extra_info"]) == {"score": 1.0, "acc": 1.0}


# ------------------------------------------------------------------------------ N >= 3 routing values


@st.composite
def _batches(draw):
    """A step of whole GRPO groups over 3-6 routing values (all present), each group of one domain."""
    n_domains = draw(st.integers(3, 6))
    domains = [f"d{i}" for i in range(n_domains)]
    n_groups = draw(st.integers(n_domains, 12))
    group_domain = [domains[i % n_domains] for i in range(n_groups)]
    draw(st.randoms()).shuffle(group_domain)
    size = draw(st.integers(1, 5))
    acc = draw(st.lists(st.sampled_from([0.0, 1.0]), min_size=n_groups * size, max_size=n_groups * size))
    order = draw(st.permutations(range(n_groups * size)))  # rows of a group need not be adjacent
    rows = [(f"g{k // size}", group_domain[k // size], acc[k]) for k in order]
    tau = draw(st.sampled_from([0.0, 0.25, 0.5, 0.75]))
    return domains, rows, tau


@settings(max_examples=60, deadline=None)
@given(_batches())
def test_router_and_gate_with_three_to_six_routing_values(case):
    domains, rows, tau = case
    uids, keys, acc = (list(x) for x in zip(*rows))
    data = TensorDict({
        "uid": NonTensorStack(*uids), "domain": NonTensorStack(*keys), "acc": torch.tensor(acc),
        "response_mask": torch.ones(len(rows), 3, dtype=torch.int64)}, batch_size=len(rows))

    # router: every row to its own domain's teacher, back in batch order; unknown values refused
    index = split(routing_keys(data, "domain"), known=domains)
    assert sorted(index) == sorted(domains)
    parts = {d: torch.as_tensor(r, dtype=torch.float64) for d, r in index.items()}
    assert merge(parts, index, len(rows)).tolist() == list(range(len(rows)))
    assert all(keys[i] == d for d, r in index.items() for i in r)
    with pytest.raises(UnknownRouteError, match=r"^domain value\(s\) \['.*'\] have no teacher.*the data's `domain` column"):
        split(routing_keys(data, "domain"), known=domains[:-1], field="domain")

    # gate: float64 group means, whole groups across the batch; metrics per routing value
    cfg = MOPDConfig(tau_kl=tau, gate_metric="acc", routing_key="domain")
    fields, metrics = compute_reward_gate(cfg, data)
    mean = {u: np.mean([a for v, a in zip(uids, acc) if v == u], dtype=np.float64) for u in set(uids)}
    want = [float(mean[u] <= tau) for u in uids]
    assert fields["mopd_kl_mask"].tolist() == want
    for d in set(keys):
        on = [w for w, k in zip(want, keys) if k == d]
        assert metrics[f"mopd/kl_mask_on_fraction/{d}"] == pytest.approx(np.mean(on))


def test_dry_run_prints_one_row_per_domain(data_dir, capsys):
    summary = _load("dry_run").main(["--data", str(data_dir / "train.parquet"), "--prompts", "30", "--n", "4"])
    out = capsys.readouterr().out
    assert list(summary) == DOMAINS and sum(s["rollouts"] for s in summary.values()) == 120
    # the simulated student is best at arithmetic and worst at sorting: the gate follows
    assert summary["arithmetic"]["kl_on"] < summary["strings"]["kl_on"] <= summary["sorting"]["kl_on"]
    assert all(d in out for d in DOMAINS) and "routed by `domain`" in out
