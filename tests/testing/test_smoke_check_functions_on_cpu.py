"""The smoke's check functions on hand-made inputs: each passes on what a correct run leaves and fails
on a tampered copy (found by mutation testing, scripts/mutation.sh; docs/reliability.md).

The expected values are written out by hand (float64 K3 ``exp(d) - d - 1`` of small ``d``), not taken
from the smoke's own helpers."""

import json
import math
from pathlib import Path

import pytest
import torch

from verl_mopd.batching.sampler import STATE_FILE  # imports verl: once, at collection, not in a test
from verl_mopd.testing import smoke
from verl_mopd.trainer import hooks


def _k3(d: float) -> float:
    return math.exp(d) - d - 1.0


def _row(uid="u0", *, gate=True, student=(0.0, 0.0, 0.0), teacher=(0.5, -0.25, 1.0), mask=(1, 1, 1),
         kl_start=None, weights=None, score=1.0, advantages=(0.0, 0.0, 0.0)):
    return {
        "uid": uid, "gate": gate, "padding": False, "score": score,
        "student": torch.tensor(student, dtype=torch.float32),
        "teacher": torch.tensor(teacher, dtype=torch.float32),
        "response_mask": torch.tensor(mask),
        "kl_start": kl_start,
        "rollout_is_weights": None if weights is None else torch.tensor(weights, dtype=torch.float64),
        "advantages": torch.tensor(advantages),
    }


# ------------------------------------------------------------------------------------------- K3


def _k3_case():
    rows = [
        # on, thought window from token 1, IS weights: tokens 1 and 2 count, weighted 3 and 0.5
        _row(kl_start=1, weights=(2.0, 3.0, 0.5)),
        # on, thought window from token 1, but token 2 is not a response token: only token 1 counts
        _row(student=(-1.0, -0.5, 0.25), teacher=(-0.75, -1.0, 0.5), mask=(1, 1, 0), kl_start=1),
        # off: nothing of it counts, however large its K3
        _row(gate=False, teacher=(2.0, 2.0, 2.0)),
        # on, no window, no weights, last token masked out
        _row(teacher=(0.25, -0.5, 2.5), mask=(1, 1, 0)),
    ]
    # torch.tensor of float32 rounds the log-probs: use the stored values
    t = [[float(x) for x in r["teacher"]] for r in rows]
    total = 3.0 * _k3(t[0][1]) + 0.5 * _k3(t[0][2]) + _k3(-1.0 - -0.5) + _k3(t[3][0]) + _k3(t[3][1])
    return rows, total, 5, 3


def test_k3_rows_sum_the_weighted_k3_over_the_gated_on_tokens_after_the_thought():
    rows, total, tokens, on = _k3_case()
    got_total, got_tokens, got_on = smoke._k3_rows(rows)
    assert got_total == pytest.approx(total, rel=1e-12)
    assert (got_tokens, got_on) == (tokens, on)
    assert smoke._k3_rows([]) == (0.0, 0, 0)


def test_check_k3_passes_on_the_right_sum_and_fails_on_a_wrong_sum_or_token_count():
    rows, total, tokens, _ = _k3_case()
    m = {"actor/mopd/k3_sum_kl_on": total, "actor/mopd/kl_on_tokens": float(tokens), "actor/mopd/k3_mean_kl_on": 0.5}
    ok, detail = smoke._check_k3(m, rows, 1e-6)
    assert ok, detail
    assert f"over {tokens} tokens" in detail
    assert not smoke._check_k3({**m, "actor/mopd/k3_sum_kl_on": total * (1 + 1e-4)}, rows, 1e-6)[0]
    assert not smoke._check_k3({**m, "actor/mopd/k3_sum_kl_on": total * (1 - 1e-4)}, rows, 1e-6)[0]
    assert not smoke._check_k3({**m, "actor/mopd/kl_on_tokens": float(tokens + 1)}, rows, 1e-6)[0]
    assert not smoke._check_k3({**m, "actor/mopd/kl_on_tokens": float(tokens - 1)}, rows, 1e-6)[0]
    # a relative error equal to the tolerance passes, one just above fails
    got = total * 1.5
    rel = abs(got - total) / abs(total)
    assert smoke._check_k3({**m, "actor/mopd/k3_sum_kl_on": got}, rows, rel)[0]
    assert not smoke._check_k3({**m, "actor/mopd/k3_sum_kl_on": got}, rows, rel * 0.999)[0]


