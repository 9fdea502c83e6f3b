"""verl 0.9.1's Megatron engine, run for real on CPU (gloo), on a tiny Qwen3-VL with images.

Three ``torchrun`` launches of :mod:`verl_mopd.testing.megatron_check` (TP 1; TP 2 with
both batch layouts and the teacher worker beside them in one process group, as colocated engines are; TP 2
without the corrections; each rank starts once for all its engines), on the CPU harness
(:mod:`verl_mopd.testing.cpu.megatron`, through ``VERL_USE_EXTERNAL_MODULES``): verl's own
``TrainingWorker`` with Megatron-Core and Megatron-Bridge (the GPU stack's pins), the vision tower
in Megatron. References are independent: transformers' ``Qwen3VLForConditionalGeneration`` in fp32
(log-probs) and float64 (the loss and its gradient norm).

- TP 1: log-probs equal transformers' (1e-5 on the responses), images reach them (pixels shifted by
  1 move them), and one training step through Megatron's distributed optimizer gives transformers'
  loss and gradient norm: the pinned megatron-core and Megatron-Bridge build a *training* engine
  (issue "The recipe's own engine in CI": megatron-core 0.18.2 could not).
- TP 2 with sequence parallel (verl's default, the stage-2 student's layout) gives TP 1's loss and
  gradient norm, with every replicated parameter's gradient equal on both TP ranks; without
  ``verl_mopd.upstream_fixes`` it does not (Megatron-Bridge 0.6.2's deepstack gradients), and the
  log-probs of samples with images are off by 1e-5 (its patch mergers' tanh GELU).
- the project's ``MegatronTeacherWorker`` (forward only, offload, fused kernels, several micro-batches).
- every CUDA call the redirect answered is one of ``REDIRECTED_CALL_SITES``.
"""

import importlib.util
import json
import os
import socket
import subprocess
import sys

import pytest

from verl_mopd.testing.cpu import environment
from verl_mopd.testing.cpu.megatron_patches import REDIRECTED_CALL_SITES

pytestmark = pytest.mark.skipif(importlib.util.find_spec("megatron.bridge") is None,
                                reason="needs megatron-core and Megatron-Bridge (the test extra, Python 3.12)")


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    from verl_mopd.testing import tiny

    call = '<tool_call>{"name": "computer_use", "arguments": {"action": "left_click", "coordinate": [1, 2]}}</tool_call>'
    texts = [call, "the quick brown fox jumps over the lazy dog"] * 4
    tokenizer = tiny.build_tokenizer(texts)
    return tiny.save_model(tmp_path_factory.mktemp("megatron") / "student", tokenizer,
                           tiny.build_processor(tokenizer), "student", seed=0)


@pytest.fixture(scope="module")
def record(tmp_path_factory):
    return tmp_path_factory.mktemp("cuda_calls")


def megatron_check(model, record, tmp_path, *args, nproc=1, fixes=True) -> dict:
    out = tmp_path / "result.json"
    env = {**os.environ, **environment(megatron=True), "VERL_MOPD_CPU_RECORD": str(record / "sites")}
    if not fixes:
        env["VERL_MOPD_UPSTREAM_FIXES"] = "none"
    with socket.socket() as probe:  # a free port for this run's rendezvous (torchrun's port 0 hangs)
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    command = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", str(nproc), "--master_port", str(port),
               "-m", "verl_mopd.testing.megatron_check", "--model", str(model), "--out", str(out), *args]
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=600, check=False)
    assert done.returncode == 0 and out.exists(), done.stdout[-4000:] + done.stderr[-6000:]
    return json.loads(out.read_text())


def relative(a: float, b: float) -> float:
    return abs(a - b) / abs(b)


@pytest.fixture(scope="module")
def tp1(model, record, tmp_path_factory):
    return megatron_check(model, record, tmp_path_factory.mktemp("tp1"), "--tp", "1", "--train", "--teacher")


@pytest.fixture(scope="module")
def tp2(model, record, tmp_path_factory):
    return megatron_check(model, record, tmp_path_factory.mktemp("tp2"), "--tp", "2", "--train", "--format", "thd",
                          "--format", "bshd", "--teacher", nproc=2)


