"""``verl-mopd prepare`` peak memory as the input grows: 1k -> 20k steps of 1920x1080 PNG screenshots.

    python benchmarks/data.py [--steps 1000 20000] [--kb 300] [--dir /tmp/prep-bench] [--keep]

Every step has its own screenshot: a distinct 1920x1080 RGB PNG of about ``--kb`` KB (AgentNet's
Windows/Mac frames average ~0.3 MB, Ubuntu's ~0.9 MB). The PNGs are assembled from one deflate
stream computed once plus a few distinct rows per image, so 20k of them take about a minute to
write instead of an hour of zlib. Trajectories have 20 steps (AgentNet averages 18.6) and an
offline verdict; ``prepare`` runs with its defaults (images inside the parquet, ``--image-check
verify``) in a fresh process per size, and its peak RSS comes from ``wait4``. The script prints
one row per size and the RSS ratio of the largest to the smallest; the target (issue 13) is a
20k-step run under 2 GiB. Everything it writes goes under ``--dir`` and is removed at the end
(the 20k run needs about ``3 x steps x kb``: 18 GB at the defaults).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import struct
import subprocess
import sys
import time
import zlib

import numpy as np

W, H = 1920, 1080
ROW = 1 + 3 * W  # filter byte + RGB
DISTINCT_ROWS = 4  # rows that make each image's bytes (and hash) unique
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _chunk(kind: bytes, data: bytes) -> bytes:
    return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))


class PngFactory:
    """Distinct, valid 1920x1080 PNGs of about ``kb`` KB, cheaply: the deflate stream of the rows
    they share is computed once; each image deflates only its own first rows in front of it."""

    def __init__(self, kb: int, seed: int = 0):
        rng = np.random.default_rng(seed)
        rows = np.full((H - DISTINCT_ROWS, ROW), 235, dtype=np.uint8)  # a light background
        rows[:, 0] = 0  # filter: none
        noisy = max(1, min(H - DISTINCT_ROWS, kb * 1024 // ROW))
        rows[:noisy, 1:] = rng.integers(0, 256, (noisy, ROW - 1), dtype=np.uint8)  # "content" that does not compress
        self.shared = rows.tobytes()
        comp = zlib.compressobj(1, zlib.DEFLATED, -15)
        self.shared_z = comp.compress(self.shared) + comp.flush(zlib.Z_FINISH)
        self.head = b"\x89PNG\r\n\x1a\n" + _chunk(b"IHDR", struct.pack(">IIBBBBB", W, H, 8, 2, 0, 0, 0))

    def make(self, i: int) -> bytes:
        first = bytearray(DISTINCT_ROWS * ROW)
        stamp = i.to_bytes(8, "big") * ((ROW - 1) // 8)
        for r in range(DISTINCT_ROWS):
            first[r * ROW + 1 : r * ROW + 1 + len(stamp)] = stamp
        comp = zlib.compressobj(1, zlib.DEFLATED, -15)
        first_z = comp.compress(bytes(first)) + comp.flush(zlib.Z_FULL_FLUSH)  # byte-aligned, not final
        adler = zlib.adler32(self.shared, zlib.adler32(bytes(first)))
        idat = b"\x78\x01" + first_z + self.shared_z + struct.pack(">I", adler)
        return self.head + _chunk(b"IDAT", idat) + _chunk(b"IEND", b"")


def make_input(root: str, steps: int, factory: PngFactory, per_traj: int = 20) -> str:
    """``steps`` steps in trajectories of ``per_traj``; screenshots ``imgs/<n>.png`` (shared across sizes)."""
    os.makedirs(os.path.join(root, "imgs"), exist_ok=True)
    path = os.path.join(root, f"traj_{steps}.jsonl")
    with open(path, "w") as f:
        for t in range(steps // per_traj):
            recs = []
            for i in range(per_traj):
                n = t * per_traj + i
                shot = os.path.join(root, "imgs", f"{n}.png")
                if not os.path.exists(shot):
                    with open(shot, "wb") as g:
                        g.write(factory.make(n))
                last = i == per_traj - 1
                action = {"action": "terminate", "status": "success"} if last else {
                    "action": "left_click", "coordinate": [(37 * n) % W, (53 * n) % H]}  # fmt: skip
                recs.append({"index": i, "screenshot": f"imgs/{n}.png", "action": action, "thought": f"step {i}",
                             "description": f"do step {i}"})  # fmt: skip
            f.write(json.dumps({
                "id": f"t{t}", "platform": "desktop", "instruction": f"task {t}", "screen_size": [W, H],
                "steps": recs, "judge": {"subtasks": [{"subtask": "all", "completed": True}]}}) + "\n")  # fmt: skip
    return path


def run_prepare(src: str, out: str) -> dict:
    """One ``prepare`` in a fresh process: peak RSS (wait4), CPU and wall seconds, exit status."""
    cmd = [sys.executable, "-m", "verl_mopd.data", "--input", src, "--out", out, "--no-progress"]
    env = {**os.environ, "PYTHONPATH": REPO + os.pathsep + os.environ.get("PYTHONPATH", "")}
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, env=env, cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - t0
    err = proc.stderr.read().decode()
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode != 0:
        raise SystemExit(f"prepare failed ({proc.returncode}):\n{err[-2000:]}")
    return {"rss_mb": usage.ru_maxrss / 1024, "cpu_s": usage.ru_utime + usage.ru_stime, "wall_s": wall}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--steps", type=int, nargs="+", default=[1000, 20000])
    p.add_argument("--kb", type=int, default=300, help="target PNG size")
    p.add_argument("--dir", default="/tmp/verl-mopd-prepare-bench")
    p.add_argument("--keep", action="store_true", help="keep the generated input")
    p.add_argument("--limit-gib", type=float, default=2.0, help="fail if the largest run's peak RSS exceeds this")
    args = p.parse_args(argv)
    os.makedirs(args.dir, exist_ok=True)
    factory = PngFactory(args.kb)
    import io

    from PIL import Image

    with Image.open(io.BytesIO(factory.make(7))) as im:
        im.load()  # the assembled PNG decodes
        assert im.size == (W, H)
    rows = []
    try:
        for steps in sorted(args.steps):
            t0 = time.perf_counter()
            src = make_input(args.dir, steps, factory)
            made = time.perf_counter() - t0
            image_gb = sum(os.path.getsize(os.path.join(args.dir, "imgs", f"{n}.png")) for n in range(steps)) / 1e9
            out = os.path.join(args.dir, f"out_{steps}")
            r = run_prepare(src, out)
            files = json.load(open(os.path.join(out, "manifest.json")))["files"]
            rows_written = sum(f.get("rows", 0) for rel, f in files.items() if rel.startswith("rl/"))
            r.update(steps=steps, image_gb=image_gb, gen_s=made, rows=rows_written,
                     out_gb=sum(f["bytes"] for f in files.values()) / 1e9)  # fmt: skip
            assert r["rows"] == steps, r
            shutil.rmtree(out)
            rows.append(r)
            print(f"{steps:>7} steps  images {image_gb:6.2f} GB  parquet {r['out_gb']:6.2f} GB"
                  f"  peak RSS {r['rss_mb']:7.0f} MB  cpu {r['cpu_s']:6.1f} s  wall {r['wall_s']:6.1f} s"
                  f"  ({steps / r['wall_s']:.0f} steps/s)", flush=True)  # fmt: skip
    finally:
        if not args.keep:
            shutil.rmtree(args.dir, ignore_errors=True)
    lo, hi = rows[0], rows[-1]
    ratio = hi["rss_mb"] / lo["rss_mb"]
    ok = hi["rss_mb"] < args.limit_gib * 1024
    print(f"peak RSS {hi['steps']} / {lo['steps']} steps = {ratio:.2f}x for {hi['steps'] / lo['steps']:.0f}x the steps;"
          f" {hi['steps']} steps {'under' if ok else 'OVER'} {args.limit_gib:g} GiB")  # fmt: skip
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
