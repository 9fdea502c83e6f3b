"""``--out`` holds exactly one run's files: replaced whole, never half-written, resumed only when truly current."""

from __future__ import annotations

import hashlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from _data_helpers import record, relative, write_lines
from PIL import Image

from commands import prepare as prepare_main
from verl_mopd.data.convert import ParquetSink

REPO = Path(__file__).resolve().parents[2]


def _data(root: Path, name: str, specs: list[tuple[str, str]]) -> str:
    """A JSONL of trajectories ``(id, platform)`` with their screenshots under ``root``."""
    recs = [relative(record(str(root), tid=tid, platform=p), str(root)) for tid, p in specs]
    return write_lines(str(root / name), recs)


def _files(out: Path) -> dict[str, str]:
    return {str(p.relative_to(out)): hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(out.rglob("*")) if p.is_file()}


def _leftovers(top: Path) -> list[str]:
    return [str(p) for p in top.rglob("*") if p.name.endswith(".tmp") or ".prepare-" in p.name]


def _run(src: str, out: Path, *extra: str) -> int:
    return prepare_main(["--input", src, "--out", str(out), "--val-fraction", "0.5", "--no-progress", *extra])


@pytest.fixture()
def two_inputs(tmp_path):
    both = _data(tmp_path, "both.jsonl", [("d1", "desktop"), ("d2", "desktop"), ("m1", "mobile"), ("m2", "mobile")])
    one = _data(tmp_path, "one.jsonl", [("d1", "desktop")])
    return tmp_path, both, one


def test_a_rerun_with_other_input_replaces_the_outputs_whole(two_inputs):
    tmp, both, one = two_inputs
    out = tmp / "out"
    assert _run(both, out) == 0
    assert {"rl/val.parquet", "sft/mobile/train.parquet"} <= set(_files(out))
    (out / "notes.txt").write_text("mine")  # not an output: carried over, not listed
    assert _run(one, out) == 0
    files = set(_files(out))
    manifest = json.load(open(out / "manifest.json"))
    assert set(manifest["files"]) | {"manifest.json", "notes.txt"} == files  # exactly what this run wrote
    assert not any(f.startswith(("sft/mobile", "rl/val")) for f in files)  # no stale file, no train/val leak
    assert manifest["files"]["rl/train.parquet"]["rows"] == 2 and (out / "notes.txt").read_text() == "mine"
    for rel, info in manifest["files"].items():
        assert (out / rel).stat().st_size == info["bytes"]
    link = tmp / "link"
    link.symlink_to(out)  # a symlinked --out keeps pointing at the outputs
    assert _run(both, link) == 0
    assert link.is_symlink() and (out / "sft" / "mobile" / "train.parquet").is_file() and not _leftovers(tmp)


def test_an_interrupted_run_changes_nothing_and_is_never_up_to_date(two_inputs, monkeypatch, capsys):
    tmp, both, one = two_inputs
    out = tmp / "out"
    assert _run(both, out) == 0
    before = _files(out)
    calls = []
    real_flush = ParquetSink.flush

    def flush_then_interrupt(self):
        real_flush(self)
        calls.append(self.path)
        if len(calls) == 2:  # one file has a row group on disk, under its temp name
            raise KeyboardInterrupt

    monkeypatch.setattr(ParquetSink, "flush", flush_then_interrupt)
    assert _run(one, out) == 130  # verl-mopd's error boundary: interrupted
    monkeypatch.undo()
    assert _files(out) == before and not _leftovers(tmp)
    capsys.readouterr()
    assert _run(one, out) == 0  # the interrupted command redoes its work
    assert "up to date" not in capsys.readouterr().out
    assert json.load(open(out / "manifest.json"))["files"]["rl/train.parquet"]["rows"] == 2
    assert _run(one, out) == 0 and "up to date" in capsys.readouterr().out


