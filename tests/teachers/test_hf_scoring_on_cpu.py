"""hf backend scoring without Ray: padded and jagged layouts, token-budget micro-batching."""

import pytest
import torch
from transformers import AutoModelForCausalLM
from verl.protocol import DataProto

from _teacher_tiny import direct_logprobs, padded_batch, save_tiny_lm
from verl_mopd.teachers.backends.hf import pack_like_old_log_probs, plan_micro_batches, rows_from_batch, score_rows


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    return AutoModelForCausalLM.from_pretrained(save_tiny_lm(tmp_path_factory.mktemp("m"), seed=1)).eval()


@pytest.mark.parametrize("budget", [1, 24, 10_000])
def test_padded_scores_match_direct_for_any_micro_batching(model, budget):
    tensors, plat = padded_batch(["desktop"] * 9, seed=3)
    data = DataProto.from_dict(tensors=tensors, non_tensors={"platform": plat})
    rows, width = rows_from_batch(data)
    got = pack_like_old_log_probs(score_rows(model, rows, budget), width)
    want = direct_logprobs(model, tensors["input_ids"], tensors["attention_mask"], width)
    assert got.shape == tensors["responses"].shape
    torch.testing.assert_close(got.double(), want, atol=1e-5, rtol=0)
    assert got[tensors["response_mask"] == 0].eq(0).all()


def test_jagged_layout_matches_padded(model):
    tensors, _ = padded_batch(["m"] * 5, seed=4)
    am, R = tensors["attention_mask"], tensors["responses"].shape[1]
    seqs = [tensors["input_ids"][i][am[i].bool()] for i in range(5)]
    resps = [tensors["responses"][i][: int(am[i, -R:].sum())] for i in range(5)]
    td = {"input_ids": torch.nested.as_nested_tensor(seqs, layout=torch.jagged),
          "responses": torch.nested.as_nested_tensor(resps, layout=torch.jagged)}
    from verl.utils import tensordict_utils as tu

    rows, width = rows_from_batch(tu.get_tensordict(td))
    assert width is None
    got = pack_like_old_log_probs(score_rows(model, rows, 64), width)
    want = direct_logprobs(model, tensors["input_ids"], am, R)
    for i, row in enumerate(got.unbind(0)):
        torch.testing.assert_close(row.double(), want[i, : len(resps[i])], atol=1e-5, rtol=0)


def test_micro_batch_plan_respects_budget_and_covers_rows():
    lengths = [5, 9, 2, 7, 7, 1, 30]
    plan = plan_micro_batches(lengths, token_budget=16)
    assert sorted(i for mb in plan for i in mb) == list(range(len(lengths)))
    for mb in plan:
        assert len(mb) == 1 or len(mb) * max(lengths[i] for i in mb) <= 16