def test_check_k3_names_the_range_of_the_is_weights_of_the_gated_on_tokens():
    rows, total, tokens, _ = _k3_case()
    m = {"actor/mopd/k3_sum_kl_on": total, "actor/mopd/kl_on_tokens": float(tokens), "actor/mopd/k3_mean_kl_on": 0.5}
    assert smoke._check_k3(m, rows, 1e-6)[1].endswith("; IS weights 0.500..3.000")
    rows = [_row(mask=(1, 0, 0))]
    m = {"actor/mopd/k3_sum_kl_on": _k3(0.5), "actor/mopd/kl_on_tokens": 1.0, "actor/mopd/k3_mean_kl_on": 0.0}
    assert smoke._check_k3(m, rows, 1e-6)[1].endswith("<= 1e-06; no IS weights")


def test_check_k3_fails_when_no_token_is_gated_on():
    rows = [_row(gate=False), _row(gate=False)]
    m = {"actor/mopd/k3_sum_kl_on": 0.0, "actor/mopd/kl_on_tokens": 0.0, "actor/mopd/k3_mean_kl_on": 0.0}
    ok, _ = smoke._check_k3(m, rows, 1e-6)
    assert not ok


def test_check_k3_passes_with_a_single_gated_on_token():
    rows = [_row(mask=(1, 0, 0))]
    m = {"actor/mopd/k3_sum_kl_on": _k3(0.5), "actor/mopd/kl_on_tokens": 1.0, "actor/mopd/k3_mean_kl_on": 0.0}
    assert smoke._check_k3(m, rows, 1e-6)[0]


def test_check_k3_with_a_zero_reference_uses_an_absolute_floor():
    rows = [_row(teacher=(0.0, 0.0, 0.0))]  # K3 of d = 0 is exactly 0
    m = {"actor/mopd/k3_sum_kl_on": 1e-13, "actor/mopd/kl_on_tokens": 3.0, "actor/mopd/k3_mean_kl_on": 0.0}
    assert smoke._check_k3(m, rows, 0.2)[0]  # 1e-13 / 1e-12 = 0.1
    assert not smoke._check_k3(m, rows, 0.05)[0]


# ------------------------------------------------------------------------------------------ gate


def test_check_gate_needs_the_driver_the_actor_and_the_dumped_gate_to_agree():
    rows = [_row(gate=True), _row(gate=False), _row(gate=True), _row(gate=True)]
    m = {"mopd/kl_mask_on_fraction": 0.75, "actor/mopd/kl_on_samples": 3.0}
    ok, detail = smoke._check_gate(m, rows)
    assert ok, detail
    assert "3 of 4 samples" in detail
    assert not smoke._check_gate({**m, "actor/mopd/kl_on_samples": 2.0}, rows)[0]  # the actor differs
    assert not smoke._check_gate({"mopd/kl_mask_on_fraction": 0.5, "actor/mopd/kl_on_samples": 2.0}, rows)[0]
    flipped = [dict(r, gate=not r["gate"]) for r in rows]  # the dumped gate differs from both
    assert not smoke._check_gate(m, flipped)[0]


def test_check_gate_refuses_an_actor_fraction_exactly_1e_9_off():
    off = [_row(gate=False)]
    # the driver and the dump agree (0 of 1); the actor's 1e-9 - 0.0 is exactly the bound: not below it
    assert not smoke._check_gate({"mopd/kl_mask_on_fraction": 0.0, "actor/mopd/kl_on_samples": 1e-9}, off)[0]


def test_check_gate_allows_a_difference_below_1e_9_only():
    off = [_row(gate=False)]
    assert smoke._check_gate({"mopd/kl_mask_on_fraction": 0.0, "actor/mopd/kl_on_samples": 5e-10}, off)[0]
    # 1e-9 - 0.0 is exactly 1e-9: not below the bound, for the actor's and for the dumped fraction
    assert not smoke._check_gate({"mopd/kl_mask_on_fraction": 1e-9, "actor/mopd/kl_on_samples": 0.0}, off)[0]
    assert not smoke._check_gate({"mopd/kl_mask_on_fraction": 1e-9, "actor/mopd/kl_on_samples": 1e-9}, off)[0]


def test_check_gate_value_counts_a_group_exactly_at_tau_as_kl_on():
    rows = [_row("u0", score=1.0), _row("u0", score=-0.5), _row("u1", score=1.0, gate=False),
            _row("u1", score=1.0, gate=False)]
    ok, detail = smoke._check_gate_value(rows, {"gate_metric": "acc", "tau_kl": 0.5})
    assert ok, detail
    assert detail == ("KL on for 2 of 4 samples; recomputed (group mean acc <= 0.5): 2; 0 differ; "
                      "2 groups, 1 exactly at tau_kl")


# -------------------------------------------------------------------------------------------- PG


