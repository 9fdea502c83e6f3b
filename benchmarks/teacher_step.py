"""The teacher phase of a stage-2 step, today's way and the new way, then the paper-scale model.

Part 1 (CPU, measured, one run): a stage-2-shaped step in the real TransferQueue on a local Ray
cluster: GRPO groups of ``--rollouts`` responses per prompt, each prompt's screenshot stored once per
rollout (as verl's agent loop stores it), two colocated ``hf`` teachers (tiny random Qwen3-VL).

- today: every rollout's ``multi_modal_inputs`` read, the teachers one after the other, weights
  offloaded through fresh pageable host memory every step (verl's forward-only way);
- new: screenshots read once per group (``verl_mopd.teachers.fetch``), the teachers in one wave
  (``verl_mopd.teachers.placement.plan_teachers``, sizes from their ``config.json``), weights as the
  plan decides (resident here).

It prints the bytes each teacher read from TransferQueue per step, field by field, the weight bytes
moved per step (``HostWeights`` on the teachers' own tensors, in this process: on CPU a host-to-host
copy stands in for the host-to-GPU one), the wall time of the teacher phase, and the two teachers'
call spans (the timeline). The teacher log-probs of both ways are compared bit for bit.

Part 2 (arithmetic): the per-step model of the shipped 64-GPU recipe at the paper's sizes, today's
way and the new way, every assumption named (``docs/teachers.md`` states the same table).

    python benchmarks/teacher_step.py [--groups 8] [--rollouts 8] [--steps 3] [--model-only]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "teachers"))


# ------------------------------------------------------------------------------------------------
# part 1: measured on CPU
# ------------------------------------------------------------------------------------------------


def _fields_read(stats_before, stats_after) -> dict[str, int]:
    out: dict[str, int] = {}
    for before, after in zip(stats_before, stats_after, strict=True):
        for k, v in after["fields"].items():
            out[k] = out.get(k, 0) + v - before["fields"].get(k, 0)
    return out


def measure(groups: int, rollouts: int, steps: int, image_hw: tuple[int, int]) -> dict:
    import ray
    import transfer_queue as tq
    from _teacher_tiny import colocated_vl_teachers, store_groups
    from omegaconf import OmegaConf
    from transformers import AutoModelForImageTextToText

    from verl_mopd.teachers.group import PlatformTeacherGroup
    from verl_mopd.teachers.weights import HostWeights

    torch.set_num_threads(1)
    ray.init(num_cpus=6, include_dashboard=False, log_to_driver=False)
    tq.init(OmegaConf.create({"backend": {"SimpleStorage": {"num_data_storage_units": 1}}}))
    try:
        root = Path(tempfile.mkdtemp(prefix="teacher_step_"))
        cfg, paths, plan = colocated_vl_teachers(root, micro_batch_tokens=2048)
        group = PlatformTeacherGroup.build(cfg, use_gpu=False, num_threads=1, plan=plan)
        wgs = list(group.worker_groups.values())
        model = AutoModelForImageTextToText.from_pretrained(paths["desktop"]).eval()
        batch, _ = store_groups(tq, model, groups=groups, rollouts=rollouts, seed=1, image_hw=image_hw,
                                platform_of=lambda g: ("desktop", "mobile")[g % 2])
        ways = {"today": dict(share=False, waves=[["desktop"], ["mobile"]], weights="pageable"),
                "new": dict(share=True, waves=plan.waves, weights=None)}
        teachers = {p: AutoModelForImageTextToText.from_pretrained(path).eval() for p, path in paths.items()}
        results = {}
        group.score_transfer_queue(batch, tq)  # warm-up: a worker group's first dispatch is slow
        for name, way in ways.items():
            group.share_group_inputs, group.waves = way["share"], way["waves"]
            weights = {p: HostWeights(list(m.parameters()), "cpu", way["weights"] or plan.weights[p], pin=False)
                       for p, m in teachers.items()}
            for w in weights.values():
                w.offload()
            before = [s for wg in wgs for s in wg.fetch_stats()]
            walls, moved = [], 0
            for _ in range(steps):
                t0 = time.perf_counter()
                for w in weights.values():  # the weight moves of one step (load, call, offload)
                    w.load()
                group.score_transfer_queue(batch, tq)
                for w in weights.values():
                    w.offload()
                walls.append(time.perf_counter() - t0)
            after = [s for wg in wgs for s in wg.fetch_stats()]
            stored = tq.kv_batch_get(keys=batch.keys, partition_id="train", select_fields=["teacher_logprobs"])
            moved = sum(w.counts["pageable_copies"] + w.counts["pinned_copies"] for w in weights.values())
            results[name] = {
                "fields": {k: v // steps for k, v in _fields_read(before, after).items()},
                "weight_bytes": sum(w.counts["bytes"] for w in weights.values()) // steps,
                "pageable_copies": sum(w.counts["pageable_copies"] for w in weights.values()) // steps,
                "copies": moved // steps,
                "wall_s": sorted(walls)[len(walls) // 2],
                "timeline": dict(group.last_timeline),
                "logprobs": stored["teacher_logprobs"],
            }
        results["plan"] = plan
        return results
    finally:
        tq.close()
        ray.shutdown()


def report_measured(r: dict, groups: int, rollouts: int) -> None:
    today, new = r["today"], r["new"]
    same = torch.equal(today["logprobs"].values(), new["logprobs"].values())
    print(f"== part 1: the teacher phase on CPU, {groups} groups x {rollouts} rollouts, two colocated hf teachers ==")
    print(f"plan: {'; '.join(r['plan'].lines)}")
    print(f"teacher log-probs identical (torch.equal): {same}")
    print(f"{'field':22s} {'today B/step':>14s} {'new B/step':>12s} {'new/today':>9s}")
    for k in sorted(today["fields"], key=lambda k: -today["fields"][k]):
        a, b = today["fields"][k], new["fields"].get(k, 0)
        print(f"{k:22s} {a:14,d} {b:12,d} {b / a if a else 0:9.3f}")
    ta, tb = sum(today["fields"].values()), sum(new["fields"].values())
    print(f"{'all fields':22s} {ta:14,d} {tb:12,d} {tb / ta:9.3f}")
    print(f"weight bytes moved per step: today {today['weight_bytes']:,} ({today['pageable_copies']} pageable copies), "
          f"new {new['weight_bytes']:,} ({new['pageable_copies']} pageable copies; plan: {r['plan'].weights}); "
          f"new/today {new['weight_bytes'] / max(today['weight_bytes'], 1):.3f}")
    print(f"teacher phase wall time (median): today {today['wall_s'] * 1e3:.0f} ms, new {new['wall_s'] * 1e3:.0f} ms "
          f"(new/today {new['wall_s'] / today['wall_s']:.2f}; 2 shared cores, so overlap cannot halve it)")
    for name in ("today", "new"):
        tl = r[name]["timeline"]
        t0 = min(s for s, _ in tl.values())
        spans = ", ".join(f"{p} {s - t0:.3f}-{e - t0:.3f} s" for p, (s, e) in tl.items())
        (a0, a1), (b0, b1) = tl.values()
        overlap = max(0.0, min(a1, b1) - max(a0, b0))
        print(f"timeline {name:5s}: {spans}; overlap {overlap:.3f} s ({'overlapped' if overlap > 0 else 'in turn'})")


# ------------------------------------------------------------------------------------------------
# part 2: the paper-scale model
# ------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Assumptions:
    """Every number the per-step model uses. [audit] gpu_audit_3 §5; [hw] H100 SXM / its host;
    [recipe] the shipped 64-GPU layout; [est] an estimate of ours."""

    gpus: int = 64                         # [recipe] 8 x 8 H100
    gpus_per_node: int = 8                 # [recipe]
    peak_flops: float = 989e12             # [hw] bf16 dense per GPU
    mfu_teacher: float = 0.35              # [audit] 0.3-0.4 forward-only
    samples: int = 1024                    # [recipe] 128 prompts x 8 rollouts
    group: int = 8                         # [recipe] rollout.n
    prompt_tokens: int = 3300              # [audit] P, ~2.0-2.5k of them image tokens
    teacher_params: float = 32.8e9         # [audit] Qwen3-VL-32B text model (FLOPs: 2 x params x tokens)
    teacher_weight_bytes_per_gpu: float = 33.5e9 * 2 / 8  # [recipe] params_b 33.5, bf16, TP 8
    teachers: int = 2                      # [recipe] desktop, mobile
    f_on: float = 0.75                     # [audit] the gate's on-fraction, 0.5-1
    pixel_bytes: float = 56.5e6            # [audit] fp32 pixel_values per sample (50.1 / 62.7 MB)
    tq_read_bps: float = 2.0e9             # [est] TransferQueue read + deserialize, one fetching rank per node
    bcast_bps: float = 1.5e9               # [est] pickle + NCCL broadcast + unpickle over a TP-8 group
    pageable_bps: float = 4.0e9            # [audit] 32.8 GB/GPU in 6-12 s: ~3-5.5 GB/s per GPU, 8 GPUs sharing
    pinned_bps: float = 20e9               # [est] PCIe Gen5 x16 from pinned memory, 2 GPUs per switch
    rollout_s: tuple = (20.0, 65.0)        # [audit] 15-25 s / 40-90 s (short / long responses)
    old_logprob_s: tuple = (6.5, 8.5)      # [audit]
    gate_adv_s: float = 0.5                # [audit] < 1 s
    update_s: tuple = (17.5, 25.0)         # [audit] 15-20 s / 22-28 s
    weight_sync_s: float = 3.5             # [audit] 2-5 s


def paper_model(a: Assumptions, response_tokens: int, case: int, new: bool, prefix_shared: bool = False) -> dict:
    """Seconds per phase of one step. ``case``: 0 short (R~300) / 1 long (R~2k) responses.

    teachers, per teacher call (each teacher scores half the sent samples on all 64 GPUs):
      compute = 2 x params x tokens / (GPUs x peak x MFU); tokens = sent samples x (P + R), or with a
      prefix-shared forward (a group's prompt computed once) sent groups x P + sent samples x R;
      fetch   = (pixel bytes per node read) / tq_read_bps + same / bcast_bps, pixel bytes / group when new;
      weights = 2 x weight bytes per GPU / (pageable_bps today, 0 resident when new).
    today: the teachers one after the other, each load + fetch + compute + offload.
    new: one wave: the second teacher's fetch hides behind the first one's compute.
    """
    sent = a.samples * a.f_on / a.teachers  # per teacher
    tokens = (sent / a.group * a.prompt_tokens + sent * response_tokens) if prefix_shared \
        else sent * (a.prompt_tokens + response_tokens)
    compute = 2 * a.teacher_params * tokens / (a.gpus * a.peak_flops * a.mfu_teacher)
    nodes = a.gpus // a.gpus_per_node
    pixel_per_node = sent * a.pixel_bytes / nodes / (a.group if new else 1)
    fetch = pixel_per_node / a.tq_read_bps + pixel_per_node / a.bcast_bps
    weights = 0.0 if new else 2 * a.teacher_weight_bytes_per_gpu / a.pageable_bps
    if new:
        teacher = fetch + a.teachers * compute + max(0.0, fetch - compute)
    else:
        teacher = a.teachers * (weights + fetch + compute)
    other = a.rollout_s[case] + a.old_logprob_s[case] + a.gate_adv_s + a.update_s[case] + a.weight_sync_s
    return {"rollout": a.rollout_s[case], "old_logprob": a.old_logprob_s[case], "gate_adv": a.gate_adv_s,
            "update": a.update_s[case], "sync": a.weight_sync_s, "compute": a.teachers * compute, "fetch": a.teachers * fetch, "weights": a.teachers * weights,
            "teacher": teacher, "step": teacher + other, "share": teacher / (teacher + other),
            "fetched_bytes": a.teachers * sent * a.pixel_bytes / (a.group if new else 1),
            "weight_bytes_per_gpu": a.teachers * 2 * a.teacher_weight_bytes_per_gpu * (not new)}


def report_model(a: Assumptions) -> None:
    print("\n== part 2: per-step model, 64 x H100, 8B student, 2 x 32B teachers at TP 8, 1024 rollouts ==")
    print("assumptions: " + ", ".join(f"{k}={v}" for k, v in asdict(a).items()))
    head = f"{'':26s}" + "".join(f"{c:>15s}" for c in ("today R=300", "new R=300", "today R=2k", "new R=2k",
                                                         "+prefix R=300", "+prefix R=2k"))
    print(head)
    cols = [paper_model(a, 300, 0, False), paper_model(a, 300, 0, True), paper_model(a, 2000, 1, False),
            paper_model(a, 2000, 1, True), paper_model(a, 300, 0, True, True), paper_model(a, 2000, 1, True, True)]
    rows = [("rollout s", "rollout", 1), ("old log-probs s", "old_logprob", 1), ("gate + advantages s", "gate_adv", 1),
            ("actor update s", "update", 1), ("weight sync s", "sync", 1), ("teacher compute s", "compute", 1), ("teacher input fetch s", "fetch", 1),
            ("teacher weights s", "weights", 1), ("teacher phase s", "teacher", 1), ("step s", "step", 1),
            ("teacher share %", "share", 100), ("pixel bytes read GB", "fetched_bytes", 1e-9),
            ("weight bytes moved GB/GPU", "weight_bytes_per_gpu", 1e-9)]
    for label, key, scale in rows:
        print(f"{label:26s}" + "".join(f"{c[key] * scale:15.1f}" for c in cols))
    for f_on in (0.5, 1.0):
        b = Assumptions(f_on=f_on)
        s = [paper_model(b, 300, 0, True)["share"], paper_model(b, 2000, 1, True)["share"]]
        print(f"new way at f_on={f_on}: teacher share {s[0] * 100:.1f} % (R=300), {s[1] * 100:.1f} % (R=2k)")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--groups", type=int, default=8)
    ap.add_argument("--rollouts", type=int, default=8)
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--image", type=int, nargs=2, default=(32, 24), help="screenshot patches (h w)")
    ap.add_argument("--model-only", action="store_true", help="print part 2 only")
    args = ap.parse_args()
    if not args.model_only:
        measured = measure(args.groups, args.rollouts, args.steps, tuple(args.image))
        report_measured(measured, args.groups, args.rollouts)
        if not torch.equal(measured["today"]["logprobs"].values(), measured["new"]["logprobs"].values()):
            raise SystemExit("the new way changed the teacher log-probs")
    report_model(Assumptions())


if __name__ == "__main__":
    main()
