"""Weight-average and TIES merges of tiny random checkpoints against a float64 reference of the formulas."""

import json

import numpy as np
import pytest
import torch
from transformers import AutoModelForCausalLM, Qwen2Config

from commands import eval_ as eval_main
from verl_mopd.eval.merge import MergeConfig, merge_checkpoints, weight_files


def _save(path, seed, base_state=None, noise=0.02, shard=None):
    torch.manual_seed(seed)
    cfg = Qwen2Config(vocab_size=40, hidden_size=16, intermediate_size=32, num_hidden_layers=2, num_attention_heads=2,
                      num_key_value_heads=1, max_position_embeddings=64, tie_word_embeddings=False)
    model = AutoModelForCausalLM.from_config(cfg)
    if base_state is not None:  # a "fine-tuned" expert: base + its own update
        model.load_state_dict({k: v + noise * torch.randn_like(v) for k, v in base_state.items()})
    model.save_pretrained(path, **({"max_shard_size": shard} if shard else {}))
    return str(path), {k: v.detach().clone() for k, v in model.state_dict().items()}


def _ref_ties(base, experts, weights, density, scale):
    """TIES (Yadav et al. 2023) per tensor in float64: trim top-k |tau|, elect sign of the sum, disjoint mean."""
    b = base.astype(np.float64).ravel()
    taus = [e.astype(np.float64).ravel() - b for e in experts]
    trimmed = []
    for t in taus:
        k = int(density * t.size)
        keep = np.zeros(t.size, bool)
        keep[np.argsort(-np.abs(t), kind="stable")[:k]] = True
        trimmed.append(np.where(keep, t, 0.0))
    trimmed = np.stack(trimmed)
    elected = np.where(trimmed.sum(0) >= 0, 1.0, -1.0)
    agree = np.sign(trimmed) == elected
    weighted = trimmed * np.asarray(weights, np.float64)[:, None]
    merged = (weighted * agree).sum(0) / np.maximum(agree.sum(0), 1)
    return (b + scale * merged).reshape(base.shape)


def _load(path):
    return {k: v.detach() for k, v in AutoModelForCausalLM.from_pretrained(path).state_dict().items()}


@pytest.fixture(scope="module")
def ckpts(tmp_path_factory):
    d = tmp_path_factory.mktemp("ckpt")
    base, base_sd = _save(d / "base", 0)
    desk, desk_sd = _save(d / "desktop", 1, base_sd)
    mob, mob_sd = _save(d / "mobile", 2, base_sd, shard="20KB")  # sharded, with an index
    return {"dir": d, "base": (base, base_sd), "desktop": (desk, desk_sd), "mobile": (mob, mob_sd)}


def test_weight_average_matches_float64_reference(ckpts, tmp_path):
    (a, a_sd), (b, b_sd) = ckpts["desktop"], ckpts["mobile"]
    out = tmp_path / "avg"
    counts = merge_checkpoints(MergeConfig("average", (a, b), weights=(0.3, 0.7)), str(out))
    merged = _load(str(out))
    assert counts["merged"] == len(weight_files(a)) and set(merged) == set(a_sd)
    for k in a_sd:
        ref = 0.3 * a_sd[k].double() + 0.7 * b_sd[k].double()
        torch.testing.assert_close(merged[k].double(), ref, rtol=0, atol=1e-6)
    assert (out / "config.json").exists() and json.loads((out / "merge_config.json").read_text())["weights"] == [0.3, 0.7]


@pytest.mark.parametrize("density,scale,weights", [(0.5, 1.0, (1.0, 1.0)), (0.2, 0.8, (0.7, 1.3)), (1.0, 1.0, (1.0, 1.0))])
def test_ties_matches_float64_reference(ckpts, tmp_path, density, scale, weights):
    (base, base_sd), (a, a_sd), (b, b_sd) = ckpts["base"], ckpts["desktop"], ckpts["mobile"]
    out = tmp_path / "ties"
    eval_main(["merge", "--method", "ties", "--base", base, "--models", a, b, "--density", str(density),
               "--scale", str(scale), "--weights", *map(str, weights), "--compute-dtype", "float64", "--out", str(out)])
    merged = _load(str(out))
    changed = 0
    for k in base_sd:
        ref = _ref_ties(base_sd[k].numpy(), [a_sd[k].numpy(), b_sd[k].numpy()], weights, density, scale)
        np.testing.assert_allclose(merged[k].double().numpy(), ref, rtol=0, atol=1e-6, err_msg=k)
        changed += int(not np.allclose(ref, base_sd[k].numpy()))
    assert changed > 0
    if density < 1:  # trimming really dropped entries: some positions keep the base value exactly
        k = "model.layers.0.mlp.up_proj.weight"
        assert (merged[k] == base_sd[k]).float().mean() > 0.2


def test_merged_checkpoint_loads_and_keeps_the_first_models_files(ckpts, tmp_path):
    (a, _), (b, _) = ckpts["mobile"], ckpts["desktop"]  # the sharded one first: the output is sharded too
    out = tmp_path / "m"
    merge_checkpoints(MergeConfig("average", (a, b)), str(out))
    assert (out / "model.safetensors.index.json").exists()
    assert len({v for v in weight_files(str(out)).values()}) == len({v for v in weight_files(a).values()}) > 1
    model = AutoModelForCausalLM.from_pretrained(str(out))
    assert model(input_ids=torch.tensor([[1, 2, 3]])).logits.shape == (1, 3, 40)