def test_check_pg_needs_a_mixed_group_and_a_non_zero_advantage():
    mixed = [_row("a", score=1.0, advantages=(0.7, 0.7, 0.7)), _row("a", score=-0.5, advantages=(-0.7, -0.7, -0.7)),
             _row("b", score=1.0), _row("b", score=1.0)]
    ok, detail = smoke._check_pg(mixed)
    assert ok, detail
    assert detail.startswith("1 of 2 groups with mixed rewards")
    assert "levels [-0.5, 1.0]" in detail
    # the same scores in other groups: no group is mixed
    split = [_row("a", score=1.0, advantages=(0.7,) * 3), _row("b", score=-0.5, advantages=(-0.7,) * 3)]
    assert not smoke._check_pg(split)[0]
    # mixed rewards but zero advantages (the PG term would be zero)
    flat = [dict(r, advantages=torch.zeros(3)) for r in mixed]
    assert not smoke._check_pg(flat)[0]
    # only a negative advantage is non-zero: |advantage| counts
    neg = [dict(r, advantages=torch.tensor([0.0, -0.1, 0.0])) for r in mixed]
    assert smoke._check_pg(neg)[0]


# ------------------------------------------------------------------------------ platform metrics


def _platform_rows():
    """desktop: 4 samples, 2 with KL on, rewards 1, 1, -0.5, -0.5, lengths 10, 10, 6, 6 (one with the KL mask
    of `kept` normalization, 1.6); mobile: 5 samples, 3 on, rewards -1, -1, -1, -0.5, -0.25, lengths 4 each."""
    def row(platform, gate, score, length):
        return {"platform": platform, "gate": gate, "score": score, "response_mask": torch.ones(length)}

    return ([row("desktop", g, s, n) for g, s, n in ((1.6, 1.0, 10), (1.0, 1.0, 10), (0.0, -0.5, 6), (0.0, -0.5, 6))]
            + [row("mobile", g, s, 4) for g, s in ((1.0, -1.0), (1.0, -1.0), (1.0, -1.0), (0.0, -0.5), (0.0, -0.25))])


def _platform_metrics():
    return {"mopd/kl_mask_on_fraction/desktop": 0.5, "mopd/reward_mean/desktop": 0.25,
            "mopd/response_length/desktop": 8.0, "mopd_teacher/desktop/samples": 4.0,
            "mopd/kl_mask_on_fraction/mobile": 0.6, "mopd/reward_mean/mobile": -0.75,
            "mopd/response_length/mobile": 4.0, "mopd_teacher/mobile/samples": 5.0}


def test_check_platform_metrics_recomputes_every_value_of_both_platforms():
    m, rows = _platform_metrics(), _platform_rows()
    ok, detail = smoke._check_platform_metrics(m, rows)
    assert ok, detail
    assert detail == ("desktop: reward +0.25, KL on 0.50, length 8.0, teacher samples 4; "
                      "mobile: reward -0.75, KL on 0.60, length 4.0, teacher samples 5; all = recomputed")
    for key in m:
        ok, detail = smoke._check_platform_metrics({k: v for k, v in m.items() if k != key}, rows)
        assert not ok and detail == f"missing {key}"
        # each value off by 1e-5 relative (float32 rounding is 6e-8)
        ok, detail = smoke._check_platform_metrics({**m, key: m[key] * (1 + 1e-5)}, rows)
        assert not ok and f"; differ: {key} " in detail, key
    ok, detail = smoke._check_platform_metrics({k: v for k, v in m.items() if "reward_mean" not in k}, rows)
    assert not ok and detail == "missing mopd/reward_mean/desktop, mopd/reward_mean/mobile"
    # the keys are there, but the metrics are another platform's (swapped)
    swapped = {k.replace("desktop", "@").replace("mobile", "desktop").replace("@", "mobile"): v for k, v in m.items()}
    assert not smoke._check_platform_metrics(swapped, rows)[0]


def test_check_platform_metrics_needs_samples_of_both_platforms():
    rows = [r for r in _platform_rows() if r["platform"] == "desktop"]
    m = {**_platform_metrics(), "mopd/kl_mask_on_fraction/mobile": 0.0, "mopd/reward_mean/mobile": 0.0,
         "mopd/response_length/mobile": 0.0, "mopd_teacher/mobile/samples": 0.0}
    assert not smoke._check_platform_metrics(m, rows)[0]


def test_check_grad_norm_needs_a_finite_positive_norm():
    assert smoke._check_grad_norm({"actor/grad_norm": 0.37}) == (True, "actor/grad_norm 0.37")
    for bad in (0.0, -1.0, float("nan"), float("inf")):
        assert not smoke._check_grad_norm({"actor/grad_norm": bad})[0], bad


# ------------------------------------------------------------------------------- weight syncs


def _paths(tmp_path: Path) -> smoke.Paths:
    return smoke.Paths(root=tmp_path, recipes=tmp_path / "recipes")


