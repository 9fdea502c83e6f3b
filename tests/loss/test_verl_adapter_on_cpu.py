"""mopd_k3 inside verl 0.9.1: registration, verl's distillation_ppo_loss, the driver-side gate."""

import os
import subprocess
import sys

import numpy as np
import pytest
import torch
from tensordict import NonTensorStack, TensorDict

from verl.trainer.distillation.losses import DISTILLATION_LOSS_REGISTRY, distillation_ppo_loss
from verl.utils import tensordict_utils as tu
from verl.workers.config import ActorConfig, DistillationConfig
from verl.workers.utils.losses import ppo_loss

from _microbatch import build_microbatch
from _tq_memory import InMemoryTQ
from verl_mopd import plugin, verl_loss
from verl_mopd.config import MOPDDistillationLossConfig
from verl_mopd.config import MOPDConfig
from verl_mopd.losses import k3_kl
from verl_mopd.trainer.gate import compute_reward_gate, write_reward_gate
from verl_mopd.verl_loss import compute_mopd_k3

BETA = 0.01


def _configs(strategy="fsdp", **loss_kwargs):
    actor = ActorConfig(strategy=strategy, ppo_mini_batch_size=4, ppo_micro_batch_size_per_gpu=2, rollout_n=1)
    loss = MOPDDistillationLossConfig(distillation_loss_coef=BETA, **loss_kwargs)
    return actor, DistillationConfig(enabled=False, distillation_loss=loss)


# ------------------------------------------------------------------- registration


def _run(code, **env):
    full_env = {**os.environ, **env}
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=full_env, timeout=300)


def test_plain_import_verl_registers_mopd_k3_through_the_entry_point():
    out = _run(
        "import verl\n"
        "from verl.trainer.distillation.losses import DISTILLATION_LOSS_REGISTRY as R\n"
        "from verl_mopd.verl_loss import compute_mopd_k3\n"
        "assert R['mopd_k3'] is compute_mopd_k3, R.get('mopd_k3')\n"
        "print('registered')"
    )
    assert out.returncode == 0, out.stderr[-2000:]
    assert "registered" in out.stdout


def test_the_entry_point_imports_nothing_of_verls_trainer_and_every_registry_still_fills():
    """`import verl` costs what verl costs: the registries fill when verl's modules holding them load."""
    out = _run(
        "import sys, verl\n"
        "late = ('verl.trainer.distillation', 'verl.trainer.ppo.v1', 'verl_mopd.losses', 'verl_mopd.verl_loss',\n"
        "        'verl_mopd.trainer.mopd_trainer')\n"
        "print('after import verl:', [m for m in late if m in sys.modules])\n"
        "from verl.trainer.ppo.v1 import get_trainer_cls\n"
        "from verl_mopd.trainer import mopd_trainer as m\n"
        "names = {'mopd_sync': m.MOPDTrainerSync, 'mopd_separate_async': m.MOPDTrainerSeparateAsync,\n"
        "         'mopd_colocate_async': m.MOPDTrainerColocateAsync}\n"
        "print('trainers:', all(get_trainer_cls(n) is c for n, c in names.items()))\n"
        "from verl.trainer.distillation.losses import DISTILLATION_LOSS_REGISTRY as R\n"
        "from verl_mopd.verl_loss import compute_mopd_k3\n"
        "print('loss:', R['mopd_k3'] is compute_mopd_k3)\n"
    )
    assert out.returncode == 0, out.stderr[-2000:]
    lines = out.stdout.splitlines()
    assert lines[0] == "after import verl: []"
    assert lines[1:] == ["trainers: True", "loss: True"]


def _fake_package(root, name, body="VALUE = 1\n"):
    (root / name).mkdir()
    (root / name / "__init__.py").write_text(body)


