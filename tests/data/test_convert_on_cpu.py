"""Parquet conversion: verl's RLHFDataset reads it, the ground truth scores +1.0, the split is by trajectory."""

from __future__ import annotations

import io
import json
import os
import re

import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from PIL import Image

from verl_mopd.data.clean import clean
from commands import prepare as prepare_main
from verl_mopd.data.convert import ConvertConfig, convert, split_by_trajectory
from verl_mopd.data.fixtures import make_fixture
from verl_mopd.data.schema import Step, Trajectory, read_jsonl
from verl_mopd.rewards import compute_score, system_prompt


@pytest.fixture(scope="module")
def prepared(tmp_path_factory):
    root = str(tmp_path_factory.mktemp("prep"))
    src = make_fixture(os.path.join(root, "fx"), per_platform=4)
    out = os.path.join(root, "out")
    assert prepare_main(["--input", src, "--out", out, "--val-fraction", "0.25", "--no-progress"]) == 0
    return src, out


def _rows(path):
    import datasets

    return datasets.load_dataset("parquet", data_files=path)["train"]


def test_rl_rows_load_in_verl_rlhf_dataset(prepared, tmp_path):
    from omegaconf import OmegaConf
    from transformers import Qwen2VLImageProcessorPil
    from verl.utils.dataset.rl_dataset import RLHFDataset

    _, out = prepared
    processor = Qwen2VLImageProcessorPil(min_pixels=28 * 28, max_pixels=28 * 28 * 16)
    cfg = OmegaConf.create({"filter_overlong_prompts": False, "cache_dir": str(tmp_path), "prompt_key": "prompt", "image_key": "images"})
    ds = RLHFDataset(os.path.join(out, "rl", "train.parquet"), tokenizer=None, config=cfg, processor=processor)
    assert len(ds) > 0
    for i in range(len(ds)):
        row = ds[i]
        platform = row["platform"]
        assert row["extra_info"]["platform"] == platform and row["data_source"] == f"fixture_{platform}"
        system, user = row["raw_prompt"]
        assert system == {"role": "system", "content": [{"type": "text", "text": system_prompt(platform)}]}
        kinds = [c["type"] for c in user["content"]]
        assert kinds.count("image") == 1 and kinds[-1] == "image"
        image = user["content"][-1]["image"]
        assert isinstance(image, Image.Image) and image.size in ((96, 54), (45, 96))
        text = user["content"][0]["text"]
        assert text.startswith("Instruction: ") and "Previous actions:" in text
        step_no = len(re.findall(r"^Step \d+:", text, re.M))
        assert step_no == row["extra_info"]["index"]  # history = every earlier step, none later
        pix = processor(images=[image.convert("RGB")], return_tensors="pt")  # what the rollout feeds the model
        assert pix["image_grid_thw"].shape == (1, 3)
        gt = json.loads(row["reward_model"]["ground_truth"])
        assert row["reward_model"]["style"] == "rule" and gt["platform"] == platform


def test_ground_truth_scores_plus_one_against_its_own_rendered_action(prepared):
    _, out = prepared
    rl = _rows(os.path.join(out, "rl", "train.parquet"))
    sft = {p: _rows(os.path.join(out, "sft", p, "train.parquet")) for p in ("desktop", "mobile")}
    by_step = {r["extra_info"]["step_id"]: r for p in sft for r in sft[p]}
    n_box = 0
    for row in rl:
        answer = by_step[row["extra_info"]["step_id"]]["messages"][-1]["content"]  # the SFT target
        assert answer.startswith("<think>\n") and "\n</think>\n\n<tool_call>\n" in answer
        for mode in ("strict", "ui_mopd"):
            r = compute_score(row["data_source"], answer, row["reward_model"]["ground_truth"], row["extra_info"], mode=mode)
            assert r["score"] == 1.0 and r["acc"] == 1.0, (mode, row["extra_info"]["step_id"], r)
        n_box += json.loads(row["reward_model"]["ground_truth"]).get("bbox") is not None
    assert n_box > 0  # boxes kept for grounding


def test_sft_files_are_what_verl_multiturn_sft_reads(prepared):
    from verl.utils.py_functional import convert_nested_value_to_list_recursive

    _, out = prepared
    for platform in ("desktop", "mobile"):
        df = pd.read_parquet(os.path.join(out, "sft", platform, "train.parquet"), dtype_backend="pyarrow")  # as verl does
        assert set(df["platform"]) == {platform}
        for _, row in df.iterrows():
            messages = convert_nested_value_to_list_recursive(row["messages"])
            assert [m["role"] for m in messages] == ["system", "user", "assistant"]
            images = row.to_dict()["images"]
            assert sum(m["content"].count("<image>") for m in messages) == len(images) == 1
            assert Image.open(io.BytesIO(images[0]["bytes"])).size[0] > 0