def _write_syncs(paths, records):
    paths.stage2.mkdir(parents=True, exist_ok=True)
    (paths.stage2 / "rollout_sync.jsonl").write_text("".join(json.dumps(r) + "\n\n" for r in records))


def _model(seed=0):
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(6, 5), torch.nn.LayerNorm(5), torch.nn.Linear(5, 3))


def _stats(model) -> dict:
    return {name: hooks.weight_stats(p) for name, p in model.named_parameters()}


def _adam_step(model, lr=1e-6):
    """What the first Adam step of the smoke (lr 1e-6) does to every weight: +-lr."""
    with torch.no_grad():
        for p in model.parameters():
            p -= lr * torch.sign(torch.randn_like(p))


def _write_run(paths, syncs, actor_states):
    _write_syncs(paths, syncs)
    dumps = paths.stage2 / "dumps"
    dumps.mkdir(parents=True, exist_ok=True)
    (dumps / hooks.ACTOR_STATE_FILE).write_text("".join(json.dumps({"global_steps": s, "params": p}) + "\n"
                                                        for s, p in actor_states))


def _sync(step, held_stats, sent=None, held=None):
    return {"global_steps": step, "replica": 0, "sent": sent or {"w": f"h{step}"}, "held": held or {"w": f"h{step}"},
            "held_stats": held_stats}


def _syncs_case():
    """A run of 3 steps and a restart: syncs at init (0), after steps 1 and 2, at the restart (2 again), after 3."""
    model, states = _model(), []
    for step in (0, 1, 2, 2, 3):
        if step and not (step == 2 and states and states[-1][0] == 2):
            _adam_step(model)
        states.append((step, _stats(model)))
    return states


def test_check_syncs_compares_the_rollout_with_the_actors_own_weights_at_each_sync(tmp_path):
    paths, states = _paths(tmp_path), _syncs_case()
    _write_run(paths, [_sync(step, stats) for step, stats in states], states)
    ok, detail = smoke._check_syncs(paths, {})
    assert ok, detail
    assert detail.startswith("5 syncs: the rollout's weights = the actor engine's own parameters at that step "
                             "(last: 6 tensors by name (0 differ)")


def test_check_syncs_fails_on_stale_weights_sent_intact(tmp_path):
    """The rollout holds exactly what was sent (sha256 equal), but what was sent is the step before's."""
    paths, states = _paths(tmp_path), _syncs_case()
    syncs = [_sync(step, stats) for step, stats in states]
    syncs[2] = _sync(2, states[1][1])  # after step 2 the rollout still has step 1's weights
    _write_run(paths, syncs, states)
    ok, detail = smoke._check_syncs(paths, {})
    assert not ok and "; differ from the actor's at global_steps [2]" in detail
    assert "held differ from sent" not in detail


@pytest.mark.parametrize("change, message", [
    (lambda syncs, states: states.pop(), "; no actor state for global_steps [3]"),
    (lambda syncs, states: syncs[1].pop("held_stats"), "; no actor state for global_steps [1]"),
    (lambda syncs, states: syncs[3].update(held={"w": "torn"}), "; held differ from sent at global_steps [2]"),
    (lambda syncs, states: [syncs.pop() for _ in range(3)], "2 syncs"),  # fewer syncs than steps
])
def test_check_syncs_fails_on_a_missing_actor_state_a_torn_transport_or_too_few_syncs(tmp_path, change, message):
    paths, states = _paths(tmp_path), _syncs_case()
    syncs = [_sync(step, stats) for step, stats in states]
    change(syncs, states)
    _write_run(paths, syncs, states)
    ok, detail = smoke._check_syncs(paths, {})
    assert not ok and message in detail


def test_check_syncs_fails_without_any_sync(tmp_path):
    paths = _paths(tmp_path)
    _write_run(paths, [], [])
    assert not smoke._check_syncs(paths, {})[0]


def test_compare_weight_stats_catches_one_adam_step_of_one_tensor_and_allows_another_order():
    model = _model()
    before = _stats(model)
    with torch.no_grad():
        model[1].weight -= 1e-6 * torch.sign(torch.randn(5))  # the norm only, 5 elements
    ok, detail = hooks.compare_weight_stats(_stats(model), before)
    assert not ok and "(1 differ: 1.weight)" in detail
    # the same elements in another layout and order: equal (a transposed, a reversed copy)
    other = {name: hooks.weight_stats(p.detach().t().flip(0) if p.dim() == 2 else p.detach().flip(0))
             for name, p in model.named_parameters()}
    assert hooks.compare_weight_stats(_stats(model), {f"hf.{n}": v for n, v in other.items()})[0]
    assert not hooks.compare_weight_stats({}, {})[0]