def test_after_import_runs_once_the_module_has_run_and_a_failure_warns(tmp_path, monkeypatch):
    monkeypatch.syspath_prepend(str(tmp_path))
    _fake_package(tmp_path, "mopd_fake_a")
    _fake_package(tmp_path, "mopd_fake_b")
    seen = []
    plugin.after_import("mopd_fake_a", lambda: seen.append(sys.modules["mopd_fake_a"].VALUE))
    assert seen == []
    import mopd_fake_a  # noqa: F401

    assert seen == [1]  # right after the module's code, with its names defined
    plugin.after_import("mopd_fake_a", lambda: seen.append("now"))
    assert seen == [1, "now"]  # already imported: at once

    def fail():
        raise ValueError("taken")

    plugin.after_import("mopd_fake_b", fail)
    with pytest.warns(RuntimeWarning, match="verl-mopd plugin failed to register.*ValueError: taken"):
        import mopd_fake_b
    assert mopd_fake_b.VALUE == 1  # the failure did not break the import itself
    assert not {"mopd_fake_a", "mopd_fake_b"} & set(plugin._HOOK.pending)  # both ran: nothing left for them


def test_a_strict_after_import_callback_fails_the_import(tmp_path, monkeypatch):
    monkeypatch.syspath_prepend(str(tmp_path))
    _fake_package(tmp_path, "mopd_fake_strict")

    def fail():
        raise ValueError("the harness cannot install")

    plugin.after_import("mopd_fake_strict", fail, strict=True)
    with pytest.raises(ValueError, match="the harness cannot install"):
        import mopd_fake_strict  # noqa: F401
    assert "mopd_fake_strict" not in plugin._HOOK.pending and fail not in plugin._HOOK.strict
    if not plugin._HOOK.pending:  # (other hooks, e.g. verl's v1 trainer not imported yet, may still wait)
        assert plugin._HOOK not in sys.meta_path  # nothing pending: the finder is gone
    monkeypatch.delitem(sys.modules, "mopd_fake_a")
    monkeypatch.delitem(sys.modules, "mopd_fake_b")


def test_disabled_plugins_give_a_clear_error_and_a_failing_plugin_warns():
    code = (
        "import warnings, verl\n"
        "from verl_mopd import verl_loss\n"
        "assert not verl_loss.is_registered()\n"
        "try:\n"
        "    verl_loss.require_registered('the driver')\n"
        "except RuntimeError as e:\n"
        "    print('ERROR:', e)\n"
        "from verl.trainer.distillation.losses import DISTILLATION_LOSS_REGISTRY as R\n"
        "R['mopd_k3'] = print  # someone else's loss under our name: registration must fail loudly\n"
        "with warnings.catch_warnings(record=True) as caught:\n"
        "    warnings.simplefilter('always')\n"
        "    try:\n"
        "        import verl_mopd._verl_plugin\n"
        "    except RuntimeError:\n"
        "        pass\n"
        "print('WARNED:', [str(w.message) for w in caught])\n"
    )
    out = _run(code, VERL_USE_EXTERNAL_PLUGINS="none")
    assert out.returncode == 0, out.stderr[-2000:]
    assert "loss_mode=mopd_k3 is not registered in the driver" in out.stdout
    assert "VERL_USE_EXTERNAL_PLUGINS" in out.stdout
    assert "verl-mopd plugin failed to register" in out.stdout


def test_register_is_idempotent():
    plugin.register()
    plugin.register()
    assert DISTILLATION_LOSS_REGISTRY["mopd_k3"] is compute_mopd_k3
    verl_loss.require_registered()


