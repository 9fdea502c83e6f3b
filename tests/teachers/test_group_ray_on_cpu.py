"""PlatformTeacherGroup through a real local Ray cluster: two tiny random teachers (different
weights) as desktop/mobile hf workers, verl RayWorkerGroup/RayResourcePool with use_gpu=False, fed
the padded DataProto layout (the demo's) and a jagged TensorDict."""

import numpy as np
import pytest
import torch
from _teacher_tiny import direct_logprobs, padded_batch, save_tiny_lm
from transformers import AutoModelForCausalLM
from verl.protocol import DataProto

from verl_mopd.config import MOPDConfig
from verl_mopd.teachers.group import PlatformTeacherGroup
from verl_mopd.teachers.router import UnknownRouteError

SMALL = dict(hidden=32, layers=2)
BIG = dict(hidden=256, layers=4)  # enough work per teacher to time concurrency


@pytest.fixture(scope="module")
def setup(ray_tq, tmp_path_factory):
    root = tmp_path_factory.mktemp("teachers")
    paths = {"desktop": save_tiny_lm(root / "desktop", seed=11, **BIG),
             "mobile": save_tiny_lm(root / "mobile", seed=22, **BIG)}
    cfg = MOPDConfig.from_mapping({"teachers": {
        p: {"model_path": path, "backend": "hf", "device": "cpu", "dtype": "float32", "micro_batch_tokens": 4096}
        for p, path in paths.items()}})
    group = PlatformTeacherGroup.build(cfg, use_gpu=False, num_threads=1)
    models = {p: AutoModelForCausalLM.from_pretrained(path).eval() for p, path in paths.items()}
    return group, models


def _dataproto(platforms, seed=0, **extra):
    tensors, plat = padded_batch(platforms, seed=seed)
    tensors.update(extra)
    return DataProto.from_dict(tensors=tensors, non_tensors={"platform": plat}), tensors


def test_each_sample_scored_by_its_platform_teacher(setup):
    group, models = setup
    rng = np.random.default_rng(5)
    platforms = list(rng.permutation(["desktop"] * 6 + ["mobile"] * 5))
    data, t = _dataproto(platforms, seed=7)
    logp, metrics = group.compute_teacher_logprobs(data)
    R = t["responses"].shape[1]
    ref = {p: direct_logprobs(m, t["input_ids"], t["attention_mask"], R) for p, m in models.items()}
    for i, p in enumerate(platforms):
        other = "mobile" if p == "desktop" else "desktop"
        torch.testing.assert_close(logp[i].double(), ref[p][i], atol=1e-5, rtol=0)
        assert (logp[i].double() - ref[other][i]).abs().max() > 1e-3  # never the other teacher
    assert metrics["mopd_teacher/desktop/samples"] == 6 and metrics["mopd_teacher/mobile/samples"] == 5
    assert metrics["mopd_teacher/desktop/tokens"] == t["response_mask"][np.array(platforms) == "desktop"].sum()
    assert metrics["mopd_teacher/skipped_fraction"] == 0.0


def test_empty_platform_and_gated_rows(setup):
    group, models = setup
    platforms = ["mobile"] * 6
    gate = torch.tensor([1.0, 0.0, 1.0, 0.0, 0.0, 1.0])
    old = torch.randn(6, 5)
    data, t = _dataproto(platforms, seed=8, mopd_kl_mask=gate, old_log_probs=old)
    logp, metrics = group.compute_teacher_logprobs(data)
    ref = direct_logprobs(models["mobile"], t["input_ids"], t["attention_mask"], 5)
    on = gate.bool()
    torch.testing.assert_close(logp[on].double(), ref[on], atol=1e-5, rtol=0)
    mask = t["response_mask"].bool()
    assert torch.equal(logp[~on][mask[~on]], old[~on][mask[~on]])  # gated rows: the student's own log-probs
    assert logp[~mask].eq(0).all()  # 0.0 after every response, as old_log_probs' layout
    assert metrics["mopd_teacher/desktop/samples"] == 0 and metrics["mopd_teacher/desktop/tokens"] == 0
    assert metrics["mopd_teacher/mobile/scored_samples"] == 3
    assert metrics["mopd_teacher/skipped_fraction"] == 0.5
    assert "mopd_teacher/mobile/k3_mean" in metrics and metrics["mopd_teacher/mobile/k3_mean"] > 0