def test_tp1_log_probs_and_one_train_step_equal_transformers(tp1):
    tp1 = tp1["engine"]["thd"]
    assert tp1["engine"] == "CPUMegatronEngineWithLMHead" and tp1["dtype"] == "float32"
    assert tp1["logprob_max_err"] <= 1e-5, tp1  # every position of every sample, images included
    assert tp1["control_err"] > 1e-2, tp1  # the pixels reach the log-probs
    assert relative(tp1["loss"], tp1["reference_loss"]) <= 1e-5, tp1
    assert relative(tp1["grad_norm"], tp1["reference_grad_norm"]) <= 1e-5, tp1
    assert_weight_stats_checks(tp1)


def assert_weight_stats_checks(result):
    """The smoke's weight check (``hooks.combine_weight_stats`` of the engine's own shards) on Megatron's layout:
    the loaded engine = its checkpoint in transformers; after the step = verl's export for the rollout; the
    weights before the step (what a stale sync would leave) != that export."""
    assert result["weights_vs_checkpoint"][0], result["weights_vs_checkpoint"]
    assert result["trained_weights_vs_export"][0], result["trained_weights_vs_export"]
    assert not result["initial_weights_vs_export"][0], result["initial_weights_vs_export"]


@pytest.mark.parametrize("layout", ["thd", "bshd"])
def test_tp2_with_sequence_parallel_trains_like_tp1(tp1, tp2, layout):
    tp1, tp2 = tp1["engine"]["thd"], tp2["engine"][layout]
    assert tp2["sequence_parallel"] and tp2["tp"] == 2 and tp2["format"] == layout
    assert tp2["response_logprob_max_err"] <= 1e-5, tp2
    assert relative(tp2["loss"], tp1["loss"]) <= 1e-5, (tp1, tp2)
    assert relative(tp2["grad_norm"], tp1["grad_norm"]) <= 1e-5, (tp1, tp2)
    assert tp2["replicated_grad_spread"]["over_1e-6"] == [], tp2
    assert_weight_stats_checks(tp2)  # TP-split parameters summed over the ranks, replicated ones once


def test_without_the_corrections_megatron_bridge_gets_qwen3_vl_wrong(model, record, tmp_path, tp1):
    """The findings, on CPU, without ``verl_mopd.upstream_fixes``: Megatron-Bridge 0.6.2's deepstack split
    gives each TP rank a partial gradient of the replicated vision parameters (the ranks disagree, the
    gradient norm is off), and its patch mergers' tanh GELU moves the log-probs of samples with images."""
    tp1 = tp1["engine"]["thd"]
    broken = megatron_check(model, record, tmp_path, "--tp", "2", "--train", nproc=2, fixes=False)["engine"]["thd"]
    assert broken["sequence_parallel"]
    assert broken["logprob_max_err"] > 5e-6 and tp1["logprob_max_err"] < 1e-6, (tp1, broken)  # tanh GELU
    text_only = broken["logprob_err_per_sample"][1]  # the one sample without an image: no merger, no error
    assert text_only < 1e-6, broken
    assert relative(broken["grad_norm"], tp1["grad_norm"]) > 1e-3, (tp1, broken)  # the deepstack gradients
    spread = broken["replicated_grad_spread"]
    assert spread["max"] > 1e-3 and all("vision_model" in name for name in spread["over_1e-6"]), spread
    assert any("deepstack_merger" in name for name in spread["over_1e-6"]), spread


@pytest.mark.parametrize("tp", [1, 2])
def test_megatron_teacher_worker_log_probs_equal_transformers(tp1, tp2, tp):
    teacher = (tp1 if tp == 1 else tp2)["teacher"]
    assert teacher["tp"] == tp and teacher["engine"] == "CPUMegatronEngineWithLMHead"
    assert teacher["param_offload"] and teacher["use_fused_kernels"]  # colocated, the stage-2 layout's kernels
    assert teacher["response_logprob_max_err"] <= 1e-5, teacher
    assert teacher["teacher_tokens"] == teacher["response_tokens"] > 0


def test_every_redirected_cuda_call_is_a_listed_site(record, tp1, tp2):
    seen = {}
    for path in record.glob("sites.*"):
        for site, count in json.loads(path.read_text()).items():
            seen[site] = seen.get(site, 0) + count
    assert seen, "no CUDA call was recorded: the redirect did not run"
    listed = {f"{f}:{line}" for f, lines in REDIRECTED_CALL_SITES.items() for line in lines}
    assert set(seen) <= listed, f"CUDA calls at sites not in REDIRECTED_CALL_SITES: {sorted(set(seen) - listed)}"
