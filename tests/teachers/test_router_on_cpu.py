"""Router: split/merge round trip, unknown keys, DataProto/TensorDict row taking (padded, jagged, multimodal)."""

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from tensordict import TensorDict
from verl.protocol import DataProto
from verl.utils import tensordict_utils as tu

from verl_mopd.teachers.router import UnknownRouteError, merge, routing_keys, split, take_rows

KEYS = st.lists(st.sampled_from(["desktop", "mobile", "web", "tv", "watch"]), min_size=0, max_size=40)


@settings(max_examples=200, deadline=None)
@given(keys=KEYS, width=st.integers(1, 5))
def test_merge_of_split_is_identity(keys, width):
    n = len(keys)
    x = torch.randn(n, width, dtype=torch.float64)
    index = split(keys)
    # partition of range(n), ascending, each row under its own key
    all_rows = np.sort(np.concatenate(list(index.values()))) if index else np.array([], dtype=np.int64)
    assert np.array_equal(all_rows, np.arange(n))
    for k, rows in index.items():
        assert np.all(np.diff(rows) > 0)
        assert all(keys[r] == k for r in rows)
    assert set(index) == set(keys)  # absent keys are skipped, never empty parts
    if n:
        out = merge({k: x[torch.as_tensor(v)] for k, v in index.items()}, index, n)
        assert torch.equal(out, x)


@settings(max_examples=100, deadline=None)
@given(keys=KEYS.filter(len))
def test_merge_of_split_is_identity_for_jagged_rows(keys):
    lengths = np.random.default_rng(len(keys)).integers(1, 6, size=len(keys))
    rows = [torch.arange(int(length), dtype=torch.float32) + i for i, length in enumerate(lengths)]
    index = split(keys)
    parts = {k: torch.nested.as_nested_tensor([rows[i] for i in v], layout=torch.jagged) for k, v in index.items()}
    out = merge(parts, index, len(keys))
    assert out.is_nested
    for got, want in zip(out.unbind(0), rows, strict=True):
        assert torch.equal(got, want)


def test_unknown_key_names_key_and_teachers():
    with pytest.raises(UnknownRouteError, match=r"\['tablet'\].*configured teachers: \['desktop', 'mobile'\]"):
        split(["desktop", "tablet", "mobile"], known=["desktop", "mobile"])


def test_known_key_without_rows_is_skipped():
    assert list(split(["mobile", "mobile"], known=["desktop", "mobile"])) == ["mobile"]


def test_merge_rejects_uncovered_and_double_claimed_rows():
    x = torch.zeros(2, 3)
    with pytest.raises(ValueError, match="covered by no part"):
        merge({"a": x}, {"a": np.array([0, 1])}, 3)
    with pytest.raises(ValueError, match="claimed twice"):
        merge({"a": x, "b": x}, {"a": np.array([0, 1]), "b": np.array([1, 2])}, 3)
    filled = merge({"a": x}, {"a": np.array([0, 2])}, 3, fill=-1.0)
    assert filled[1].eq(-1).all() and filled[0].eq(0).all()


def _mixed_dataproto(n=7):
    rng = np.random.default_rng(0)
    plat = np.array(rng.choice(["desktop", "mobile"], size=n), dtype=object)
    mm = np.array([{"pixel_values": torch.full((i + 1, 4), float(i)), "image_grid_thw": torch.tensor([[1, 1, i + 1]])}
                   for i in range(n)], dtype=object)
    return DataProto.from_dict(
        tensors={"input_ids": torch.arange(n * 5).reshape(n, 5), "responses": torch.arange(n * 3).reshape(n, 3)},
        non_tensors={"platform": plat, "multi_modal_inputs": mm, "row": np.arange(n)},
    )


def test_take_rows_dataproto_keeps_multimodal_rows_aligned():
    data = _mixed_dataproto()
    for key, rows in split(routing_keys(data)).items():
        sub = take_rows(data, rows)
        assert list(sub.non_tensor_batch["platform"]) == [key] * len(rows)
        assert torch.equal(sub.batch["input_ids"], data.batch["input_ids"][torch.as_tensor(rows)])
        for r, mm in zip(rows, sub.non_tensor_batch["multi_modal_inputs"], strict=True):
            assert mm["pixel_values"].shape[0] == r + 1 and mm["pixel_values"][0, 0] == r


def test_take_rows_tensordict_jagged_and_non_tensor():
    seqs = [torch.arange(length) for length in (3, 1, 4, 2)]
    td = tu.get_tensordict(
        {"input_ids": torch.nested.as_nested_tensor(seqs, layout=torch.jagged),
         "platform": ["mobile", "desktop", "mobile", "desktop"]}
    )
    assert isinstance(td, TensorDict)
    keys = routing_keys(td)
    index = split(keys)
    assert index["mobile"].tolist() == [0, 2]
    sub = take_rows(td, index["mobile"])
    assert [t.tolist() for t in sub["input_ids"].unbind(0)] == [seqs[0].tolist(), seqs[2].tolist()]
    assert list(routing_keys(sub)) == ["mobile", "mobile"]


def test_missing_routing_column_is_named():
    with pytest.raises(KeyError, match="'platform'"):
        routing_keys(DataProto.from_dict(tensors={"x": torch.zeros(2, 1)}))
