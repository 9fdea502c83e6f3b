"""Tests that kill mutants found by scripts/mutation.sh in verl_mopd/trainer/gate.py
(docs/reliability.md, "Mutation testing"): the driver's gate through TransferQueue with the thought
window, a length limit and verl's padding tags; "kept" weights; the gate metric as a stored field;
the error messages. Every expected value is worked out by hand from the six samples below."""

import re
from types import SimpleNamespace

import pytest
import torch
from _tq_memory import InMemoryTQ
from tensordict import NonTensorStack, TensorDict

from verl_mopd.config import MOPDConfig
from verl_mopd.trainer.gate import compute_reward_gate, write_reward_gate

THINK = 99
# uid, platform, responses (</think> = 99), acc. Group means of acc: u0 1.0 (> tau 0.5: KL off),
# u1 0.5 (not above tau: on), u2 0.0 (on). Sample 5 is verl's batch padding.
SAMPLES = [
    ("u0", "desktop", [5, THINK, 6], 1.0),
    ("u0", "desktop", [THINK, 7], 1.0),
    ("u1", "mobile", [5, 6, THINK, 8], 1.0),
    ("u1", "mobile", [5, 6, 7, 8], 0.0),   # no </think> and at the length limit 4: cut off in its thought
    ("u2", "mobile", [5, THINK], 0.0),
    ("u2", "mobile", [THINK, 5, 6], 1.0),  # padding: its acc must not enter u2's mean
]
PADDING = [False] * 5 + [True]
KEYS = [f"k{i}" for i in range(len(SAMPLES))]


def _rows(with_responses=True, extras=True):
    rows = []
    for uid, platform, resp, acc in SAMPLES:
        row = {"uid": uid, "platform": platform, "response_mask": torch.ones(len(resp), dtype=torch.int64),
               "rm_scores": torch.nn.functional.pad(torch.tensor([1.0 if acc else -0.5]), (len(resp) - 1, 0)),
               "task": torch.tensor(acc)}
        if with_responses:
            row["responses"] = torch.tensor(resp)
        if extras:
            row["extra_fields"] = {"reward_extra_info": {"acc": acc}}
        rows.append(row)
    return rows


def _tensordict(rows):
    return TensorDict(
        {name: (torch.nested.as_nested_tensor([r[name] for r in rows], layout=torch.jagged)
                if rows[0][name].dim() else torch.stack([r[name] for r in rows]))
         if isinstance(rows[0][name], torch.Tensor) else NonTensorStack(*[r[name] for r in rows])
         for name in rows[0]},
        batch_size=len(rows),
    )


def _store(tq, rows, padding=PADDING):
    return tq.kv_batch_put(keys=KEYS, partition_id="train", fields=_tensordict(rows),
                           tags=[{"status": "success", "is_padding": p} for p in padding])


def _stored(tq, *names):
    got = tq.kv_batch_get(keys=KEYS, partition_id="train", select_fields=list(names))
    return [got[n].tolist() for n in names]


def test_write_reward_gate_applies_the_thought_window_the_length_limit_and_the_padding_tags():
    tq = InMemoryTQ()
    batch = _store(tq, _rows())
    cfg = MOPDConfig(tau_kl=0.5, kl_skip_thought=True)
    metrics = write_reward_gate(batch, cfg, tq=tq, think_end_token_id=THINK, max_response_length=4)
    mask, start = _stored(tq, "mopd_kl_mask", "mopd_kl_start")
    assert mask == [0.0, 0.0, 1.0, 1.0, 1.0, 0.0]
    # after the last </think>; sample 3 reached the limit without one: its window starts past its end
    assert start == [2, 1, 3, 4, 2, 1]
    assert metrics["mopd/kl_mask_on_fraction"] == pytest.approx(3 / 5)
    assert metrics["mopd/thought_cut_off_fraction"] == pytest.approx(1 / 5)  # sample 3 only: 2 has its </think>
    assert metrics["mopd/gate_metric_mean"] == pytest.approx(3 / 5)


def test_without_padding_tags_every_sample_is_real():
    tq = InMemoryTQ()
    keys = _store(tq, _rows()).keys
    batch = SimpleNamespace(keys=keys, tags=None, partition_id="train")
    metrics = write_reward_gate(batch, MOPDConfig(tau_kl=0.5), tq=tq)
    (mask,) = _stored(tq, "mopd_kl_mask")
    assert mask == [0.0, 0.0, 1.0, 1.0, 1.0, 1.0]  # the sixth sample counts: u2's mean 0.5, not above tau
    assert metrics["mopd/kl_mask_on_fraction"] == pytest.approx(4 / 6)