def test_loss_config_refuses_settings_that_defeat_mopd_k3():
    with pytest.raises(ValueError, match="use_policy_gradient"):
        MOPDDistillationLossConfig(use_policy_gradient=True)
    with pytest.raises(ValueError, match="loss_max_clamp=10.0"):
        MOPDDistillationLossConfig(loss_max_clamp=10.0)
    with pytest.raises(ValueError, match="k3_linear_above=2.0"):
        MOPDDistillationLossConfig(k3_linear_above=2.0)
    # verl's own config class with use_policy_gradient=True also reaches a clear error in the loss
    from verl.workers.config import DistillationLossConfig

    dc = DistillationConfig(enabled=False, distillation_loss=DistillationLossConfig(loss_mode="mopd_k3"))
    data, model_output, *_ = build_microbatch([2, 3], [3, 2])
    actor, _ = _configs()
    with pytest.raises(ValueError, match="use_policy_gradient=True with loss_mode=mopd_k3"):
        distillation_ppo_loss(actor, dc, model_output=model_output, data=data)


# --------------------------------------------- through verl's distillation_ppo_loss


@pytest.mark.parametrize("layout", ["nested", "padded"])
@pytest.mark.parametrize("strategy", ["fsdp", "megatron"])
def test_registered_loss_through_verl_distillation_ppo_loss(layout, strategy):
    prompt_lens, resp_lens = [3, 5, 2, 4], [4, 2, 6, 3]
    gate = [1.0, 0.0, 1.0, 0.0]
    data, model_output, leaf, teacher, pos = build_microbatch(prompt_lens, resp_lens, layout=layout, kl_mask=gate)
    # non-zero advantages so the PG part is real; it must add, not interact
    adv = [torch.linspace(-1, 1, r, dtype=torch.float64) for r in resp_lens]
    data["advantages"] = (
        torch.nested.as_nested_tensor(adv, layout=torch.jagged)
        if layout == "nested"
        else torch.nested.as_nested_tensor(adv, layout=torch.jagged).to_padded_tensor(0)
    )
    actor, dist = _configs(strategy)
    loss, metrics = distillation_ppo_loss(actor, dist, model_output=model_output, data=data)
    loss.backward()

    n_tokens = sum(resp_lens)
    ref_leaf = leaf.detach().clone().requires_grad_(True)
    ref_kl = sum(k3_kl(ref_leaf[pos[i]][None], teacher[pos[i]][None]).sum() for i in (0, 2)) / n_tokens
    pg_data, pg_out, pg_leaf, *_ = build_microbatch(prompt_lens, resp_lens, layout=layout)
    pg_data["advantages"] = data["advantages"]
    pg_loss, _ = ppo_loss(actor, pg_out, pg_data)
    (ref_total := pg_loss + BETA * ref_kl).backward()
    pg_leaf_grad = pg_leaf.grad

    torch.testing.assert_close(loss, ref_total)
    assert metrics["distillation/loss"].values[0] == pytest.approx(ref_kl.item())
    for i in (1, 3):  # gated off: exactly the PG gradient, zero from the KL
        torch.testing.assert_close(leaf.grad[pos[i]], pg_leaf_grad[pos[i]], rtol=0, atol=0)
    for i in (0, 2):  # gated on: PG + beta * d k3 / d student
        kl_grad = ref_leaf.grad[pos[i]]  # beta * d k3_kl / d student, from the float64 reference
        assert kl_grad.abs().max() > 0
        torch.testing.assert_close(leaf.grad[pos[i]], pg_leaf_grad[pos[i]] + kl_grad)


def test_absent_gate_key_means_kl_on_for_all():
    data, model_output, leaf, teacher, pos = build_microbatch([2, 3], [3, 2])
    actor, dist = _configs()
    per_token, metrics = compute_mopd_k3(actor, dist, model_output, data)
    want = torch.stack([torch.nn.functional.pad(k3_kl(leaf[p], teacher[p]), (0, 3 - len(p))) for p in pos])
    torch.testing.assert_close(per_token * data["response_mask"].to_padded_tensor(0), want)
    assert metrics["mopd/kl_mask_on_fraction"].values[0] == 1.0