def test_unknown_platform_is_refused_before_dispatch(setup):
    group, _ = setup
    data, _ = _dataproto(["desktop", "tablet"])
    with pytest.raises(UnknownRouteError, match="tablet.*configured teachers: \\['desktop', 'mobile'\\]"):
        group.compute_teacher_logprobs(data)


def test_platforms_run_concurrently(setup):
    """Each teacher has its own worker: the mixed call's wall time is clearly below the sum of the
    two teachers' own forward times in that call (they overlap). Measured inside one call, so
    other load on a shared CI machine slows both sides alike. The batch doubles until each
    teacher's forward takes at least 0.3 s, so a faster machine gets more work, not a flaky
    precondition."""
    group, _ = setup
    for n in (96, 192, 384, 768):
        tensors, _ = padded_batch(["x"] * n, prompt_len=96, response_len=64, seed=9)
        mixed = DataProto.from_dict(
            tensors=tensors, non_tensors={"platform": np.array(["desktop", "mobile"] * (n // 2), dtype=object)})
        group.compute_teacher_logprobs(mixed)  # warm-up
        runs = [group.compute_teacher_logprobs(mixed)[1] for _ in range(3)]
        times = [(m["mopd_teacher/desktop/time_s"], m["mopd_teacher/mobile/time_s"]) for m in runs]
        if min(min(t) for t in times) > 0.3:
            break
    else:
        pytest.fail(f"teacher work too small to time even at {n} rows: {times}")
    ratios = [m["mopd_teacher/wall_s"] / (t_d + t_m) for m, (t_d, t_m) in zip(runs, times, strict=True)]
    assert min(ratios) < 0.8, f"wall / sum of teacher times = {ratios} at {n} rows"


def test_jagged_tensordict_with_position_ids(setup):
    """verl's no-padding layout with 1-D position ids (a text-only student), gate as a stored field."""
    from verl.utils import tensordict_utils as tu

    group, models = setup
    platforms = ["mobile", "desktop", "desktop", "mobile", "desktop"]
    t, _ = padded_batch(platforms, seed=12)
    am, R = t["attention_mask"], t["responses"].shape[1]
    n_resp = am[:, -R:].sum(-1).tolist()

    def jag(rows):
        return torch.nested.as_nested_tensor(rows, layout=torch.jagged)

    seqs = [t["input_ids"][i][am[i].bool()] for i in range(5)]
    data = tu.get_tensordict({
        "input_ids": jag(seqs), "position_ids": jag([torch.arange(len(s)) for s in seqs]),
        "responses": jag([s[len(s) - r:] for s, r in zip(seqs, n_resp, strict=True)]),
        "response_mask": jag([torch.ones(r, dtype=torch.long) for r in n_resp]),
        "mopd_kl_mask": torch.tensor([1.0, 1.0, 0.0, 1.0, 1.0]), "platform": platforms})
    logp, metrics = group.compute_teacher_logprobs(data)
    ref = {p: direct_logprobs(m, t["input_ids"], am, R) for p, m in models.items()}
    for i, (row, p) in enumerate(zip(logp.unbind(0), platforms, strict=True)):
        want = ref[p][i, : n_resp[i]] if i != 2 else torch.zeros(n_resp[i], dtype=torch.float64)
        torch.testing.assert_close(row.double(), want, atol=1e-5, rtol=0)
    assert metrics["mopd_teacher/desktop/scored_samples"] == 2