def test_a_missing_responses_field_is_named_when_the_thought_is_skipped():
    tq = InMemoryTQ()
    batch = _store(tq, _rows(with_responses=False))
    with pytest.raises(ValueError, match=re.escape("the reward gate needs stored fields ['responses']; the step's "
                                                 "samples have ['extra_fields', 'platform', 'response_mask', "
                                                 "'rm_scores', 'uid']")):
        write_reward_gate(batch, MOPDConfig(kl_skip_thought=True), tq=tq, think_end_token_id=THINK)


def test_kept_weights_count_real_tokens_over_counted_tokens():
    data = _tensordict(_rows())
    # no thought window: counted = on samples' tokens 4 + 4 + 2 = 10; real tokens 3+2+4+4+2 = 15
    fields, _ = compute_reward_gate(MOPDConfig(tau_kl=0.5, normalization="kept"), data, is_padding=PADDING)
    torch.testing.assert_close(fields["mopd_kl_mask"], torch.tensor([0.0, 0.0, 1.5, 1.5, 1.5, 0.0]))
    # with the window (no length limit: sample 3 starts at 0): counted = 1 + 4 + 0 = 5
    fields, metrics = compute_reward_gate(MOPDConfig(tau_kl=0.5, normalization="kept", kl_skip_thought=True), data,
                                          is_padding=PADDING, think_end_token_id=THINK)
    assert fields["mopd_kl_start"].tolist() == [2, 1, 3, 0, 2, 1]
    torch.testing.assert_close(fields["mopd_kl_mask"], torch.tensor([0.0, 0.0, 3.0, 3.0, 3.0, 0.0]))
    assert metrics["mopd/thought_cut_off_fraction"] == 0.0  # no length limit given: nothing is cut off


def test_the_cut_off_fraction_of_a_single_real_sample():
    data = _tensordict(_rows())
    padding = [True, True, True, False, True, True]
    _, metrics = compute_reward_gate(MOPDConfig(kl_skip_thought=True), data, is_padding=padding,
                                     think_end_token_id=THINK, max_response_length=4)
    assert metrics["mopd/thought_cut_off_fraction"] == 1.0


def test_a_batch_of_padding_only_and_a_platform_of_padding_only():
    data = _tensordict(_rows())
    fields, metrics = compute_reward_gate(MOPDConfig(), data, is_padding=[True] * 6)
    assert fields["mopd_kl_mask"].tolist() == [0.0] * 6
    assert metrics["mopd/kl_mask_on_fraction"] == 1.0 and metrics["mopd/gate_metric_mean"] == 0.0
    # desktop (sorted first) has only padding rows: mobile's metrics are still there
    _, metrics = compute_reward_gate(MOPDConfig(tau_kl=0.5), data, is_padding=[True, True] + [False] * 4)
    assert "mopd/kl_mask_on_fraction/desktop" not in metrics
    assert metrics["mopd/kl_mask_on_fraction/mobile"] == 1.0  # u1 and u2 (mean 0.5 with sample 5) on
    assert metrics["mopd/reward_mean/mobile"] == pytest.approx((1.0 - 0.5 - 0.5 + 1.0) / 4)


def test_the_gate_metric_as_a_stored_field():
    data = _tensordict(_rows(extras=False))
    fields, metrics = compute_reward_gate(MOPDConfig(tau_kl=0.5, gate_metric="task"), data, is_padding=PADDING)
    assert fields["mopd_kl_mask"].tolist() == [0.0, 0.0, 1.0, 1.0, 1.0, 0.0]
    assert metrics["mopd/gate_metric_mean"] == pytest.approx(3 / 5)


def test_gate_metric_errors_name_what_the_samples_have():
    rows = _rows(extras=False)
    for r in rows:
        del r["task"], r["rm_scores"], r["platform"], r["responses"]
    with pytest.raises(ValueError, match=re.escape(
            "mopd.gate_metric='acc' is neither a stored field nor in extra_fields (the samples have "
            "['response_mask', 'uid']); use 'rm_scores' or a key the reward function returns")):
        compute_reward_gate(MOPDConfig(), _tensordict(rows))
    for bad in ("not a dict", {"other": 1}):
        rows = _rows()
        rows[0]["extra_fields"] = bad
        with pytest.raises(ValueError, match=re.escape(
                "mopd.gate_metric='acc' is not in sample 0's reward extras (extra_fields.reward_extra_info keys: "
                "[]); use 'rm_scores' or a key that the reward function returns "
                "(verl_mopd.rewards.compute_score returns 'acc')")):
            compute_reward_gate(MOPDConfig(), _tensordict(rows))


def test_the_thought_window_needs_the_token_id():
    with pytest.raises(ValueError, match="^mopd.kl_skip_thought=true needs the id of mopd.think_end_token in the "
                                         "tokenizer$"):
        compute_reward_gate(MOPDConfig(kl_skip_thought=True), _tensordict(_rows()))