def test_split_is_by_trajectory_and_report_balances(prepared):
    src, out = prepared
    report = json.load(open(os.path.join(out, "report.json")))
    assert report["balanced"] and report["total"]["kept"]["trajectories"] == 8
    seen = {}
    for part in ("train", "val"):
        for r in _rows(os.path.join(out, "rl", f"{part}.parquet")):
            seen.setdefault(r["extra_info"]["id"], set()).add(part)
    assert all(len(parts) == 1 for parts in seen.values())
    assert {p for parts in seen.values() for p in parts} == {"train", "val"}
    assert report["outputs"]["split_trajectories"] == {"desktop": {"train": 3, "val": 1}, "mobile": {"train": 3, "val": 1}}
    assert sum(1 for _ in open(os.path.join(out, "dropped.jsonl"))) == 6


def test_rerun_is_skipped_and_overwrite_redoes(prepared, capsys):
    src, out = prepared
    args = ["--input", src, "--out", out, "--val-fraction", "0.25", "--no-progress"]
    mtime = os.path.getmtime(os.path.join(out, "rl", "train.parquet"))
    assert prepare_main(args) == 0
    assert "up to date" in capsys.readouterr().out
    assert os.path.getmtime(os.path.join(out, "rl", "train.parquet")) == mtime
    assert prepare_main([*args, "--overwrite"]) == 0
    assert "dropped: subtasks" in capsys.readouterr().out


@settings(max_examples=50, deadline=None)
@given(st.sets(st.text("abcdef", min_size=1, max_size=4), min_size=0, max_size=30), st.integers(0, 3), st.floats(0, 0.9))
def test_split_property(ids, seed, frac):
    trajs = [Trajectory(i, "desktop" if len(i) % 2 else "mobile", "q", ()) for i in sorted(ids)]
    split = split_by_trajectory(trajs, frac, seed)
    assert set(split) == set(ids)
    assert split_by_trajectory(list(reversed(trajs)), frac, seed) == split  # order-independent
    for p in ("desktop", "mobile"):
        mine = [t.id for t in trajs if t.platform == p]
        n_val = sum(split[i] == "val" for i in mine)
        if len(mine) >= 2 and frac > 0:
            assert 1 <= n_val <= len(mine) - 1
        if frac == 0:
            assert n_val == 0


def test_path_image_mode(tmp_path):
    src = make_fixture(str(tmp_path / "fx"), per_platform=2)
    kept, _ = clean(list(read_jsonl(src)))
    result = convert(kept, str(tmp_path / "out"), ConvertConfig(val_fraction=0, image_mode="path", max_pixels=4096))
    assert set(result["files"]) == {"rl/train.parquet", "sft/desktop/train.parquet", "sft/mobile/train.parquet"}
    row = _rows(str(tmp_path / "out" / "rl" / "train.parquet"))[0]
    assert os.path.isabs(row["images"][0]["image"]) and os.path.isfile(row["images"][0]["image"])
    assert row["images"][0]["max_pixels"] == 4096


def test_conversion_streams_with_memory_bounded_by_the_row_group(tmp_path, monkeypatch):
    """Images total ~30 MB; with 1 MB row groups, Python's peak stays a few MB and every byte lands in order."""
    import tracemalloc

    import numpy as np
    import pyarrow.parquet as pq

    from verl_mopd.data.convert import ParquetSink
    from verl_mopd.data.images import ImageIndex

    rng = np.random.default_rng(0)
    trajs = []
    for k in range(25):
        steps = []
        for i in range(10):
            path = tmp_path / f"{k}_{i}.png"
            Image.fromarray(rng.integers(0, 256, (200, 200, 3), dtype=np.uint8)).save(path, compress_level=1)
            action = {"action": "left_click", "coordinate": [5, 5]} if i < 9 else {"action": "terminate", "status": "success"}
            steps.append(Step(i, str(path), action))
        trajs.append(Trajectory(f"t{k}", "desktop", "q", tuple(steps), screen_size=(200, 200)))
    total = sum(os.path.getsize(s.screenshot) for t in trajs for s in t.steps)
    assert total > 25 << 20
    index = ImageIndex()
    index.scan((s.screenshot for t in trajs for s in t.steps), workers=2)
    monkeypatch.setattr(ParquetSink.__init__, "__defaults__", (1 << 20, 2048))
    tracemalloc.start()
    try:
        result = convert(trajs, str(tmp_path / "out"), ConvertConfig(val_fraction=0, workers=2), images=index)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 8 << 20, peak  # holding every image (the old layout) would take > 25 MB here
    assert result["files"] == {"rl/train.parquet": 250, "sft/desktop/train.parquet": 250}
    f = pq.ParquetFile(tmp_path / "out" / "rl" / "train.parquet")
    assert f.metadata.num_row_groups >= 25
    rows = f.read(columns=["images", "extra_info"]).to_pylist()
    expect = [s for t in trajs for s in t.steps]
    assert [r["images"][0]["bytes"] for r in rows] == [open(s.screenshot, "rb").read() for s in expect]
    assert [r["extra_info"]["step_id"] for r in rows] == [f"{t.id}:{s.index}" for t in trajs for s in t.steps]
    # a screenshot that changes after it was checked is refused, not written
    Image.new("RGB", (200, 200)).save(expect[3].screenshot)
    with pytest.raises(ValueError, match="changed since it was checked"):
        convert(trajs, str(tmp_path / "out2"), ConvertConfig(val_fraction=0), images=index)
    assert not [p for p in (tmp_path / "out2").rglob("*") if p.is_file()]