def test_kl_on_metric_counts_only_the_tokens_after_the_thought():
    """With ``mopd_kl_start`` (thought skipping) the metric is the mean K3 over the counted tokens:
    float64 reference over the window, not over every response token."""
    data, model_output, leaf, teacher, pos = build_microbatch([2, 3, 4], [5, 4, 3], kl_mask=[1.0, 1.0, 0.0])
    data["mopd_kl_start"] = torch.tensor([2, 0, 1])
    actor, dist = _configs()
    per_token, metrics = compute_mopd_k3(actor, dist, model_output, data)
    counted = [k3_kl(leaf[p], teacher[p]).detach()[s:] for p, s in zip(pos[:2], (2, 0), strict=True)]
    want = torch.cat(counted).mean().item()
    assert metrics["mopd/k3_mean_kl_on"].values[0] == pytest.approx(want, rel=1e-9)
    assert (per_token[0, :2] == 0).all() and (per_token[2] == 0).all()


def test_the_actor_sums_are_exact_totals_over_micro_batches_of_any_size():
    """``mopd/k3_sum_kl_on``, ``mopd/kl_on_tokens`` and ``mopd/kl_on_samples`` (SUM metrics) add up over
    micro-batches of unequal sizes to the float64 totals of the whole batch: the documented K3 times
    the rollout IS weights over the window tokens of the samples whose KL is on, with a "kept"
    normalization weight in the gate divided out, where the MEAN metrics average micro-batch means."""
    from verl.utils.metric import AggregationType

    from verl_mopd.losses import K3_CLAMP_BELOW, K3_LINEAR_ABOVE
    from verl_mopd.testing.smoke import k3_reference  # the smoke's float64 K3, checked here too

    prompt_lens, resp_lens = [2, 3, 4, 2, 5], [5, 4, 3, 6, 2]
    gate = [1.6, 0.0, 1.6, 1.6, 0.0]  # a constant "kept" weight on the samples whose KL is on
    starts = [2, 0, 1, 0, 0]
    weights = [torch.linspace(0.5, 1.5, r, dtype=torch.float64) for r in resp_lens]
    totals = {"mopd/k3_sum_kl_on": 0.0, "mopd/kl_on_tokens": 0.0, "mopd/kl_on_samples": 0.0}
    means = []
    want_sum = want_tokens = 0.0
    for rows in ([0, 1], [2, 3, 4]):  # two micro-batches of unequal size
        data, out, leaf, teacher, pos = build_microbatch([prompt_lens[i] for i in rows], [resp_lens[i] for i in rows],
                                                         kl_mask=[gate[i] for i in rows], seed=rows[0])
        data["mopd_kl_start"] = torch.tensor([starts[i] for i in rows])
        data["rollout_is_weights"] = torch.nested.as_nested_tensor([weights[i] for i in rows], layout=torch.jagged)
        actor, dist = _configs()
        _, metrics = compute_mopd_k3(actor, dist, out, data)
        for key in totals:
            assert metrics[key].aggregation == AggregationType.SUM
            totals[key] += metrics[key].values[0]
        means.append(metrics["mopd/k3_mean_kl_on"].values[0])
        for j, i in enumerate(rows):
            if gate[i]:
                d = (teacher[pos[j]] - leaf.detach()[pos[j]]).double()[starts[i]:]
                want_sum += (k3_reference(d, K3_LINEAR_ABOVE, K3_CLAMP_BELOW) * weights[i][starts[i]:]).sum().item()
                want_tokens += resp_lens[i] - starts[i]
    assert totals["mopd/k3_sum_kl_on"] == pytest.approx(want_sum, rel=1e-9)
    assert totals["mopd/kl_on_tokens"] == want_tokens and totals["mopd/kl_on_samples"] == 3
    assert sum(means) / 2 != pytest.approx(want_sum / want_tokens, rel=1e-6)  # why the sums exist


