"""Teacher routing benchmark (CPU, tiny random models).

1. routing overhead: split + take_rows + merge of a mixed step batch, relative to one teacher
   forward (``score_rows``) over the same batch.
2. dispatch: a mixed batch through ``PlatformTeacherGroup`` (both teachers in flight) vs the two
   platform halves one after another, on a local Ray cluster with one CPU worker per teacher.

    python benchmarks/teachers.py [--n 64] [--prompt-len 96] [--response-len 64]
"""

import argparse
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "teachers"))
from _teacher_tiny import padded_batch, save_tiny_lm  # noqa: E402


def best(fn, repeats=3):
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return min(times)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=64)
    ap.add_argument("--prompt-len", type=int, default=96)
    ap.add_argument("--response-len", type=int, default=64)
    args = ap.parse_args()
    torch.set_num_threads(1)
    import ray
    from transformers import AutoModelForCausalLM
    from verl.protocol import DataProto

    from verl_mopd.config import MOPDConfig
    from verl_mopd.teachers.backends.hf import rows_from_batch, score_rows
    from verl_mopd.teachers.group import PlatformTeacherGroup
    from verl_mopd.teachers.router import merge, routing_keys, split, take_rows

    n = args.n
    plats = list(np.random.default_rng(0).permutation(["desktop", "mobile"] * (n // 2)))
    tensors, plat = padded_batch(plats, prompt_len=args.prompt_len, response_len=args.response_len, seed=1)
    data = DataProto.from_dict(tensors=tensors, non_tensors={"platform": plat})
    tmp = Path(tempfile.mkdtemp())
    paths = {p: save_tiny_lm(tmp / p, seed=i, hidden=256, layers=4) for i, p in enumerate(["desktop", "mobile"])}
    model = AutoModelForCausalLM.from_pretrained(paths["desktop"]).eval()

    def route():
        index = split(routing_keys(data), known=["desktop", "mobile"])
        parts = {k: take_rows(data, v).batch["responses"].float() for k, v in index.items()}
        merge(parts, index, n)

    rows, _ = rows_from_batch(data)
    t_route = best(route, 5)
    t_fwd = best(lambda: score_rows(model, rows, 16384), 2)
    print(f"batch {n} x ({args.prompt_len}+{args.response_len}) tokens, teacher hidden 256 x 4 layers, 1 thread")
    print(f"routing split+take+merge: {t_route * 1e3:.2f} ms; teacher forward: {t_fwd * 1e3:.1f} ms; "
          f"overhead ratio {t_route / t_fwd:.4f}")

    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    cfg = MOPDConfig.from_mapping({"teachers": {
        p: {"model_path": v, "device": "cpu", "dtype": "float32"} for p, v in paths.items()}})
    group = PlatformTeacherGroup.build(cfg, use_gpu=False, num_threads=1)
    halves = {p: DataProto.from_dict(tensors={k: v[torch.as_tensor(r)] for k, v in tensors.items()},
                                     non_tensors={"platform": plat[r]}) for p, r in split(plat).items()}
    group.compute_teacher_logprobs(data)
    t_conc = best(lambda: group.compute_teacher_logprobs(data))
    t_seq = best(lambda: [group.compute_teacher_logprobs(h) for h in halves.values()])
    _, m = group.compute_teacher_logprobs(data)
    print(f"dispatch: concurrent {t_conc:.2f} s, sequential {t_seq:.2f} s, ratio {t_conc / t_seq:.2f}; "
          f"in-call wall / sum(teacher times) "
          f"{m['mopd_teacher/wall_s'] / (m['mopd_teacher/desktop/time_s'] + m['mopd_teacher/mobile/time_s']):.2f}")
    ray.shutdown()


if __name__ == "__main__":
    main()
