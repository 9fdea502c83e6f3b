"""The trainer's teacher step end to end on CPU: ``score_teachers`` with the real TransferQueue, verl's
real worker classes on a local Ray cluster (``use_gpu=False``), two tiny random Qwen3-VL teachers on
the ``hf`` backend (desktop on a 2-rank group), samples stored exactly as verl's v1 agent loop stores
them (jagged, 4-row mrope position ids, images in ``multi_modal_inputs``), verl's own synthetic
padding rows, and the stored ``teacher_logprobs`` read back the way verl's distillation loss reads
them (``no_padding_2_padding``), against a direct forward of each sample."""

import pickle

import numpy as np
import pytest
import ray
import torch
from _teacher_tiny import direct_vl_logprobs, save_tiny_vl, vl_sample
from tensordict import TensorDict
from transformers import AutoModelForImageTextToText

from verl_mopd.config import MOPDConfig
from verl_mopd.teachers.group import PlatformTeacherGroup
from verl_mopd.trainer.hooks import dump_step, score_teachers


def _nbytes(obj) -> int:
    return len(pickle.dumps(obj, protocol=5))


class RecordingTQ:
    """The real TransferQueue client module, recording what the driver reads and writes."""

    def __init__(self, tq):
        self._tq, self.bytes, self.requested = tq, 0, []

    def kv_batch_get(self, keys, partition_id, select_fields=None):
        self.requested += list(select_fields or ["<all>"])
        out = self._tq.kv_batch_get(keys=keys, partition_id=partition_id, select_fields=select_fields)
        self.bytes += _nbytes(out)
        return out

    def kv_batch_put(self, keys, partition_id, fields=None, tags=None):
        self.bytes += _nbytes(fields) if fields is not None else 0
        return self._tq.kv_batch_put(keys=keys, partition_id=partition_id, fields=fields, tags=tags)

    def __getattr__(self, name):
        return getattr(self._tq, name)


@pytest.fixture(scope="module")
def teachers(ray_tq, tmp_path_factory):
    root = tmp_path_factory.mktemp("vl_teachers")
    paths = {"desktop": save_tiny_vl(root / "desktop", seed=11), "mobile": save_tiny_vl(root / "mobile", seed=22)}
    cfg = MOPDConfig.from_mapping({"teachers": {
        "desktop": {"model_path": paths["desktop"], "backend": "hf", "device": "cpu", "dtype": "float32",
                    "n_gpus_per_node": 2, "micro_batch_tokens": 256},
        "mobile": {"model_path": paths["mobile"], "backend": "hf", "device": "cpu", "dtype": "float32"}}})
    group = PlatformTeacherGroup.build(cfg, use_gpu=False, num_threads=1)
    models = {p: AutoModelForImageTextToText.from_pretrained(path).eval() for p, path in paths.items()}
    return group, models


def _store_step(tq, models, platforms, gate, seed=0, lengths=None):
    """Put one step's samples in TransferQueue as the agent loop does, pad the batch with verl's own
    synthetic rows, then store old_log_probs and the gate (as verl's old-log-prob step and our gate do)."""
    from transfer_queue import KVBatchMeta
    from verl.trainer.ppo.padding_utils import upsample_batch_to_divisible_size
    from verl.utils.tensordict_utils import list_of_dict_to_tensordict

    rng = np.random.default_rng(seed)
    samples, keys, tags = [], [], []
    for i, platform in enumerate(platforms):
        image = (16, 12) if platform == "desktop" else (None if i % 2 else (8, 8))
        prompt_len, response_len = lengths or (int(rng.integers(3, 9)), int(rng.integers(2, 7)))
        if lengths:
            image = (8, 8)
        s = vl_sample(models[platform], rng, image_hw=image, prompt_len=prompt_len, response_len=response_len)
        s.update(platform=platform, uid=f"g{i // 2}")
        samples.append(s)
        keys.append(f"g{i // 2}_{i % 2}_0")
        tags.append({"status": "success", "prompt_len": len(s["prompts"]), "response_len": len(s["responses"]),
                     "seq_len": len(s["input_ids"]), "global_steps": 1})
    tq.kv_batch_put(keys=keys, partition_id="train", fields=list_of_dict_to_tensordict(samples), tags=tags)
    batch = KVBatchMeta(keys=keys, tags=tags, partition_id="train")
    batch = upsample_batch_to_divisible_size(batch, 8, eos_token_id=3)  # verl's _balance_batch padding
    lens = [t["response_len"] for t in batch.tags]
    old = [-torch.rand(r) for r in lens]
    mask = torch.tensor(list(gate) + [0.0] * (len(batch) - len(gate)))  # padding rows: weight 0
    tq.kv_batch_put(keys=batch.keys, partition_id="train", fields=TensorDict(
        {"old_log_probs": torch.nested.as_nested_tensor(old, layout=torch.jagged), "mopd_kl_mask": mask},
        batch_size=[len(batch)]))
    return batch, samples, old