def test_micro_batch_split_invariance_fsdp_and_megatron_conventions():
    """Loss with the global token count: micro-batch losses add up to the mini-batch loss.

    FSDP backpropagates each micro-batch loss as is; Megatron multiplies it by num_micro_batch
    and its pipeline schedule divides by the same number: both accumulate the same gradient.
    """
    prompt_lens, resp_lens, gate = [3, 5, 2, 4, 2, 3], [4, 2, 6, 3, 5, 1], [1, 0, 1, 1, 0, 1]
    actor, dist = _configs()
    full, out, leaf, *_ = build_microbatch(prompt_lens, resp_lens, kl_mask=gate, seed=7)
    full_loss, _ = distillation_ppo_loss(actor, dist, model_output=out, data=full)
    full_loss.backward()
    n_tokens = sum(resp_lens)
    # exact invariance on identical tensors: split the full micro-batch along the batch dim
    parts = [[0, 3, 5], [1, 2, 4]]
    n_micro = len(parts)
    seq = [p + r for p, r in zip(prompt_lens, resp_lens)]
    offs = np.concatenate([[0], np.cumsum(seq)])
    fsdp_total, megatron_total = 0.0, 0.0
    fsdp_grad = torch.zeros_like(leaf)
    for part in parts:
        sub = tu.index_select_tensor_dict(full, part)  # how verl cuts micro-batches
        tu.assign_non_tensor(sub, dp_size=1, batch_num_tokens=n_tokens, global_batch_size=len(prompt_lens))
        flat = leaf.detach().clone().requires_grad_(True)
        rows = torch.cat([torch.arange(offs[i], offs[i + 1]) for i in part])
        sub_out = {"log_probs": torch.nested.nested_tensor_from_jagged(
            flat[rows], torch.tensor([0] + [seq[i] for i in part]).cumsum(0))}
        loss, _ = distillation_ppo_loss(actor, dist, model_output=sub_out, data=sub)
        (loss * n_micro / n_micro).backward()  # megatron: x num_micro_batch, the schedule divides
        fsdp_total += loss.item()
        megatron_total += (loss * n_micro).item() / n_micro
        fsdp_grad += flat.grad
    assert fsdp_total == pytest.approx(full_loss.item(), rel=1e-12)
    assert megatron_total == pytest.approx(full_loss.item(), rel=1e-12)
    torch.testing.assert_close(fsdp_grad, leaf.grad)