SIGINT_CHILD = """
import sys, time
from verl_mopd.data.convert import ParquetSink
real = ParquetSink.flush
def slow(self):
    real(self)
    open(sys.argv[1], "w").close()
    time.sleep(60)
ParquetSink.flush = slow
from verl_mopd.cli import main
sys.exit(main(["prepare", *sys.argv[2:]]))
"""


def test_ctrl_c_during_the_parquet_write_leaves_nothing_behind(two_inputs):
    tmp, both, _ = two_inputs
    out, marker = tmp / "out", tmp / "writing"
    child = subprocess.Popen(
        [sys.executable, "-c", SIGINT_CHILD, str(marker), "--input", both, "--out", str(out), "--no-progress"],
        cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)}, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),  # a background shell ignores SIGINT
    )  # fmt: skip
    try:
        deadline = time.time() + 120
        while not marker.exists() and child.poll() is None and time.time() < deadline:
            time.sleep(0.05)
        assert marker.exists(), child.communicate(timeout=5)
        assert list(tmp.glob(".out.prepare-*/rl/*.tmp"))  # caught in the middle of a parquet write
        child.send_signal(signal.SIGINT)
        _, err = child.communicate(timeout=60)
    finally:
        child.kill()
    assert child.returncode == 130 and b"verl-mopd prepare: interrupted" in err
    assert not out.exists() and not _leftovers(tmp)


def _png0(path: Path, color) -> None:
    Image.new("RGB", (100, 50), color).save(path, format="PNG", compress_level=0)  # size fixed by the pixel count


def test_the_fingerprint_covers_screenshot_bytes_not_just_names_sizes_and_times(tmp_path, capsys):
    rec = relative(record(str(tmp_path), tid="t"), str(tmp_path))
    shot = tmp_path / rec["steps"][0]["screenshot"]
    _png0(shot, (1, 2, 3))
    src = write_lines(str(tmp_path / "t.jsonl"), [rec])
    out = tmp_path / "out"
    assert _run(src, out, "--val-fraction", "0") == 0
    assert _run(src, out, "--val-fraction", "0") == 0 and "up to date" in capsys.readouterr().out
    st = shot.stat()
    _png0(shot, (200, 100, 0))  # other pixels, same byte count; then the old times back
    os.utime(shot, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert (shot.stat().st_size, shot.stat().st_mtime_ns) == (st.st_size, st.st_mtime_ns)
    assert _run(src, out, "--val-fraction", "0") == 0
    assert "up to date" not in capsys.readouterr().out
    import pandas as pd

    row = pd.read_parquet(out / "rl" / "train.parquet").iloc[0]
    assert row["images"][0]["bytes"] == shot.read_bytes()


def test_a_killed_runs_folder_is_removed_and_a_foreign_out_is_refused(two_inputs, capsys):
    tmp, both, _ = two_inputs
    dead = tmp / ".out.prepare-999999999-dead"  # no such process
    live = tmp / f".out.prepare-{os.getpid()}-live"  # ours: alive
    for d in (dead, live):
        (d / "rl").mkdir(parents=True)
        (d / "rl" / "train.parquet.tmp").write_bytes(b"torn")
    assert _run(both, tmp / "out") == 0
    assert not dead.exists() and live.exists()

    mine = tmp / "mine"
    mine.mkdir()
    (mine / "thesis.tex").write_text("do not delete")
    for bad, needle in [(mine, "not the output of an earlier prepare"), (tmp / "both.jsonl", "is not a folder")]:
        assert _run(both, bad) == 2 and needle in capsys.readouterr().err
    assert (mine / "thesis.tex").read_text() == "do not delete" and (tmp / "both.jsonl").is_file()
    cache_only = tmp / "resumed"
    (cache_only / "judge_cache" / "ab").mkdir(parents=True)  # a first run interrupted while judging
    assert _run(both, cache_only) == 0 and (cache_only / "judge_cache" / "ab").is_dir()
