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


def test_model_class_follows_verl_vlms_load_as_image_text_to_text(tmp_path):
    from transformers import Qwen2Config, Qwen2Model, Qwen3VLForConditionalGeneration

    from _teacher_tiny import save_tiny_vl
    from verl_mopd.teachers.backends.hf import load_teacher_model

    assert isinstance(load_teacher_model(save_tiny_vl(tmp_path / "vl", seed=0)), Qwen3VLForConditionalGeneration)
    assert type(load_teacher_model(save_tiny_lm(tmp_path / "lm", seed=0))).__name__ == "Qwen2ForCausalLM"
    Qwen2Model(Qwen2Config(vocab_size=32, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                           num_attention_heads=2, num_key_value_heads=1)).save_pretrained(tmp_path / "base")
    with pytest.raises(ValueError, match=r"\['Qwen2Model'\].*no language-model head"):
        load_teacher_model(str(tmp_path / "base"))


@pytest.fixture
def worker_env(monkeypatch):
    for key, value in {"RANK": "0", "WORLD_SIZE": "1", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29512"}.items():
        monkeypatch.setenv(key, value)


@pytest.mark.parametrize("placement, weights, policy", [
    ("colocated", "auto", "pinned"), ("colocated", "pageable", "pageable"), ("colocated", "resident", "resident"),
    ("dedicated", "auto", "resident")])
def test_a_colocated_gpu_teacher_keeps_its_weights_by_policy_between_calls(tmp_path, monkeypatch, worker_env,
                                                                          placement, weights, policy):
    """A colocated ``hf`` teacher on CUDA loads to the GPU, parks its weights by its ``weights`` policy
    (``auto`` without a plan: ``pinned``) and moves them back only inside a call, even one that fails.
    The copies themselves are counted in tests/teachers/test_placement_on_cpu.py."""
    from verl_mopd.teachers.backends import hf
    from verl_mopd.teachers.config import TeacherConfig

    moves = []
    real_load = hf.load_teacher_model

    def load(*args):
        model = real_load(*args)
        monkeypatch.setattr(model, "to", lambda device: moves.append(str(device)) or model)
        return model

    monkeypatch.setattr(hf, "load_teacher_model", load)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(hf.HostWeights, "load", lambda self: moves.append(f"load {self.policy}"))
    monkeypatch.setattr(hf.HostWeights, "offload", lambda self: moves.append(f"offload {self.policy}"))
    worker = hf.HFTeacherWorker(TeacherConfig(model_path=save_tiny_lm(tmp_path / "t", seed=0), backend="hf",
                                              device="cuda", placement=placement, platform="desktop", weights=weights))
    worker.init_model()
    assert worker.offload == (placement == "colocated") and worker.weights.policy == policy
    assert moves == ["cuda", f"offload {policy}"]
    moves.clear()
    with pytest.raises(RuntimeError, match="boom"), worker._on_device():
        moves.append("forward")
        raise RuntimeError("boom")
    assert moves == [f"load {policy}", "forward", f"offload {policy}"]


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_temperature_divides_the_logits_as_verls_engines_do(model, temperature):
    tensors, _ = padded_batch(["d"] * 4, seed=6)
    rows, width = rows_from_batch(DataProto.from_dict(tensors=tensors))
    got = pack_like_old_log_probs(score_rows(model, rows, 64, temperature=temperature), width)
    want = torch.zeros_like(got, dtype=torch.float64)
    am, R = tensors["attention_mask"], width
    for i in range(4):
        seq = tensors["input_ids"][i][am[i].bool()]
        r = int(am[i, -R:].sum())
        with torch.no_grad():
            logits = model(input_ids=seq[None]).logits[0].double() / temperature
        want[i, :r] = torch.log_softmax(logits[:-1], -1).gather(-1, seq[1:, None])[-r:, 0]
    torch.testing.assert_close(got.double(), want, atol=1e-5, rtol=0)