def test_a_micro_batch_of_padding_rows_only_trains_like_the_rest():
    """N2: verl pads a step whose groups lost samples with synthetic rows (response_mask all 0); four
    of them in one fixed-size micro-batch made verl's ``distillation_loss`` raise (``.min()`` of no
    token). The trainer's loss (``hooks.distillation_loss_fn``) trains through it: the micro-batch
    losses and gradients add up to those of the whole mini-batch in one micro-batch. (That the trainer
    gives the actor this function: test_mopd_trainer_on_cpu::test_distillation_loss_fn_for_worker_backend_teachers.)"""
    from verl_mopd.verl_loss import distillation_ppo_loss_on_any_micro_batch

    prompt_lens, resp_lens, gate = [3, 5, 2, 4, 7, 7, 7, 7], [4, 2, 6, 3, 1, 1, 1, 1], [1, 0, 1, 1, 0, 0, 0, 0]
    actor, dist = _configs("megatron")
    full, out, leaf, *_ = build_microbatch(prompt_lens, resp_lens, kl_mask=gate, seed=11)
    masks = [torch.ones(r, dtype=torch.int64) * (i < 4) for i, r in enumerate(resp_lens)]  # rows 4-7: padding
    full["response_mask"] = torch.nested.as_nested_tensor(masks, layout=torch.jagged)
    adv = [torch.linspace(-1, 1, r, dtype=torch.float64) * (i < 4) for i, r in enumerate(resp_lens)]
    full["advantages"] = torch.nested.as_nested_tensor(adv, layout=torch.jagged)
    n_tokens = sum(resp_lens[:4])
    tu.assign_non_tensor(full, dp_size=1, batch_num_tokens=n_tokens, global_batch_size=len(resp_lens))
    full_loss, _ = distillation_ppo_loss(actor, dist, model_output=out, data=full)
    full_loss.backward()

    seq = [p + r for p, r in zip(prompt_lens, resp_lens)]
    offs = np.concatenate([[0], np.cumsum(seq)])
    total, grad, logged = 0.0, torch.zeros_like(leaf), []
    for part in ([0, 1, 2, 3], [4, 5, 6, 7]):  # micro 4, the recipe's size; the second is padding only
        sub = tu.index_select_tensor_dict(full, part)
        tu.assign_non_tensor(sub, dp_size=1, batch_num_tokens=n_tokens, global_batch_size=len(resp_lens))
        flat = leaf.detach().clone().requires_grad_(True)
        rows = torch.cat([torch.arange(offs[i], offs[i + 1]) for i in part])
        sub_out = {"log_probs": torch.nested.nested_tensor_from_jagged(
            flat[rows], torch.tensor([0] + [seq[i] for i in part]).cumsum(0))}
        if part[0] == 4:
            with pytest.raises(RuntimeError, match="numel\\(\\) == 0"):  # verl's own function, unchanged
                distillation_ppo_loss(actor, dist, model_output=sub_out, data=sub)
        loss, metrics = distillation_ppo_loss_on_any_micro_batch(actor, dist, model_output=sub_out, data=sub)
        loss.backward()
        total += loss.item()
        grad += flat.grad
        logged.append(metrics)
    assert total == pytest.approx(full_loss.item(), rel=1e-12)
    torch.testing.assert_close(grad, leaf.grad)
    assert logged[1]["distillation/loss"].values == [0.0]
    assert {"actor/pg_loss", "distillation/loss_min"} <= set(logged[0])
    # the padding-only micro-batch logs every key, so verl's data-parallel aggregation works when one
    # rank gets it and another does not (Metric.aggregate_dp refuses unequal value counts)
    assert set(logged[1]) == set(logged[0])
    from verl.utils.metric import Metric

    def rank(micros):
        merged = {}
        for m in micros:
            for k, v in m.items():
                merged.setdefault(k, v.init_list()).extend(v)
        return merged

    rank_a, rank_b = rank([logged[0], logged[1]]), rank([logged[0], logged[0]])
    agg = {k: Metric.aggregate_dp([rank_a[k], rank_b[k]]) for k in rank_a}
    assert agg["distillation/loss_min"] == logged[0]["distillation/loss_min"].values[0]
    assert agg["distillation/loss_max"] == logged[0]["distillation/loss_max"].values[0]
    assert agg["mopd/kl_on_tokens"] == pytest.approx(1.5 * logged[0]["mopd/kl_on_tokens"].values[0])