def test_merge_config_errors_name_the_field():
    with pytest.raises(ValueError, match="base: TIES needs"):
        MergeConfig("ties", ("a", "b"))
    with pytest.raises(ValueError, match="summing to 1"):
        MergeConfig("average", ("a", "b"), weights=(0.5, 0.6))
    with pytest.raises(ValueError, match="density=0"):
        MergeConfig("ties", ("a", "b"), base="c", density=0)
    with pytest.raises(ValueError, match="method='slerp'"):
        MergeConfig("slerp", ("a", "b"))
    with pytest.raises(ValueError, match="one per model"):
        MergeConfig("average", ("a", "b"), weights=(1.0,))


def test_mismatched_checkpoints_are_refused(ckpts, tmp_path):
    torch.manual_seed(3)
    cfg = Qwen2Config(vocab_size=40, hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2,
                      num_key_value_heads=1, max_position_embeddings=64, tie_word_embeddings=False)
    AutoModelForCausalLM.from_config(cfg).save_pretrained(tmp_path / "short")
    with pytest.raises(ValueError, match="tensor names differ"):
        merge_checkpoints(MergeConfig("average", (ckpts["desktop"][0], str(tmp_path / "short"))), str(tmp_path / "o"))


# ----------------------------------------------------------------------------- never a partial or lost checkpoint


def _raw_ckpt(path, tensors, shards=2):
    """A sharded safetensors checkpoint written directly: ``tensors`` split over ``shards`` files + index."""
    from safetensors.torch import save_file

    path.mkdir(parents=True)
    names = sorted(tensors)
    weight_map = {}
    for i in range(shards):
        fname = f"model-{i + 1:05d}-of-{shards:05d}.safetensors"
        part = {n: tensors[n] for n in names[i::shards]}
        save_file(part, str(path / fname))
        weight_map.update({n: fname for n in part})
    (path / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    (path / "config.json").write_text('{"model_type": "toy"}')
    return str(path)


def _snapshot(folder):
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir())}


def _toy(scale, **over):
    t = {"a.weight": torch.full((3, 2), scale), "b.weight": torch.arange(4.0) * scale, "c.bias": torch.ones(5) * scale}
    t.update(over)
    return t


def test_out_naming_an_input_is_refused_and_the_input_is_untouched(tmp_path, capsys):
    left, right = _raw_ckpt(tmp_path / "left", _toy(1.0)), _raw_ckpt(tmp_path / "right", _toy(3.0))
    before = _snapshot(tmp_path / "left")
    (tmp_path / "alias").symlink_to(tmp_path / "left")
    for out in (left, str(tmp_path / "alias"), str(tmp_path / "left" / "sub"), str(tmp_path)):
        assert eval_main(["merge", "--method", "average", "--models", left, right, "--out", out]) == 2
        assert "--out=" in capsys.readouterr().err
    assert _snapshot(tmp_path / "left") == before and not (tmp_path / "left" / "sub").exists()


def test_a_shape_mismatch_in_a_later_shard_writes_nothing(tmp_path):
    left = _raw_ckpt(tmp_path / "left", _toy(1.0))
    right = _raw_ckpt(tmp_path / "right", _toy(3.0, **{"c.bias": torch.ones(7)}))  # in the second shard
    with pytest.raises(ValueError, match=r"'c.bias': shape \(7,\)"):
        merge_checkpoints(MergeConfig("average", (left, right)), str(tmp_path / "merged"))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["left", "right"]  # no output, no temporary


@pytest.mark.parametrize("bad", [float("nan"), float("inf")])
def test_non_finite_input_weights_are_an_error_naming_tensor_and_model(tmp_path, capsys, bad):
    left = _raw_ckpt(tmp_path / "left", _toy(1.0))
    right = _raw_ckpt(tmp_path / "right", _toy(3.0, **{"b.weight": torch.tensor([0.0, bad, 2.0, 3.0])}))
    out = tmp_path / "merged"
    assert eval_main(["merge", "--method", "average", "--models", left, right, "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert "tensor 'b.weight'" in err and right in err and "NaN/inf" in err and len(err.strip().splitlines()) == 1
    assert not out.exists()


def test_a_rerun_replaces_an_earlier_merge_but_never_a_foreign_folder(tmp_path):
    left, right = _raw_ckpt(tmp_path / "left", _toy(1.0)), _raw_ckpt(tmp_path / "right", _toy(3.0))
    out = tmp_path / "merged"
    merge_checkpoints(MergeConfig("average", (left, right)), str(out))
    (out / "stale.txt").write_text("from the first run")
    merge_checkpoints(MergeConfig("average", (left, right), weights=(0.75, 0.25)), str(out))
    assert not (out / "stale.txt").exists()
    assert torch.equal(_load_raw(out)["a.weight"], torch.full((3, 2), 1.5))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["left", "merged", "right"]
    foreign = tmp_path / "notes"
    foreign.mkdir()
    (foreign / "keep.txt").write_text("mine")
    with pytest.raises(ValueError, match="not an earlier merge output"):
        merge_checkpoints(MergeConfig("average", (left, right)), str(foreign))
    assert (foreign / "keep.txt").read_text() == "mine"


def _load_raw(folder):
    from safetensors.torch import load_file

    out = {}
    for f in folder.glob("*.safetensors"):
        out.update(load_file(str(f)))
    return out
