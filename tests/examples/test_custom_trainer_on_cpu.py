"""examples/custom_trainer: the user's own verl v1 trainer (my_trainer.py), driven through verl's classes.

The trainer is built from the composed recipe by verl's own ``PPOTrainer.__init__`` and its hooks
run against the TransferQueue stand-in (``tests/loss/_tq_memory.py``, the calls verl's trainer
makes). The step's fields then go through the loss verl's actor worker builds
(``distillation_ppo_loss`` from ``distillation.*``), checked against a float64 K3 reference.
"""

import importlib.util
import math
from functools import partial
from pathlib import Path

import my_trainer
import numpy as np
import pytest
import torch
from _tq_memory import InMemoryTQ
from tensordict import NonTensorStack, TensorDict
from verl.trainer.ppo.v1 import PPOTrainerSync, get_trainer_cls, trainer_base
from verl.trainer.ppo.v1.replay_buffer import ReplayBuffer

from verl_mopd.demo.models import build_tokenizer
from verl_mopd.trainer import hooks
from verl_mopd.trainer.mopd_trainer import MOPDTrainerMixin
from verl_mopd.checks.recipe_cli import compose_recipe

ROOT = Path(__file__).parents[2]
EXAMPLE = ROOT / "examples" / "custom_trainer"
MULTI_DOMAIN = ROOT / "examples" / "multi_domain_text" / "recipe.yaml"
DOMAINS = ("arithmetic", "strings", "sorting")
N = 4  # rollouts per prompt


def test_it_is_a_registered_verl_trainer_and_not_ours():
    cls = get_trainer_cls(my_trainer.TRAINER_NAME)
    assert cls is my_trainer.MyMOPDTrainer
    assert issubclass(cls, PPOTrainerSync) and not issubclass(cls, MOPDTrainerMixin)
    my_trainer.register()  # the Ray worker setup hook calls it again: idempotent
    assert get_trainer_cls(my_trainer.TRAINER_NAME) is cls


def test_its_recipe_names_the_trainer_and_the_setup_hook_that_registers_it():
    from ray._common.utils import load_class  # what Ray's worker_process_setup_hook does with the string

    cfg = compose_recipe(str(EXAMPLE / "my_mopd.yaml"))
    assert cfg.trainer.v1.trainer_mode == my_trainer.TRAINER_NAME
    hook = cfg.ray_kwargs.ray_init.runtime_env.worker_process_setup_hook
    assert load_class(hook) is my_trainer.register
    assert hooks.mopd_config_from(cfg).platforms == ["desktop", "mobile"]


def test_keeps_verl_sync_semantics_under_its_own_name():
    trainer = my_trainer.MyMOPDTrainer(compose_recipe(str(EXAMPLE / "my_mopd.yaml")))
    assert trainer.trainer_mode == "sync"
    assert type(trainer.replay_buffer) is ReplayBuffer  # verl picks ReplayBufferAsync for any other name
    assert trainer.mopd_config.tau_kl == 0.5


class _Recorder:
    """Stands in for the GPU-only objects verl's _setup builds (actor worker group, checkpoint manager)
    and records the calls the hooks make on them."""

    def __init__(self):
        self.calls = []

    def __getattr__(self, name):
        return lambda *args, **kwargs: self.calls.append((name, args, kwargs))


def _server_trainer(tokenizer, overrides=()):
    cfg = compose_recipe(str(MULTI_DOMAIN), [f"trainer.v1.trainer_mode={my_trainer.TRAINER_NAME}",
                                             "mopd.kl_skip_thought=true", *overrides])
    trainer = my_trainer.MyMOPDTrainer(cfg)
    trainer.tokenizer = tokenizer  # what verl's _init_tokenizer sets
    trainer.actor_rollout_wg, trainer.checkpoint_manager = _Recorder(), _Recorder()
    trainer.global_steps = 0
    return trainer


