"""S3-3: a teacher worker reads each GRPO group's screenshot once, not once per rollout.

A stage-2-shaped step in the real TransferQueue: groups of ``G`` rollouts of one prompt, the same
screenshot stored once per rollout (as verl's agent loop stores it), an ``hf`` teacher on a 2-rank
verl worker group. The same step is scored the old way (every row's ``multi_modal_inputs`` read) and
the new way; the stored ``teacher_logprobs`` are compared bit for bit, and each rank's reads from
TransferQueue are counted field by field. Last, two colocated teachers that the memory plan puts in
one wave overlap on the same kind of step (their calls' spans on the workers' clocks).
"""

import numpy as np
import pytest
import torch
from _teacher_tiny import colocated_vl_teachers, direct_vl_logprobs, save_tiny_vl, store_groups, vl_sample
from hypothesis import given, settings
from hypothesis import strategies as st
from tensordict import TensorDict
from transformers import AutoModelForImageTextToText

from verl_mopd.config import MOPDConfig
from verl_mopd.teachers.fetch import SHARED_FIELD, group_uid, shared_input_rows, tensordict_nbytes
from verl_mopd.teachers.group import PlatformTeacherGroup

G, GROUPS = 4, 3


def release(group):
    """Free the group's Ray workers and CPU bundles (the package's local cluster has 8)."""
    import ray

    for wg in group.worker_groups.values():
        for worker in wg._workers:
            ray.kill(worker)
        for pg in wg.resource_pool.pgs or []:
            ray.util.remove_placement_group(pg)


@pytest.fixture(scope="module")
def desktop(ray_tq, tmp_path_factory):
    path = save_tiny_vl(tmp_path_factory.mktemp("group_inputs") / "desktop", seed=11)
    cfg = MOPDConfig.from_mapping({"teachers": {"desktop": {
        "model_path": path, "backend": "hf", "device": "cpu", "dtype": "float32", "n_gpus_per_node": 2,
        "micro_batch_tokens": 512}}})
    group = PlatformTeacherGroup.build(cfg, use_gpu=False, num_threads=1)
    yield cfg, group, AutoModelForImageTextToText.from_pretrained(path).eval()
    release(group)


def score_and_count(tq, cfg, wg, batch, *, share: bool):
    """Score the stored step; ``(stored teacher_logprobs, {field: bytes read by all ranks})``."""
    before = wg.fetch_stats()
    PlatformTeacherGroup(cfg, {"desktop": wg}, share_group_inputs=share).score_transfer_queue(batch, tq)
    after = wg.fetch_stats()
    fields = {}
    for a, b in zip(after, before, strict=True):
        for k, v in a["fields"].items():
            fields[k] = fields.get(k, 0) + v - b["fields"].get(k, 0)
    stored = tq.kv_batch_get(keys=batch.keys, partition_id="train", select_fields=["teacher_logprobs"])
    return stored["teacher_logprobs"], fields


def test_screenshots_read_once_per_group_same_scores_bit_for_bit(ray_tq, desktop):
    cfg, group, model = desktop
    wg = group.worker_groups["desktop"]
    batch, samples = store_groups(ray_tq, model, groups=GROUPS, rollouts=G, seed=7)
    old, old_fields = score_and_count(ray_tq, cfg, wg, batch, share=False)
    new, new_fields = score_and_count(ray_tq, cfg, wg, batch, share=True)

    assert torch.equal(old.values(), new.values()) and torch.equal(old.offsets(), new.offsets())
    teacher = new.unbind(0)
    for row, s in zip(teacher, samples, strict=True):  # and both are the teacher's scores
        p, r = len(s["prompts"]), len(s["responses"])
        torch.testing.assert_close(row[p - 1 : p - 1 + r, 0].double(), direct_vl_logprobs(model, s), atol=1e-5, rtol=0)

    image = tensordict_nbytes(TensorDict({SHARED_FIELD: [samples[0][SHARED_FIELD]]}, batch_size=[1]))
    print(f"\nTransferQueue bytes per field, {GROUPS} groups x {G} rollouts, 2 ranks: old {old_fields}, new {new_fields}")
    # one copy per rollout before; the groups' rows now sit in one shard each (6 rows per rank, so one
    # group straddles the two ranks): one copy per group and rank
    assert old_fields[SHARED_FIELD] == GROUPS * G * image
    assert new_fields[SHARED_FIELD] == (GROUPS + 1) * image
    for field in set(old_fields) - {SHARED_FIELD}:  # every other field read as before
        assert new_fields[field] == old_fields[field], field
    assert sum(new_fields.values()) <= sum(old_fields.values()) / 2.5
    ray_tq.kv_clear(keys=batch.keys, partition_id="train")