def test_combine_weight_stats_sums_tp_shards_and_counts_replicated_weights_once():
    """Megatron's layout: a fused QKV split over 2 TP ranks, a norm replicated on both, a second DP replica;
    combined, they equal transformers' separate q/k/v and norm (a layout of other names and shapes)."""
    torch.manual_seed(1)
    q, k, v, norm = torch.randn(4, 3), torch.randn(2, 3), torch.randn(2, 3), torch.randn(3)
    fused = torch.cat([q, k, v])  # 8 x 3
    hf = {"q.weight": hooks.weight_stats(q), "k.weight": hooks.weight_stats(k), "v.weight": hooks.weight_stats(v),
          "norm.weight": hooks.weight_stats(norm)}

    def rank(tp, dp, shard):
        return {"layout": "megatron", "tp_rank": tp, "dp_rank": dp, "pp_rank": 0, "cp_rank": 0,
                "params": {"qkv": [*hooks.weight_stats(shard), True], "norm": [*hooks.weight_stats(norm), False]}}

    records = [rank(tp, dp, fused[4 * tp: 4 * tp + 4]) for dp in (0, 1) for tp in (0, 1)]
    combined = hooks.combine_weight_stats(records)
    assert set(combined) == {"pp0.qkv", "pp0.norm"}
    ok, detail = hooks.compare_weight_stats(combined, hf)
    assert ok, detail
    for record in records:  # a replicated weight counted on every TP rank
        record["params"]["norm"][-1] = True
    assert not hooks.compare_weight_stats(hooks.combine_weight_stats(records), hf)[0]
    with pytest.raises(ValueError, match="no rank"):
        hooks.combine_weight_stats([])


def test_engine_weight_stats_gathers_fsdp2_dtensors(tmp_path):
    """verl's FSDP engines hold DTensors (FSDP2 ``fully_shard``): gathered whole, named as in transformers."""
    import copy

    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    model = _model()
    want = _stats(model)
    sharded = copy.deepcopy(model)
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    try:
        fully_shard(sharded, mesh=init_device_mesh("cpu", (1,)))
        assert all(type(p).__name__ == "DTensor" for p in sharded.parameters())

        class Engine:  # verl's FSDP engine keeps its model as ``module``
            module = sharded

        record = hooks.engine_weight_stats(Engine())
    finally:
        dist.destroy_process_group()
    assert record["layout"] == "full"
    assert hooks.combine_weight_stats([record]) == want


def test_check_syncs_without_a_sync_log_compares_log_probs(tmp_path):
    paths = _paths(tmp_path)
    metrics = {1: {"training/rollout_probs_diff_max": 0.02}, 2: {"training/rollout_probs_diff_max": 0.05}}
    ok, detail = smoke._check_syncs(paths, metrics)
    assert ok and "max |rollout - actor| log-prob 0.05 < 0.1" in detail
    assert not smoke._check_syncs(paths, {**metrics, 3: {"training/rollout_probs_diff_max": 0.1}})[0]
    assert not smoke._check_syncs(paths, {**metrics, 3: {"training/rollout_probs_diff_max": 0.5}})[0]


# -------------------------------------------------------------------------------------- resume


def _write_resume(paths, *, on_disk, end, begin, extra_records=(), held_end=("p1",), held_begin=("p1",),
                  wrap=True, folders=(smoke.RESUME_STEP,)):
    dumps = paths.stage2 / "dumps"
    dumps.mkdir(parents=True, exist_ok=True)
    records = [
        {"step": smoke.RESUME_STEP, "when": "begin", "sampler": {"junk": 1}, "held_prompts": []},
        {"step": smoke.RESUME_STEP, "when": "end", "sampler": end, "held_prompts": list(held_end)},
        {"step": smoke.RESUME_STEP + 1, "when": "begin", "sampler": begin, "held_prompts": list(held_begin)},
        {"step": smoke.RESUME_STEP + 1, "when": "end", "sampler": {"junk": 2}, "held_prompts": []},
        *extra_records,
    ]
    (dumps / "batching_state.jsonl").write_text("\n".join(json.dumps(r) for r in records))
    for step in folders:
        folder = paths.stage2 / "ckpt" / "proj" / "exp" / f"global_step_{step}"
        folder.mkdir(parents=True, exist_ok=True)
        (folder / STATE_FILE).write_text(json.dumps({"version": 1, "state": on_disk} if wrap else on_disk))


STATE = {"served": {"desktop": 3, "mobile": 1}, "step": 2}


def test_check_resume_passes_when_the_saved_the_on_disk_and_the_reloaded_state_agree(tmp_path):
    paths = _paths(tmp_path)
    _write_resume(paths, on_disk=STATE, end=STATE, begin=dict(STATE))
    ok, detail = smoke._check_resume(paths)
    assert ok, detail
    assert detail.endswith(f"at the start of step {smoke.RESUME_STEP + 1}: True; held prompts 1 -> 1")
    assert f"global_step_{smoke.RESUME_STEP}/batching_state.json" in detail