def _store_step(tq, think_id: int, seed: int = 0):
    """A step as verl's agent loop stores it: two GRPO groups per domain, N rollouts each, with
    verl's teacher loop's full-sequence ``teacher_logprobs`` (server teachers score at rollout)."""
    g = torch.Generator().manual_seed(seed)
    acc_by_group = [[1, 1, 1, 0], [0, 0, 0, 0], [1, 1, 0, 0], [1, 0, 0, 0], [1, 1, 1, 1], [0, 1, 0, 0]]
    keys, rows, truth = [], [], {}
    for group, accs in enumerate(acc_by_group):
        domain = DOMAINS[group % 3]
        for j, acc in enumerate(accs):
            p, r = 3 + (group + j) % 3, 4 + (group * j) % 5
            responses = torch.randint(10, 40, (r,), generator=g)
            if j % 2:
                responses[r // 2] = think_id  # the KL starts after it with kl_skip_thought
            prompts = torch.randint(10, 40, (p,), generator=g)
            old = -torch.rand(r, generator=g, dtype=torch.float64) * 3
            teacher_resp = old + torch.randn(r, generator=g, dtype=torch.float64)
            teacher_full = torch.zeros(p + r, 1, dtype=torch.float64)
            teacher_full[p - 1 : p - 1 + r, 0] = teacher_resp  # position t holds log p(token t+1)
            key = f"u{group}_{j}_0"
            keys.append(key)
            truth[key] = {"domain": domain, "group": group, "acc": acc, "teacher": teacher_resp,
                          "p": p, "r": r, "think": r // 2 + 1 if j % 2 else 0}
            rows.append({
                "input_ids": torch.cat([prompts, responses]), "prompts": prompts, "responses": responses,
                "response_mask": torch.ones(r, dtype=torch.int64),
                "rm_scores": torch.nn.functional.pad(torch.tensor([1.0 if acc else -0.5]), (r - 1, 0)),
                "old_log_probs": old, "teacher_logprobs": teacher_full,
                "uid": f"u{group}", "domain": domain,
                "extra_fields": {"reward_extra_info": {"acc": float(acc)}},
            })
    def column(k):
        values = [row[k] for row in rows]
        if isinstance(values[0], torch.Tensor):
            return torch.nested.as_nested_tensor(values, layout=torch.jagged)
        return NonTensorStack(*values)

    td = TensorDict({k: column(k) for k in rows[0]}, batch_size=len(rows))
    tags = [{"status": "success"}] * len(keys)
    return tq.kv_batch_put(keys=keys, partition_id="train", fields=td, tags=tags), truth


@pytest.fixture()
def step(monkeypatch):
    tq = InMemoryTQ()
    monkeypatch.setattr(trainer_base, "tq", tq)  # the client verl's trainer code calls
    tokenizer = build_tokenizer(["</think> a b c"])
    trainer = _server_trainer(tokenizer)
    batch, truth = _store_step(tq, tokenizer.convert_tokens_to_ids("</think>"))
    return trainer, tq, batch, truth


def test_on_init_end_with_server_teachers_leaves_the_loss_to_verl(step):
    trainer, *_ = step
    trainer.on_init_end()
    assert trainer.mopd_teachers is None  # verl's teacher loop scores; no worker groups
    assert trainer.actor_rollout_wg.calls == []  # verl's worker builds distillation_ppo_loss itself
    assert [c[0] for c in trainer.checkpoint_manager.calls] == ["update_weights"]  # verl's own on_init_end ran


def test_compute_advantage_writes_the_gate_over_whole_groups_then_runs_verl_grpo(step):
    trainer, tq, batch, truth = step
    metrics = {}
    trainer._compute_advantage(batch, metrics)
    out = tq.kv_batch_get(keys=batch.keys, partition_id="train",
                          select_fields=["mopd_kl_mask", "mopd_kl_start", "advantages"])
    group_mean = {g: np.mean([t["acc"] for t in truth.values() if t["group"] == g]) for g in range(6)}
    want = [float(group_mean[truth[k]["group"]] <= 0.5) for k in batch.keys]
    assert out["mopd_kl_mask"].tolist() == want == [0.0] * 4 + [1.0] * 12 + [0.0] * 4 + [1.0] * 4
    assert out["mopd_kl_start"].tolist() == [truth[k]["think"] for k in batch.keys]
    for d in DOMAINS:  # per-domain metrics for every routing value, none GUI-specific
        rows = [k for k in batch.keys if truth[k]["domain"] == d]
        on = [want[batch.keys.index(k)] for k in rows]
        assert metrics[f"mopd/kl_mask_on_fraction/{d}"] == pytest.approx(np.mean(on))
    adv = out["advantages"].to_padded_tensor(0.0)
    assert adv[4:8].abs().sum() == 0 and adv[16:20].abs().sum() == 0  # all-equal groups: verl's GRPO gives 0
    assert adv[0:4].abs().sum() > 0


def test_one_way_to_do_it_our_trainer_writes_the_same_step(monkeypatch):
    from verl_mopd.trainer.mopd_trainer import MOPDTrainerSync

    tokenizer = build_tokenizer(["</think> a b c"])
    results = []
    for mode in ("mopd_sync", my_trainer.TRAINER_NAME):
        tq = InMemoryTQ()
        monkeypatch.setattr(trainer_base, "tq", tq)
        cfg = compose_recipe(str(MULTI_DOMAIN), [f"trainer.v1.trainer_mode={mode}", "mopd.kl_skip_thought=true"])
        trainer = get_trainer_cls(mode)(cfg)
        trainer.tokenizer = tokenizer
        batch, _ = _store_step(tq, tokenizer.convert_tokens_to_ids("</think>"))
        metrics = {}
        trainer._compute_advantage(batch, metrics)
        out = tq.kv_batch_get(keys=batch.keys, partition_id="train",
                              select_fields=["mopd_kl_mask", "mopd_kl_start", "advantages"])
        results.append((type(trainer), metrics, out["mopd_kl_mask"], out["mopd_kl_start"],
                        out["advantages"].to_padded_tensor(0.0)))
    (ours, m1, *t1), (theirs, m2, *t2) = results
    assert ours is MOPDTrainerSync and theirs is my_trainer.MyMOPDTrainer
    assert m1 == m2 and all(torch.equal(a, b) for a, b in zip(t1, t2))


def test_the_stored_step_through_verls_actor_loss_equals_the_float64_reference(step):
    from verl.trainer.distillation.losses import distillation_ppo_loss
    from verl.utils import tensordict_utils as tu
    from verl.utils.config import omega_conf_to_dataclass

    trainer, tq, batch, truth = step
    trainer._compute_advantage(batch, {})
    # what verl's ActorRolloutRefWorker builds with distillation.enabled (engine_workers.py)
    loss_fn = partial(distillation_ppo_loss,
                      config=omega_conf_to_dataclass(trainer.config.actor_rollout_ref.actor),
                      distillation_config=omega_conf_to_dataclass(trainer.config.distillation))
    data = tq.kv_batch_get(keys=batch.keys, partition_id="train", select_fields=[
        "prompts", "responses", "response_mask", "old_log_probs", "advantages", "teacher_logprobs",
        "mopd_kl_mask", "mopd_kl_start"])
    g = torch.Generator().manual_seed(3)
    lengths = [truth[k]["p"] + truth[k]["r"] for k in batch.keys]
    student = (-torch.rand(sum(lengths), generator=g, dtype=torch.float64) * 3).requires_grad_(True)
    offsets = torch.tensor([0, *lengths]).cumsum(0)
    n_tokens = sum(truth[k]["r"] for k in batch.keys)
    tu.assign_non_tensor(data, dp_size=1, batch_num_tokens=n_tokens, global_batch_size=len(batch.keys))
    _, metrics = loss_fn(model_output={"log_probs": torch.nested.nested_tensor_from_jagged(student, offsets)},
                         data=data)

    ref = torch.zeros((), dtype=torch.float64)
    gate = data["mopd_kl_mask"]
    for i, k in enumerate(batch.keys):
        t = truth[k]
        s = student.detach()[offsets[i] + t["p"] - 1 : offsets[i] + t["p"] - 1 + t["r"]]
        d = t["teacher"] - s
        k3 = torch.where(d > 3, math.exp(3) - 4 + math.expm1(3) * (d - 3), torch.exp(d) - d - 1)  # linear above 3
        ref += gate[i] * k3[t["think"]:].sum()
    assert metrics["distillation/loss"].values[0] == pytest.approx((ref / n_tokens).item(), rel=1e-9)
    assert trainer.config.distillation.distillation_loss.loss_mode == "mopd_k3"


def test_pure_torch_script_trains_and_k3_falls(capsys):
    threads = torch.get_num_threads()
    try:  # in this process (the imports are paid already); the script sets torch's thread count
        args = ["--steps", "30", "--teacher-steps", "200", "--log-every", "1"]
        history = _load(EXAMPLE / "pure_torch.py").main(args)
    finally:
        torch.set_num_threads(threads)
    out = capsys.readouterr().out
    k3 = [row["k3"] for row in history]
    assert len(k3) == 30 and all(np.isfinite(k3))
    assert np.mean(k3[-5:]) < 0.8 * np.mean(k3[:5])  # the student moves toward the teacher
    printed = [float(line.split()[4]) for line in out.splitlines() if line[:4].strip().isdigit()]
    assert printed == pytest.approx(k3, abs=5e-4)  # the table shows the K3 it trained with
    assert "teacher, sampled at temperature 1: reward" in out and "s CPU" in out


def _load(path: Path):
    spec = importlib.util.spec_from_file_location(path.stem, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
