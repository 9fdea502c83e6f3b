"""The screenshots rule keeps only images that decode; the structure rule finds repeated frames by content."""

from __future__ import annotations

import os
import zlib

import pytest
from _data_helpers import png, png_bytes, read_jsonl_dicts, record, write_lines

from verl_mopd.data.clean import CleanConfig, check_structure, clean
from commands import prepare as prepare_main
from verl_mopd.data.images import ImageIndex, inspect_image
from verl_mopd.data.schema import Step, Trajectory, trajectory_from_dict

GOOD = png_bytes((64, 48), (10, 120, 230))


def _chunks(data: bytes) -> list[tuple[int, bytes]]:
    """(offset, type) of each PNG chunk."""
    out, pos = [], 8
    while pos < len(data):
        n = int.from_bytes(data[pos : pos + 4], "big")
        out.append((pos, data[pos + 4 : pos + 8]))
        pos += 12 + n
    return out


def _idat_flipped(data: bytes) -> bytes:
    pos = next(p for p, kind in _chunks(data) if kind == b"IDAT")
    b = bytearray(data)
    b[pos + 10] ^= 0x55  # inside the IDAT payload: the chunk CRC no longer matches
    return bytes(b)


def _idat_recompressed_garbage(data: bytes) -> bytes:
    """A PNG whose chunk CRCs are right but whose IDAT does not inflate to the image: only decoding sees it."""
    pos = next(p for p, kind in _chunks(data) if kind == b"IDAT")
    n = int.from_bytes(data[pos : pos + 4], "big")
    payload = zlib.compress(b"\x00" * 7)  # far too few scanlines
    chunk = len(payload).to_bytes(4, "big") + b"IDAT" + payload + zlib.crc32(b"IDAT" + payload).to_bytes(4, "big")
    return data[:pos] + chunk + data[pos + 12 + n :]