def test_k3_mean_kl_on_is_what_the_docs_say():
    """N12: ``actor/mopd/k3_mean_kl_on`` is, per micro-batch, the rollout-IS-weighted K3 summed over
    the KL-on samples' tokens over their token count, and verl logs the MEAN over micro-batches;
    checked against a float64 formula, and shown to differ from the token mean over the step."""
    import pathlib

    actor, dist = _configs(use_rollout_is_weights=True)
    logged, per_micro, k3_w, tokens = None, [], 0.0, 0
    for seed, (p_lens, r_lens, gate) in enumerate([([3, 2], [6, 5], [1.0, 0.0]), ([2, 4, 3], [1, 2, 2], [1, 1, 0])]):
        data, out, leaf, teacher, pos = build_microbatch(p_lens, r_lens, kl_mask=gate, seed=20 + seed)
        w = [torch.rand(r, dtype=torch.float64) + 0.5 for r in r_lens]
        data["rollout_is_weights"] = torch.nested.as_nested_tensor(w, layout=torch.jagged)
        _, metrics = compute_mopd_k3(actor, dist, out, data)
        on = [i for i, g in enumerate(gate) if g]
        num = sum(float((k3_kl(leaf.detach()[pos[i]], teacher[pos[i]]) * w[i]).sum()) for i in on)
        den = sum(r_lens[i] for i in on)
        per_micro.append(num / den)
        k3_w, tokens = k3_w + num, tokens + den
        if logged is None:
            logged = metrics["mopd/k3_mean_kl_on"]
        else:
            logged.extend(metrics["mopd/k3_mean_kl_on"])  # how verl merges micro-batch metrics
    assert logged.values == pytest.approx(per_micro, rel=1e-9)
    assert logged.aggregate() == pytest.approx(sum(per_micro) / 2, rel=1e-9)  # verl's MEAN aggregation
    assert logged.aggregate() != pytest.approx(k3_w / tokens, rel=1e-3)  # not a token mean over the step
    readme = (pathlib.Path(__file__).parents[2] / "docs" / "reproduce.md").read_text()
    assert "`actor/mopd/k3_mean_kl_on` is, per loss micro-batch, the sum of K3\ntimes the rollout-IS weight" in readme
    assert "verl logs the mean of these\nper-micro-batch values, not a token mean over the step" in readme


# ------------------------------------------------------------ driver-side gate writer


def _store_step(tq, n_groups=3, n=4, *, with_extras=True, seed=0):
    rng = np.random.default_rng(seed)
    keys, rows = [], []
    for gidx in range(n_groups):
        for j in range(n):
            keys.append(f"uid{gidx}_{j}_0")
            r = int(rng.integers(2, 7))
            acc = float(gidx == 2 or (gidx == 1 and j == 0))  # group means: 0, 0.25, 1
            resp = torch.randint(3, 50, (r,))
            resp[0] = 99  # a </think> at position 0 in every response
            rows.append(
                {
                    "uid": f"uid{gidx}",
                    "response_mask": torch.ones(r, dtype=torch.int64),
                    "responses": resp,
                    "rm_scores": torch.nn.functional.pad(torch.tensor([1.0 if acc else -0.5]), (r - 1, 0)),
                    "platform": "mobile" if gidx == 0 else "desktop",
                    "extra_fields": {"reward_extra_info": {"acc": acc, "score": 1.0 if acc else -0.5}},
                }
            )
    td = TensorDict(
        {
            name: (
                torch.nested.as_nested_tensor([r[name] for r in rows], layout=torch.jagged)
                if isinstance(rows[0][name], torch.Tensor)
                else NonTensorStack(*[r[name] for r in rows])
            )
            for name in rows[0]
        },
        batch_size=len(rows),
    )
    return tq.kv_batch_put(keys=keys, partition_id="train", fields=td, tags=[{"status": "success"}] * len(keys))


def test_write_reward_gate_with_an_in_memory_transfer_queue():
    tq = InMemoryTQ()
    batch = _store_step(tq)
    metrics = write_reward_gate(batch, MOPDConfig(tau_kl=0.1, gate_metric="acc"), tq=tq)
    stored = tq.kv_batch_get(keys=batch.keys, partition_id="train", select_fields=["mopd_kl_mask"])
    assert stored["mopd_kl_mask"].tolist() == [1.0] * 4 + [0.0] * 8  # means 0 | 0.25 | 1 vs tau 0.1
    assert tq.calls == ["kv_batch_put", "kv_batch_get", "kv_batch_put", "kv_batch_get"]
    assert metrics["mopd/kl_mask_on_fraction"] == pytest.approx(4 / 12)
    assert metrics["mopd/kl_mask_on_fraction/mobile"] == 1.0
    assert metrics["mopd/kl_mask_on_fraction/desktop"] == 0.0
    assert metrics["mopd/reward_level/mobile/-0.5"] == 1.0  # every mobile rollout failed
    assert metrics["mopd/reward_level/desktop/+1"] == pytest.approx(5 / 8)
    assert metrics["mopd/reward_mean/desktop"] == pytest.approx((5 * 1.0 - 3 * 0.5) / 8)
    assert metrics["mopd/response_length/mobile"] > 0

    # the task score as gate metric: group means -0.5 | -0.125 | 1.0 vs tau 0.0
    write_reward_gate(batch, MOPDConfig(tau_kl=0.0, gate_metric="rm_scores"), tq=tq)
    stored = tq.kv_batch_get(keys=batch.keys, partition_id="train", select_fields=["mopd_kl_mask"])
    assert stored["mopd_kl_mask"].tolist() == [1.0] * 8 + [0.0] * 4


