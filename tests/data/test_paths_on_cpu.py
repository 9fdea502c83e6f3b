"""Screenshot paths are confined to their data root: escapes (``..``, absolute, symlinks) are refused and never opened."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest
from _data_helpers import png, png_bytes, read_jsonl_dicts, write_lines
from hypothesis import given, settings
from hypothesis import strategies as st

from verl_mopd.data.clean import CleanConfig, clean
from commands import prepare as prepare_main
from verl_mopd.data.images import DataRoots
from verl_mopd.data.judges import build_messages
from verl_mopd.data.schema import read_jsonl

_OPENED: list[str] | None = None


def _audit(event, args):
    if event == "open" and _OPENED is not None and isinstance(args[0], (str, bytes, os.PathLike)):
        _OPENED.append(os.fsdecode(args[0]))


sys.addaudithook(_audit)  # records only while a test sets _OPENED


def _traj(tid: str, shot: str) -> dict:
    """Step 0 takes the screenshot under test; step 1 a good one."""
    return {
        "id": tid, "platform": "desktop", "instruction": f"task {tid}", "screen_size": [40, 30],
        "steps": [{"index": 0, "screenshot": shot, "action": {"action": "left_click", "coordinate": [5, 5]}},
                  {"index": 1, "screenshot": "imgs/end.png", "action": {"action": "terminate", "status": "success"}}],
        "judge": {"subtasks": [{"subtask": "s", "completed": True}]},
    }  # fmt: skip


@pytest.fixture()
def hostile(tmp_path):
    """A data folder whose JSONL points in and out of it in every way we know."""
    data, outside, sibling = tmp_path / "data", tmp_path / "outside", tmp_path / "sibling"
    secret_png = png(str(outside / "secret.png"), color=(1, 2, 3))
    (tmp_path / "secret.txt").write_text("root:x:0:0:TOP-SECRET\n")
    png(str(data / "imgs" / "ok.png"), color=(200, 0, 0))
    png(str(data / "imgs" / "end.png"), color=(0, 200, 0))
    png(str(sibling / "s.png"), color=(0, 0, 200))
    os.symlink(secret_png, data / "imgs" / "link_out.png")
    os.symlink(outside, data / "linkdir")
    os.symlink(data / "imgs" / "ok.png", data / "imgs" / "link_in.png")
    cases = {
        "esc-rel": "../secret.txt",
        "esc-dotdot-inside": "imgs/../../outside/secret.png",
        "esc-abs": secret_png,
        "esc-etc": "../" * 12 + "etc/hostname",
        "esc-symlink-file": "imgs/link_out.png",
        "esc-symlink-dir": "linkdir/secret.png",
        "esc-nul": "imgs/ok.png\x00.txt",
        "sibling": "../sibling/s.png",
        "ok-rel": "imgs/ok.png",
        "ok-abs-inside": str(data / "imgs" / "ok.png"),
        "ok-symlink-in": "imgs/link_in.png",
        "ok-dot": "./imgs/./ok.png",
    }
    src = write_lines(str(data / "t.jsonl"), [_traj(tid, shot) for tid, shot in cases.items()])
    secrets = [Path(secret_png).read_bytes(), b"TOP-SECRET"]
    forbidden = {os.path.realpath(p) for p in (secret_png, tmp_path / "secret.txt", "/etc/hostname")}
    return src, tmp_path, secrets, forbidden


def _all_output_bytes(out: Path) -> bytes:
    return b"".join(p.read_bytes() for p in out.rglob("*") if p.is_file() and p.suffix == ".parquet")


def test_prepare_refuses_every_escape_and_never_opens_it(hostile):
    global _OPENED
    src, tmp, secrets, forbidden = hostile
    out = tmp / "out"
    _OPENED = []
    try:
        assert prepare_main(["--input", src, "--out", str(out), "--val-fraction", "0", "--no-progress"]) == 0
        opened = {os.path.realpath(p) for p in _OPENED}
    finally:
        _OPENED = None
    assert not opened & forbidden  # refused paths were never opened, not even to check them
    dropped = {d["id"]: d for d in read_jsonl_dicts(str(out / "dropped.jsonl"))}
    refused = {tid for tid, d in dropped.items() if (d["rule"], d["kind"]) == ("screenshots", "refused_path")}
    assert refused == {"esc-rel", "esc-dotdot-inside", "esc-abs", "esc-etc", "esc-symlink-file", "esc-symlink-dir",
                       "esc-nul", "sibling"}  # fmt: skip
    assert "outside the data root" in dropped["esc-symlink-file"]["detail"] and "--image-root" in dropped["esc-abs"]["detail"]
    kept = [t["id"] for t in read_jsonl_dicts(str(out / "cleaned.jsonl"))]
    assert kept == ["ok-rel", "ok-abs-inside", "ok-symlink-in", "ok-dot"]
    blob = _all_output_bytes(out)
    assert blob and not any(s in blob for s in secrets)


def test_image_root_allows_a_named_folder_and_nothing_else(hostile):
    src, tmp, secrets, _ = hostile
    out = tmp / "out2"
    args = ["--input", src, "--out", str(out), "--val-fraction", "0", "--no-progress", "--image-root", str(tmp / "sibling")]
    assert prepare_main(args) == 0
    kept = [t["id"] for t in read_jsonl_dicts(str(out / "cleaned.jsonl"))]
    assert "sibling" in kept and not any(k.startswith("esc-") for k in kept)
    assert png_bytes(color=(0, 0, 200)) in _all_output_bytes(out)  # the allowed image is in the parquet
    assert not any(s in _all_output_bytes(out) for s in secrets)


def test_readers_that_skip_the_screenshots_rule_still_never_read_a_refused_path(hostile, capsys):
    src, tmp, secrets, forbidden = hostile
    out = tmp / "out3"
    assert prepare_main(["--input", src, "--out", str(out), "--skip-rule", "screenshots", "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert "refusing to read it" in err and "outside the data root" in err
    assert not out.exists() and not list(tmp.glob(".out3.prepare-*"))  # nothing half-written
    # the judge never uploads one either
    trajs = {t.id: t for t in read_jsonl(src)}
    with pytest.raises(ValueError, match="refusing to read"):
        build_messages(trajs["esc-abs"], max_images=3)
    msg = build_messages(trajs["ok-symlink-in"], max_images=3)
    assert [c["type"] for c in msg[0]["content"]] == ["text", "image_url", "image_url"]


def test_clean_api_confines_too(hostile):
    src, *_ = hostile
    drops: list = []
    trajs = list(read_jsonl(src, drops))
    kept, dropped = clean(trajs, CleanConfig())
    assert {d.id for d in dropped if d.kind == "refused_path"} >= {"esc-symlink-dir", "esc-etc"}
    assert all(not s.path_error for t in kept for s in t.steps)
    assert all(os.path.isabs(s.screenshot) and s.screenshot == os.path.realpath(s.screenshot) for t in kept for s in t.steps)


# --------------------------------------------------------------------------- property: the confinement rule

SEGMENTS = ["..", ".", "a", "b", "in_link", "out_link", "loop", "x.png"]


@pytest.fixture(scope="module")
def tree(tmp_path_factory):
    top = tmp_path_factory.mktemp("tree")
    root, outside = top / "root", top / "outside"
    for d in (root / "a", root / "b", outside / "a"):
        d.mkdir(parents=True)
    os.symlink(root / "b", root / "a" / "in_link")
    os.symlink(outside, root / "a" / "out_link")
    os.symlink(root, root / "b" / "loop")
    os.symlink(top, root / "b" / "out_link")
    return root, outside


@settings(max_examples=300, deadline=None)
@given(st.lists(st.sampled_from(SEGMENTS), min_size=1, max_size=7), st.sampled_from(["", "root", "outside"]))
def test_resolve_accepts_exactly_the_paths_under_the_root(tree, segments, anchor):
    root, outside = tree
    raw = os.path.join(*segments)
    if anchor:
        raw = os.path.join(str(root if anchor == "root" else outside), raw)
    path, problem = DataRoots.of(str(root)).resolve(raw)
    # reference: pathlib's own resolution (symlinks followed, non-strict) and containment
    ref = Path(raw if os.path.isabs(raw) else root / raw).resolve()
    inside = ref.is_relative_to(Path(root).resolve())
    assert (problem is None) == inside, (raw, ref, problem)
    if inside:
        assert path == str(ref)
    else:
        assert path == raw and "outside the data root" in problem


def test_json_with_escaped_nul_or_encoded_paths_stays_refused(tmp_path):
    png(str(tmp_path / "d" / "ok.png"))
    rec = _traj("x", "ok.png\u0000/../../../etc/hostname")
    rec["steps"][1]["screenshot"] = "ok.png"
    src = tmp_path / "d" / "t.jsonl"
    src.write_text(json.dumps(rec) + "\n")
    (t,) = read_jsonl(str(src))
    assert t.steps[0].path_error == "contains a NUL byte" and t.steps[1].path_error is None