@pytest.mark.parametrize("change", [
    {"begin": {**STATE, "step": 0}},           # the resumed process did not load the state
    {"on_disk": {**STATE, "step": 1}},         # the file is not what the first process had
    {"end": {**STATE, "step": 1}, "begin": {**STATE, "step": 1}},  # both processes agree, the file not
    {"held_begin": ()},                        # held prompts lost on resume
])
def test_check_resume_fails_on_each_tampered_piece(tmp_path, change):
    paths = _paths(tmp_path)
    _write_resume(paths, **{"on_disk": STATE, "end": STATE, "begin": STATE, **change})
    ok, detail = smoke._check_resume(paths)
    assert not ok, detail


def test_check_resume_needs_exactly_one_checkpoint_and_one_record_each(tmp_path):
    paths = _paths(tmp_path / "none")
    _write_resume(paths, on_disk=STATE, end=STATE, begin=STATE, folders=())
    ok, detail = smoke._check_resume(paths)
    assert not ok and detail == (f"expected one global_step_{smoke.RESUME_STEP} checkpoint under "
                                 f"{paths.stage2 / 'ckpt'}, found []")
    paths = _paths(tmp_path / "two")
    _write_resume(paths, on_disk=STATE, end=STATE, begin=STATE)
    other = paths.stage2 / "ckpt" / "proj2" / "exp" / f"global_step_{smoke.RESUME_STEP}"
    other.mkdir(parents=True)
    assert not smoke._check_resume(paths)[0]
    paths = _paths(tmp_path / "twice")
    again = {"step": smoke.RESUME_STEP, "when": "end", "sampler": STATE, "held_prompts": ["p1"]}
    _write_resume(paths, on_disk=STATE, end=STATE, begin=STATE, extra_records=[again])
    ok, detail = smoke._check_resume(paths)
    assert not ok and detail == f"state records: 2 at the end of step {smoke.RESUME_STEP}, 1 at the resume"
    paths = _paths(tmp_path / "noresume")
    resumed_again = {"step": smoke.RESUME_STEP + 1, "when": "begin", "sampler": STATE, "held_prompts": ["p1"]}
    _write_resume(paths, on_disk=STATE, end=STATE, begin=STATE, extra_records=[resumed_again])
    ok, detail = smoke._check_resume(paths)
    assert not ok and detail == f"state records: 1 at the end of step {smoke.RESUME_STEP}, 2 at the resume"


def test_same_state_reads_the_wrapped_and_the_bare_file():
    assert smoke._same_state({"version": 1, "state": {"a": [1, 2], "b": {"c": 1}}}, {"b": {"c": 1}, "a": [1, 2]})
    assert smoke._same_state({"a": 1}, {"a": 1})
    assert not smoke._same_state({"version": 1, "state": {"a": 1}}, {"a": 2})
    assert not smoke._same_state({"a": 1}, {"a": 1, "b": 2})
    # tuples and lists are the same once written as JSON
    assert smoke._same_state({"state": {"a": [1, 2]}}, {"a": (1, 2)})
    assert smoke._same_state([1, 2], [1, 2]) and not smoke._same_state([1, 2], [2, 1])


def test_check_resume_reads_a_bare_state_file(tmp_path):
    paths = _paths(tmp_path)
    _write_resume(paths, on_disk=STATE, end=STATE, begin=STATE, wrap=False)
    assert smoke._check_resume(paths)[0]


# -------------------------------------------------------------------------------- TP and stage 1


def _profile(actor_tp=2):
    return smoke.Profile(device="cpu", stage1="s1", stage2="s2", stage1_engine="megatron", actor_engine="megatron",
                         actor_tp=actor_tp, teacher_backends={}, teacher_tolerance={}, student_tolerance=1e-5,
                         k3_tolerance=1e-6, environment=dict)


def _write_tp(paths, tp, loss, grad_norm, sp=True, over=()):
    folder = paths.root / "tp_check"
    folder.mkdir(parents=True, exist_ok=True)
    (folder / f"tp{tp}.json").write_text(json.dumps({"engine": {"thd": {  # verl_mopd.testing.megatron_check's
        "loss": loss, "grad_norm": grad_norm, "sequence_parallel": sp,
        "replicated_grad_spread": {"over_1e-6": list(over)}}}}))