def test_score_teachers_end_to_end_through_transfer_queue(ray_tq, teachers, monkeypatch, tmp_path):
    from verl.workers.utils.padding import no_padding_2_padding

    group, models = teachers
    platforms = ["desktop", "mobile", "desktop", "desktop", "mobile", "desktop", "mobile"]
    gate = [1.0, 1.0, 1.0, 0.0, 1.0, 1.0, 0.0]
    batch, samples, old = _store_step(ray_tq, models, platforms, gate)
    assert len(batch) == 8 and batch.tags[-1]["is_padding"]

    puts = []  # what the driver hands to Ray (dispatched shards) and gets back
    real_put, real_get = ray.put, ray.get
    monkeypatch.setattr(ray, "put", lambda obj, **kw: puts.append(_nbytes(obj)) or real_put(obj, **kw))
    monkeypatch.setattr(ray, "get", lambda refs, **kw: (lambda out: puts.append(_nbytes(out)) or out)(
        real_get(refs, **kw)))
    tq = RecordingTQ(ray_tq)
    metrics = score_teachers(group, batch, tq)
    monkeypatch.undo()

    stored = ray_tq.kv_batch_get(keys=batch.keys, partition_id="train",
                                 select_fields=["teacher_logprobs", "prompts", "responses"])
    assert stored["teacher_logprobs"].is_nested and stored["teacher_logprobs"].shape[-1] == 1
    teacher = no_padding_2_padding(stored["teacher_logprobs"], stored).squeeze(-1)  # what the loss reads
    for i, (s, p) in enumerate(zip(samples, platforms, strict=True)):
        r = len(s["responses"])
        if gate[i]:
            torch.testing.assert_close(teacher[i, :r].double(), direct_vl_logprobs(models[p], s), atol=1e-5, rtol=0)
            other = models["mobile" if p == "desktop" else "desktop"]
            assert (teacher[i, :r].double() - direct_vl_logprobs(other, s)).abs().max() > 1e-3
        else:
            assert torch.equal(teacher[i, :r], old[i])  # gated: the student's own log-probs, K3 = 0
        assert teacher[i, r:].eq(0).all()

    assert metrics["mopd_teacher/desktop/samples"] == 4 and metrics["mopd_teacher/desktop/scored_samples"] == 3
    assert metrics["mopd_teacher/mobile/scored_samples"] == 2
    assert metrics["mopd_teacher/desktop/tokens"] == sum(len(samples[i]["responses"]) for i in (0, 2, 5))
    assert metrics["mopd_teacher/skipped_fraction"] == pytest.approx(2 / 7)
    assert metrics["mopd_teacher/desktop/k3_mean"] > 0

    # F6: the images never pass through the driver; each rank fetched its own shard
    assert "multi_modal_inputs" not in tq.requested and "<all>" not in tq.requested
    image_bytes = sum(_nbytes(s["multi_modal_inputs"]) for s in samples)
    driver_bytes = tq.bytes + sum(puts)
    pulled = ray_tq.kv_batch_get(keys=batch.keys[:7], partition_id="train",
                                 select_fields=["input_ids", "prompts", "responses", "response_mask", "position_ids",
                                                "multi_modal_inputs", "platform", "mopd_kl_mask", "old_log_probs"])
    print(f"\nbytes through the driver: {driver_bytes} (images in the step: {image_bytes}; "
          f"pulling the samples as before: {_nbytes(pulled)})")
    assert driver_bytes < image_bytes / 4
    # the synthetic rows added for the 2-rank desktop group were removed again
    listed = ray_tq.kv_list(partition_id="train")["train"]
    assert not [k for k in listed if k.startswith("mopd_teacher_pad_")]

    # the smoke's step dump holds every sample with the stored values, response only
    rows = torch.load(dump_step(batch, ray_tq, str(tmp_path), step=1), weights_only=False)["rows"]
    assert len(rows) == len(batch.keys) and [r["key"] for r in rows] == list(batch.keys)
    rows = [r for r in rows if r["gate"] and not r["padding"]]
    assert sorted(r["platform"] for r in rows) == ["desktop"] * 3 + ["mobile"] * 2
    for row in rows:
        i = next(j for j, s in enumerate(samples) if torch.equal(s["input_ids"], row["input_ids"]))
        torch.testing.assert_close(row["teacher"].double(), direct_vl_logprobs(models[row["platform"]], samples[i]),
                                   atol=1e-5, rtol=0)
    ray_tq.kv_clear(keys=batch.keys, partition_id="train")