def test_rollouts_with_different_screenshots_are_not_merged(ray_tq, desktop):
    """Rows whose key has another uid, or whose response holds a masked (tool / environment) token,
    keep their own copy: scores equal the direct forward of each sample."""
    cfg, group, model = desktop
    wg = group.worker_groups["desktop"]
    batch, samples = store_groups(ray_tq, model, groups=2, rollouts=2, seed=3, shuffle=False)
    # rollout 1 of group 0 becomes a multi-turn trajectory: another screenshot, a masked response token
    other = vl_sample(model, np.random.default_rng(99), image_hw=(16, 12), prompt_len=5, response_len=0,
                      responses=[samples[1]["responses"]])[0]
    other.update(platform="desktop", prompts=samples[1]["prompts"], input_ids=samples[1]["input_ids"])
    other["response_mask"][0] = 0
    other["loss_mask"] = other["response_mask"].clone()
    from verl.utils.tensordict_utils import list_of_dict_to_tensordict

    ray_tq.kv_batch_put(keys=[batch.keys[1]], partition_id="train", fields=list_of_dict_to_tensordict([other]))
    samples[1] = other
    stored, _ = score_and_count(ray_tq, cfg, wg, batch, share=True)
    for row, s in zip(stored.unbind(0), samples, strict=True):
        p, r = len(s["prompts"]), len(s["responses"])
        torch.testing.assert_close(row[p - 1 : p - 1 + r, 0].double(), direct_vl_logprobs(model, s), atol=1e-5, rtol=0)
    assert not torch.equal(samples[0][SHARED_FIELD]["pixel_values"], other[SHARED_FIELD]["pixel_values"])
    ray_tq.kv_clear(keys=batch.keys, partition_id="train")


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 2), st.integers(0, 2), st.integers(0, 1), st.booleans()), min_size=1,
                max_size=12))
def test_shared_input_rows_only_merges_rows_of_one_prompt_with_unmasked_responses(rows):
    """Property: row i points at the first earlier row (or itself) with its uid and prompt, and only
    rows with an all-ones response mask point elsewhere or are pointed at."""
    keys = [f"u{uid}_{i}_0" for i, (uid, _, _, _) in enumerate(rows)]
    ids = [torch.tensor([7, prompt, 1, 2]) for _, prompt, _, _ in rows]
    masks = [torch.tensor([1, 1 - masked]) for _, _, masked, _ in rows]
    if rows[0][3]:  # a non-verl key shares with nothing
        keys[0] = "mopd_teacher_pad_x"
    owner = shared_input_rows(keys, torch.nested.as_nested_tensor(ids, layout=torch.jagged),
                              torch.nested.as_nested_tensor(masks, layout=torch.jagged))

    def shareable(i):
        return group_uid(keys[i]) is not None and rows[i][2] == 0

    for i, o in enumerate(owner):
        if not shareable(i):
            assert o == i
            continue
        same = [j for j in range(i + 1) if shareable(j) and rows[j][:2] == rows[i][:2]]
        assert o == same[0]


def test_group_uid_reads_verls_key_format():
    assert group_uid("a_b_3_0") == "a_b" and group_uid("f3c2e0_1_0") == "f3c2e0"
    assert group_uid("mopd_teacher_pad_abc_1") is None and group_uid("plain") is None


def test_two_colocated_teachers_overlap_when_the_plan_puts_them_together(ray_tq, tmp_path_factory):
    """S3-2: the plan (sizes from the local checkpoints) puts both colocated teachers in one wave; the
    group dispatches the wave before it waits, so their calls overlap on the workers' clocks. Without
    a plan they run in turn (today's order): no overlap."""
    cfg, paths, plan = colocated_vl_teachers(tmp_path_factory.mktemp("colocated"), micro_batch_tokens=512)
    assert plan.waves == [["desktop", "mobile"]]
    group = PlatformTeacherGroup.build(cfg, use_gpu=False, num_threads=1, plan=plan)
    try:
        model = AutoModelForImageTextToText.from_pretrained(paths["desktop"]).eval()
        batch, _ = store_groups(ray_tq, model, groups=8, rollouts=4, seed=5,
                                      platform_of=lambda g: ("desktop", "mobile")[g % 2])
        spans = {}
        group.score_transfer_queue(batch, ray_tq)  # warm-up: a worker group's first dispatch takes ~0.1 s
        for name, waves in (("together", plan.waves), ("in turn", [["desktop"], ["mobile"]])):
            group.waves = waves
            metrics = group.score_transfer_queue(batch, ray_tq)
            (a0, a1), (b0, b1) = group.last_timeline["desktop"], group.last_timeline["mobile"]
            spans[name] = (a0, a1, b0, b1, metrics["mopd_teacher/overlap_s"])
        print(f"\ncolocated teacher calls (start, end relative to the first start): "
              f"{ {k: [round(t - min(v[:4]), 3) for t in v[:4]] for k, v in spans.items()} }")
        a0, a1, b0, b1, overlap = spans["together"]
        assert overlap > 0 and max(a0, b0) < min(a1, b1), spans
        a0, a1, b0, b1, overlap = spans["in turn"]
        assert overlap == 0 and b0 >= a1
    finally:
        release(group)
        ray_tq.kv_clear(keys=batch.keys, partition_id="train")