@pytest.mark.parametrize("loss, norm, sp, over, ok", [
    (2.0, 4.0, True, (), True),
    (2.0 * (1 + 5e-6), 4.0 * (1 - 5e-6), True, (), True),
    (2.0 * (1 + 2e-5), 4.0, True, (), False),
    (2.0 * (1 - 2e-5), 4.0, True, (), False),
    (2.0, 4.0 * (1 + 2e-5), True, (), False),
    (2.0, 4.0 * (1 - 2e-5), True, (), False),
    (2.0, 4.0, False, (), False),
    (2.0, 4.0, True, ("norm.weight",), False),
])
def test_check_tp_compares_loss_and_grad_norm_relative_and_the_replicated_grads(tmp_path, loss, norm, sp, over, ok):
    paths = _paths(tmp_path)
    _write_tp(paths, 1, 2.0, 4.0)
    _write_tp(paths, 2, loss, norm, sp, over)
    got, detail = smoke._check_tp(paths, _profile(2))
    assert bool(got) == ok, detail
    assert ("norm.weight" in detail) == bool(over)
    if not over:
        assert detail.endswith("replicated grads differing across TP ranks: none")


@pytest.mark.parametrize("which", ["loss", "grad_norm"])
def test_check_tp_allows_a_relative_difference_of_exactly_1e_5(tmp_path, which):
    paths = _paths(tmp_path)
    _write_tp(paths, 1, 100000.0, 100000.0)
    _write_tp(paths, 2, 100001.0 if which == "loss" else 100000.0, 100001.0 if which == "grad_norm" else 100000.0)
    assert (100001.0 - 100000.0) / 100000.0 == 1e-5  # exactly the bound, in float64
    assert smoke._check_tp(paths, _profile(2))[0]


def _write_stage1(paths, platform, losses, moved=0.5, extra_teacher_key=False):
    from safetensors.torch import save_file

    base = {"a": torch.zeros(2, 2), "b": torch.ones(3)}
    teacher = {"a": torch.zeros(2, 2), "b": torch.ones(3) + torch.tensor([0.0, moved, 0.0])}
    if extra_teacher_key:
        teacher["c"] = torch.zeros(1)
    (paths.models / "teacher_base").mkdir(parents=True, exist_ok=True)
    save_file(base, str(paths.models / "teacher_base" / "model.safetensors"))
    paths.teacher(platform).mkdir(parents=True, exist_ok=True)
    save_file(teacher, str(paths.teacher(platform) / "model.safetensors"))
    paths.stage1(platform).mkdir(parents=True, exist_ok=True)
    lines = [{"step": i + 1, "data": {"train/loss": x}} for i, x in enumerate(losses)]
    lines.append({"step": len(losses), "data": {"train/lr": 1e-5}})  # merged into the same step
    (paths.stage1(platform) / "metrics.jsonl").write_text("\n".join(json.dumps(r) for r in lines) + "\n\n")


@pytest.mark.parametrize("losses, moved, extra, ok", [
    ([2.5, 2.123456], 0.5, False, True),
    ([2.5, 2.123456], -0.5, False, True),   # moved is |w - w_base|
    ([2.5], 0.5, False, False),             # one step, not STAGE1_STEPS
    ([2.5, 2.25, 2.0], 0.5, False, False),
    ([2.5, float("nan")], 0.5, False, False),
    ([2.5, 2.25], 0.0, False, False),       # the weights did not move
    ([2.5, 2.25], 0.5, True, False),        # the merged checkpoint has other tensors
])
def test_check_stage1_needs_the_steps_finite_losses_moved_weights_and_the_bases_tensors(tmp_path, losses, moved,
                                                                                         extra, ok):
    paths = _paths(tmp_path)
    _write_stage1(paths, "desktop", losses, moved, extra)
    got, detail = smoke._check_stage1(paths, "desktop")
    assert got == ok, detail
    if ok:
        assert detail == ("losses [2.5, 2.123], merged checkpoint has the base's 2 tensors: True, "
                          "max |w - w_base| 5.00e-01")


def test_read_metrics_merges_the_lines_of_a_step_and_skips_blank_lines(tmp_path):
    path = tmp_path / "m.jsonl"
    path.write_text('{"step": 1, "data": {"a": 1}}\n\n  \n{"step": "2", "data": {"a": 2}}\n{"step": 1, "data": {"b": 3}}\n')
    assert smoke.read_metrics(path) == {1: {"a": 1, "b": 3}, 2: {"a": 2}}


def test_format_table_and_check_rows():
    checks = [smoke.Check("one", True, "fine"), smoke.Check("a longer name", False, "broken")]
    assert smoke.format_table(checks).splitlines() == [
        "check          result  detail",
        "-" * 53,
        "one            PASS    fine",
        "a longer name  FAIL    broken",
    ]
    assert checks[0].as_dict() == {"check": "one", "result": "PASS", "detail": "fine"}
    assert checks[1].as_dict() == {"check": "a longer name", "result": "FAIL", "detail": "broken"}


# ------------------------------------------------------------------ teachers' and student's log-probs