def test_in_memory_tensordict_from_transfer_queue_matches_direct_forward(ray_tq, teachers):
    """``compute_teacher_logprobs`` on a TensorDict as TransferQueue returns it (jagged, 3-D
    position ids), uneven per-platform counts on the 2-rank group (padded by repetition)."""
    group, models = teachers
    platforms = ["desktop", "desktop", "desktop", "mobile", "desktop"]
    batch, samples, old = _store_step(ray_tq, models, platforms, [1.0] * 5, seed=3)
    data = ray_tq.kv_batch_get(keys=batch.keys[:5], partition_id="train")
    assert data["input_ids"].is_nested and data["position_ids"].dim() == 3
    logp, metrics = group.compute_teacher_logprobs(data)
    assert logp.is_nested
    for row, s, p in zip(logp.unbind(0), samples, platforms, strict=True):
        torch.testing.assert_close(row.double(), direct_vl_logprobs(models[p], s), atol=1e-5, rtol=0)
    assert metrics["mopd_teacher/desktop/tokens"] == sum(len(s["responses"]) for s in samples if s["platform"] ==
                                                         "desktop")
    ray_tq.kv_clear(keys=batch.keys, partition_id="train")


def test_a_shard_of_samples_all_of_one_length_is_scored_right(ray_tq, teachers):
    """Samples of one length: TransferQueue packs their (4, L) position ids with the channel dim
    ragged, and verl's maybe_fix_3d_position_ids would slice them into garbage (the CPU smoke's
    resumed step 3 crashed on it); the teachers read both layouts."""
    group, models = teachers
    platforms = ["mobile", "mobile", "desktop", "desktop", "desktop", "desktop"]
    batch, samples, _ = _store_step(ray_tq, models, platforms, [1.0] * 6, seed=9, lengths=(5, 4))
    assert len({len(s["input_ids"]) for s in samples}) == 1
    fetched = ray_tq.kv_batch_get(keys=batch.keys[:6], partition_id="train", select_fields=["position_ids"])
    assert fetched["position_ids"]._ragged_idx == 1  # the channel-ragged packing
    score_teachers(group, batch, ray_tq)
    stored = ray_tq.kv_batch_get(keys=batch.keys[:6], partition_id="train",
                                 select_fields=["teacher_logprobs", "prompts", "responses"])
    from verl.workers.utils.padding import no_padding_2_padding

    teacher = no_padding_2_padding(stored["teacher_logprobs"], stored).squeeze(-1)
    for i, (s, p) in enumerate(zip(samples, platforms, strict=True)):
        torch.testing.assert_close(teacher[i].double(), direct_vl_logprobs(models[p], s), atol=1e-5, rtol=0)
    ray_tq.kv_clear(keys=batch.keys, partition_id="train")


def test_gated_rows_without_length_tags_read_the_stored_prompts(ray_tq, teachers):
    """No teacher call at all (every sample gated off), sample tags without ``prompt_len``: the
    gated rows' ``teacher_logprobs`` are the student's ``old_log_probs`` at the response positions."""
    from transfer_queue import KVBatchMeta
    from verl.workers.utils.padding import no_padding_2_padding

    group, models = teachers
    batch, samples, old = _store_step(ray_tq, models, ["mobile", "desktop", "mobile"], [0.0, 0.0, 0.0], seed=5)
    bare = KVBatchMeta(keys=batch.keys, tags=[{"status": "success"} for _ in batch.keys], partition_id="train")
    metrics = score_teachers(group, bare, ray_tq)
    assert metrics["mopd_teacher/skipped_fraction"] == 1.0 and metrics["mopd_teacher/mobile/tokens"] == 0
    stored = ray_tq.kv_batch_get(keys=batch.keys, partition_id="train",
                                 select_fields=["teacher_logprobs", "prompts", "responses"])
    teacher = no_padding_2_padding(stored["teacher_logprobs"], stored).squeeze(-1)
    for i, lp in enumerate(old):
        assert torch.equal(teacher[i, : len(lp)], lp)
    ray_tq.kv_clear(keys=batch.keys, partition_id="train")
