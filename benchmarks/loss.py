"""mopd_k3 vs verl's built-in k3 distillation loss: forward+backward time and memory.

Same tensors for both paths (default 64 x 4096 tokens, float32):
  verl:  kl_penalty(student, teacher, "k3") -> clamp(loss_max_clamp=10) -> agg_loss(token-mean)
         (what verl's distillation_loss does for loss_mode=k3 with its dataclass defaults)
  ours:  k3_kl(student, teacher, kl_mask=mopd_kl_mask (bs, 1)) -> agg_loss(token-mean)

Prints the time ratio ours/verl and the bytes each path saves for backward (on CUDA also the
peak allocated memory). Run: python benchmarks/loss.py [--bs 64 --len 4096 --device cpu]
"""

import argparse
import statistics
import time

import torch
from verl.trainer.ppo.core_algos import agg_loss, kl_penalty

from verl_mopd.losses import k3_kl


def verl_path(student, teacher, mask, kl_mask):
    kl = kl_penalty(logprob=student, ref_logprob=teacher, kl_penalty="k3").clamp(min=-10.0, max=10.0)
    return agg_loss(loss_mat=kl, loss_mask=mask, loss_agg_mode="token-mean")


def ours_path(student, teacher, mask, kl_mask):
    return agg_loss(loss_mat=k3_kl(student, teacher, kl_mask=kl_mask), loss_mask=mask, loss_agg_mode="token-mean")


def saved_bytes(fn, *args):
    total = 0

    def pack(t):
        nonlocal total
        total += t.numel() * t.element_size()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        fn(*args)
    return total


def bench(fn, student, teacher, mask, kl_mask, repeats, sync):
    times = []
    for i in range(repeats + 3):
        student.grad = None
        sync()
        t0 = time.perf_counter()
        fn(student, teacher, mask, kl_mask).backward()
        sync()
        if i >= 3:  # warm-up
            times.append(time.perf_counter() - t0)
    return statistics.median(times)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--bs", type=int, default=64)
    parser.add_argument("--len", type=int, default=4096)
    parser.add_argument("--repeats", type=int, default=30)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    args = parser.parse_args()

    g = torch.Generator().manual_seed(0)
    student = (-torch.rand(args.bs, args.len, generator=g) * 6).to(args.device).requires_grad_(True)
    teacher = (-torch.rand(args.bs, args.len, generator=g) * 6).to(args.device)
    lengths = torch.randint(args.len // 4, args.len + 1, (args.bs,), generator=g).to(args.device)
    mask = (torch.arange(args.len, device=args.device) < lengths[:, None]).float()
    kl_mask = (torch.rand(args.bs, 1, generator=g) < 0.7).float().to(args.device)
    sync = torch.cuda.synchronize if args.device.startswith("cuda") else (lambda: None)

    rows = []
    for name, fn in (("verl k3 + clamp + agg_loss", verl_path), ("mopd_k3 (gated) + agg_loss", ours_path)):
        t = bench(fn, student, teacher, mask, kl_mask, args.repeats, sync)
        saved = saved_bytes(fn, student, teacher, mask, kl_mask)
        peak = None
        if args.device.startswith("cuda"):
            torch.cuda.reset_peak_memory_stats()
            base = torch.cuda.memory_allocated()
            fn(student, teacher, mask, kl_mask).backward()
            peak = torch.cuda.max_memory_allocated() - base
        rows.append((name, t, saved, peak))

    print(f"{args.bs} x {args.len} tokens, float32, {args.device}, torch {torch.__version__}, "
          f"threads {torch.get_num_threads()}")
    for name, t, saved, peak in rows:
        extra = f", peak +{peak / 2**20:.1f} MiB" if peak is not None else ""
        print(f"  {name:30s} {t * 1e3:8.2f} ms fwd+bwd, saved for backward {saved / 2**20:6.1f} MiB{extra}")
    (_, t_verl, s_verl, _), (_, t_ours, s_ours, _) = rows
    print(f"ratio ours/verl: time {t_ours / t_verl:.2f}x, saved-for-backward memory {s_ours / s_verl:.2f}x")


if __name__ == "__main__":
    main()