def test_gate_kept_normalization_skip_thought_and_padding():
    tq = InMemoryTQ()
    batch = _store_step(tq, seed=3)
    data = tq.kv_batch_get(
        keys=batch.keys, partition_id="train",
        select_fields=["uid", "response_mask", "responses", "extra_fields", "platform"],
    )
    cfg = MOPDConfig(tau_kl=0.1, normalization="kept", kl_skip_thought=True)
    fields, _ = compute_reward_gate(cfg, data, think_end_token_id=99)
    lens = data["response_mask"].offsets().diff()
    assert fields["mopd_kl_start"].tolist() == [1] * 12
    kept_tokens = (lens[:4] - 1).sum().item()
    w = lens.sum().item() / kept_tokens
    torch.testing.assert_close(fields["mopd_kl_mask"], torch.tensor([w] * 4 + [0.0] * 8))
    with pytest.raises(ValueError, match="think_end_token"):
        compute_reward_gate(cfg, data)

    # verl's batch padding: a padding copy of a group-0 sample must not enter group means
    data2 = tq.kv_batch_get(keys=batch.keys, partition_id="train",
                            select_fields=["uid", "response_mask", "extra_fields"])
    is_padding = [False] * 11 + [True]
    fields, metrics = compute_reward_gate(MOPDConfig(tau_kl=0.1), data2, is_padding=is_padding)
    assert fields["mopd_kl_mask"][-1] == 0.0
    assert metrics["mopd/kl_mask_on_fraction"] == pytest.approx(4 / 11)


def test_the_gate_marks_a_thought_cut_off_at_the_length_limit():
    """N11 on the driver: ``compute_reward_gate`` with the rollout's response length finds the responses
    that hit it without ``</think>`` and starts their KL window past their end."""
    tq = InMemoryTQ()
    batch = _store_step(tq, seed=3)
    data = tq.kv_batch_get(keys=batch.keys, partition_id="train",
                           select_fields=["uid", "response_mask", "responses", "extra_fields"])
    lens = data["response_mask"].offsets().diff()
    rows = [torch.cat([r[:1] * 0 + 5, r[1:]]) for r in data["responses"].unbind(0)]  # remove every </think>
    data["responses"] = torch.nested.as_nested_tensor(rows, layout=torch.jagged)
    limit = int(lens.max())
    cfg = MOPDConfig(tau_kl=1.0, kl_skip_thought=True)
    fields, metrics = compute_reward_gate(cfg, data, think_end_token_id=99, max_response_length=limit)
    width = int(lens.max())
    want = [width if int(n) >= limit else 0 for n in lens]
    assert fields["mopd_kl_start"].tolist() == want and width in want and 0 in want
    assert metrics["mopd/thought_cut_off_fraction"] == pytest.approx(sum(int(n) >= limit for n in lens) / len(lens))


def test_gate_errors_name_the_field():
    tq = InMemoryTQ()
    batch = _store_step(tq)
    with pytest.raises(ValueError, match="mopd.gate_metric='format_ok'"):
        write_reward_gate(batch, MOPDConfig(gate_metric="format_ok"), tq=tq)
    with pytest.raises(ValueError, match="mopd.normalization='tokens'"):
        MOPDConfig(normalization="tokens")