@pytest.fixture(scope="module")
def forward_run(tmp_path_factory):
    """A run folder with a tiny student and one tiny teacher per platform, and dumped rows whose log-probs are
    the models' own (a batched float32 forward of a left-padded pair: how a worker scores, not the check's
    one-sample float64 reference)."""
    from verl_mopd.testing import tiny

    root = tmp_path_factory.mktemp("forward_run")
    texts = ["the quick brown fox jumps over the lazy dog", "click the button at the top"] * 4
    tokenizer = tiny.build_tokenizer(texts, vocab_size=400)
    processor = tiny.build_processor(tokenizer)
    paths = smoke.Paths(root=root, recipes=root / "recipes")
    folders = {"student": tiny.save_model(paths.models / "student", tokenizer, processor, "student", seed=0)}
    for i, platform in enumerate(smoke.PLATFORMS):
        folders[platform] = tiny.save_model(paths.teacher(platform), tokenizer, processor, "teacher", seed=1 + i)

    from transformers import AutoModelForImageTextToText

    torch.manual_seed(3)
    sequences = [torch.randint(10, 300, (n,)) for n in (12, 9)]  # prompt 6 + response 6 / 3
    pad = max(len(s) for s in sequences)
    ids = torch.stack([torch.cat([torch.zeros(pad - len(s), dtype=torch.long), s]) for s in sequences])
    attention = torch.stack([torch.cat([torch.zeros(pad - len(s)), torch.ones(len(s))]) for s in sequences]).long()

    def batched(folder):
        model = AutoModelForImageTextToText.from_pretrained(folder, dtype=torch.float32).eval()
        with torch.no_grad():
            logits = model(input_ids=ids, attention_mask=attention).logits.float()
        lp = torch.log_softmax(logits[:, :-1], -1).gather(-1, ids[:, 1:, None])[..., 0]
        return [lp[i, pad - 1 - (len(s) - 6):] for i, s in enumerate(sequences)]

    student = batched(folders["student"])
    rows = []
    for platform in smoke.PLATFORMS:
        teacher = batched(folders[platform])
        for i, seq in enumerate(sequences):
            rows.append({"padding": False, "platform": platform, "gate": 1.0, "input_ids": seq,
                         "teacher": teacher[i].clone(), "student": student[i].clone(),
                         "response_mask": torch.ones(len(seq) - 6), "multi_modal_inputs": None})
    return paths, rows


@pytest.mark.parametrize("engine", ["megatron", "fsdp"])
def test_check_teachers_and_student_pass_on_the_models_own_log_probs(forward_run, engine):
    paths, rows = forward_run
    profile = smoke.PROFILES["cpu" if engine == "megatron" else "cpu-fsdp"]
    ok, detail = smoke._check_teachers(paths, profile, {1: rows})
    assert ok, detail
    assert detail.startswith("desktop (") and ": 2 samples, max err" in detail
    ok, detail = smoke._check_student(paths, profile, {1: rows})
    assert ok and "4 samples of step 1" in detail, detail


def test_check_teachers_fails_on_a_tampered_log_prob_another_platforms_teacher_or_none_scored(forward_run):
    import copy

    paths, rows = forward_run
    profile = smoke.PROFILES["cpu"]
    tampered = copy.deepcopy(rows)
    tampered[1]["teacher"][0] += 1e-4  # 1e-4 nats in one token of one sample
    assert not smoke._check_teachers(paths, profile, {1: tampered})[0]
    swapped = copy.deepcopy(rows)  # the desktop samples scored by the mobile teacher
    for mine, other in zip(swapped[:2], rows[2:], strict=True):
        mine["teacher"] = other["teacher"].clone()
    assert not smoke._check_teachers(paths, profile, {1: swapped})[0]
    off = [dict(r, gate=0.0) if r["platform"] == "mobile" else r for r in rows]  # no mobile sample scored
    ok, detail = smoke._check_teachers(paths, profile, {1: off})
    assert not ok and "mobile (megatron): 0 samples" in detail


def test_check_student_fails_on_a_tampered_log_prob_a_shift_or_no_step_1(forward_run):
    import copy

    paths, rows = forward_run
    profile = smoke.PROFILES["cpu"]
    tampered = copy.deepcopy(rows)
    tampered[0]["student"][-1] += 1e-4
    assert not smoke._check_student(paths, profile, {1: tampered})[0]
    shifted = copy.deepcopy(rows)  # the log-probs one token late (a misaligned row)
    shifted[0]["student"] = torch.roll(shifted[0]["student"], 1)
    assert not smoke._check_student(paths, profile, {1: shifted})[0]
    assert not smoke._check_student(paths, profile, {2: rows})[0]  # step 1's samples are the ones checked