NOT_IMAGE = "is not a PNG / JPEG / WEBP image"
BAD_FILES = {
    "zero.png": (b"", "is empty (0 bytes)"),
    "text.png": (b"not an image, just text\n", NOT_IMAGE),
    "html.png": (b"<html><body>404</body></html>", NOT_IMAGE),
    "magic-only.png": (GOOD[:8], NOT_IMAGE),
    "header-only.png": (GOOD[:40], NOT_IMAGE),  # Pillow cannot identify a PNG cut before its first IDAT
    "half.png": (GOOD[: len(GOOD) // 2], "truncated or corrupt"),
    "no-iend.png": (GOOD[:-12], "truncated or corrupt"),
    "crc.png": (_idat_flipped(GOOD), "truncated or corrupt"),
    "half.jpg": (png_bytes((64, 48), (10, 120, 230), "JPEG")[:300], "truncated or corrupt"),
    "gif.png": (png_bytes((8, 8), fmt="GIF"), NOT_IMAGE),
}


@pytest.mark.parametrize("name", sorted(BAD_FILES))
def test_unusable_files_are_named(tmp_path, name):
    data, problem = BAD_FILES[name]
    (tmp_path / name).write_bytes(data)
    info = inspect_image(str(tmp_path / name))
    assert info.problem is not None and problem in info.problem and info.size is None


def test_not_regular_files_are_never_opened(tmp_path):
    os.mkfifo(tmp_path / "fifo.png")  # opening it would block forever
    (tmp_path / "dir.png").mkdir()
    assert inspect_image(str(tmp_path / "fifo.png")).problem == "is not a regular file"
    assert inspect_image(str(tmp_path / "dir.png")).problem == "is not a regular file"
    assert inspect_image(str(tmp_path / "none.png")).problem == "does not exist"


def test_good_images_record_size_format_and_hash(tmp_path):
    for name, fmt in [("a.png", "PNG"), ("b.jpg", "JPEG"), ("c.webp", "WEBP"), ("png-named.jpg", "PNG")]:
        (tmp_path / name).write_bytes(png_bytes((33, 21), (1, 2, 3), fmt))
        info = inspect_image(str(tmp_path / name))
        assert (info.problem, info.format, info.size) == (None, fmt, (33, 21))
        assert len(info.sha256) == 32 and info.nbytes == (tmp_path / name).stat().st_size


def test_only_decoding_sees_a_crc_valid_but_broken_stream(tmp_path):
    (tmp_path / "x.png").write_bytes(_idat_recompressed_garbage(GOOD))
    assert inspect_image(str(tmp_path / "x.png")).problem is None  # chunk CRCs are all right
    assert "truncated or corrupt" in inspect_image(str(tmp_path / "x.png"), decode=True).problem


def test_prepare_drops_every_unusable_screenshot_and_keeps_loadable_rows(tmp_path):
    """Through the CLI: each bad file drops its trajectory under ``screenshots``; the parquet loads in verl."""
    from omegaconf import OmegaConf
    from transformers import Qwen2VLImageProcessorPil
    from verl.utils.dataset.rl_dataset import RLHFDataset

    data = tmp_path / "data"
    lines = []
    for name, (content, _) in sorted(BAD_FILES.items()):
        (data / "imgs").mkdir(parents=True, exist_ok=True)
        (data / "imgs" / name).write_bytes(content)
        rec = record(str(data), tid=f"bad-{name}")
        rec["steps"][1]["screenshot"] = f"imgs/{name}"
        lines.append(rec)
    (data / "imgs" / "dir.png").mkdir()
    rec = record(str(data), tid="bad-dir")
    rec["steps"][0]["screenshot"] = "imgs/dir.png"
    lines.append(rec)
    lines += [record(str(data), tid=f"good-{k}") for k in range(2)]
    src = write_lines(str(data / "t.jsonl"), lines)
    out = tmp_path / "out"
    assert prepare_main(["--input", src, "--out", str(out), "--val-fraction", "0", "--no-progress"]) == 0
    dropped = {d["id"]: d for d in read_jsonl_dicts(str(out / "dropped.jsonl"))}
    assert set(dropped) == {f"bad-{n}" for n in BAD_FILES} | {"bad-dir"}
    for name, (_, problem) in BAD_FILES.items():
        d = dropped[f"bad-{name}"]
        assert (d["rule"], d["kind"]) == ("screenshots", "unusable") and problem in d["detail"] and name in d["detail"]
    import json

    report = json.load(open(out / "report.json"))
    assert report["images"] | {"bytes": 0} == {"files": 26, "usable": 15, "bytes": 0, "sizes": {"100x50": 15}}
    processor = Qwen2VLImageProcessorPil(min_pixels=28 * 28, max_pixels=28 * 28 * 16)
    cfg = OmegaConf.create({"filter_overlong_prompts": False, "cache_dir": str(tmp_path / "c"), "prompt_key": "prompt",
                            "image_key": "images"})  # fmt: skip
    ds = RLHFDataset(str(out / "rl" / "train.parquet"), tokenizer=None, config=cfg, processor=processor)
    assert len(ds) == 4 and all(ds[i]["raw_prompt"][1]["content"][-1]["image"].size == (100, 50) for i in range(4))


# --------------------------------------------------------------------------- duplicates by content


def _steps(tmp, shots, actions):
    return tuple(Step(i, str(tmp / s), a) for i, (s, a) in enumerate(zip(shots, actions)))


def test_structure_finds_a_repeated_frame_under_another_name(tmp_path):
    png(str(tmp_path / "f0.png"), color=(1, 1, 1))
    png(str(tmp_path / "f1.png"), color=(2, 2, 2))
    (tmp_path / "f0-copy.png").write_bytes((tmp_path / "f0.png").read_bytes())
    # same pixels, other bytes (a text chunk): not the same file content, so not a duplicate
    from PIL import Image, PngImagePlugin

    meta = PngImagePlugin.PngInfo()
    meta.add_text("k", "v")
    Image.open(tmp_path / "f0.png").save(tmp_path / "f0-meta.png", pnginfo=meta)
    click = {"action": "left_click", "coordinate": [1, 1]}
    other = {"action": "left_click", "coordinate": [2, 2]}
    idx = ImageIndex()

    def check(shots, actions):
        return check_structure(Trajectory("t", "desktop", "q", _steps(tmp_path, shots, actions), coords="grid"), idx)

    assert check(["f0.png", "f0-copy.png"], [click, click]).kind == "duplicate_step"
    assert check(["f0.png", "f0-copy.png"], [click, other]) is None  # same screen, another action
    assert check(["f0.png", "f0-meta.png"], [click, click]) is None
    assert check(["f0.png", "f1.png", "f0-copy.png"], [click, click, click]) is None  # not consecutive
    assert check(["f1.png", "f0.png", "f0-copy.png"], [other, click, click]).detail == (
        "step 2 repeats step 1 (same screenshot and action)"
    )


def test_clean_drops_content_duplicates_as_structure(tmp_path):
    rec = record(str(tmp_path), tid="dup", actions=[{"action": "left_click", "coordinate": [5, 5]}] * 2 + [
        {"action": "terminate", "status": "success"}])  # fmt: skip
    copy = tmp_path / "imgs" / "copy.png"
    copy.write_bytes(open(rec["steps"][0]["screenshot"], "rb").read())
    rec["steps"][1]["screenshot"] = str(copy)
    start1 = record(str(tmp_path), tid="start1")
    for s in start1["steps"]:
        s["index"] += 1
    kept, drops = clean([trajectory_from_dict(rec), trajectory_from_dict(start1)], CleanConfig())
    assert not kept and [(d.id, d.rule, d.kind) for d in drops] == [
        ("dup", "structure", "duplicate_step"), ("start1", "structure", "bad_start")]  # fmt: skip


def test_reading_for_the_parquet_refuses_what_is_not_a_file(tmp_path):
    from verl_mopd.data.images import read_screenshot

    os.mkfifo(tmp_path / "fifo.png")
    with pytest.raises(ValueError, match="not a regular file"):
        read_screenshot(Step(0, str(tmp_path / "fifo.png"), {"action": "wait"}))  # returns instead of blocking


def test_the_screen_size_lookup_refuses_what_is_not_a_file(tmp_path):
    """Pixel coordinates without a screen_size read the screenshot header; a FIFO (reachable with
    ``--skip-rule screenshots``) is an action error, never a blocked open."""
    from verl_mopd.data.schema import screen_size_of
    from verl_mopd.rewards.actions import ActionError

    os.mkfifo(tmp_path / "fifo.png")
    t = trajectory_from_dict(record(str(tmp_path), screen_size=None))
    with pytest.raises(ActionError, match="not a regular file"):
        screen_size_of(t, Step(0, str(tmp_path / "fifo.png"), {"action": "wait"}))
    ok = png(str(tmp_path / "ok.png"), (12, 7))
    assert screen_size_of(t, Step(0, ok, {"action": "wait"})) == (12, 7)
