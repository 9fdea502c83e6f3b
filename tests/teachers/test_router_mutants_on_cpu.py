"""Tests that kill mutants found by scripts/mutation.sh in verl_mopd/teachers/router.py
(docs/reliability.md, "Mutation testing"): the error messages name what is wrong, the row-bound
checks, empty index lists, a per-row fill tensor, and jagged parts with a trailing dimension."""

import re

import numpy as np
import pytest
import torch
from verl.protocol import DataProto
from verl.utils import tensordict_utils as tu

from verl_mopd.teachers.router import (
    UnknownRouteError,
    check_known,
    get_field,
    merge,
    routing_keys,
    split,
    take_rows,
)


def test_split_gives_rows_in_order_of_first_occurrence():
    index = split(["b", "a", "b", "c", "a"])
    assert list(index) == ["b", "a", "c"]
    assert {k: v.tolist() for k, v in index.items()} == {"b": [0, 2], "a": [1, 4], "c": [3]}
    assert all(v.dtype == np.int64 for v in index.values())


def test_unknown_keys_name_the_field():
    with pytest.raises(UnknownRouteError) as err:
        check_known(["x"], ["desktop"])
    assert str(err.value).startswith("platform value(s) ['x'] have no teacher; configured teachers: ['desktop'].")
    with pytest.raises(UnknownRouteError, match=r"^domain value\(s\) \['x'\]"):
        check_known(["x"], ["desktop"], field="domain")


def test_split_names_the_routing_field_of_an_unknown_key():
    with pytest.raises(UnknownRouteError, match=r"^platform value\(s\) \['x'\]"):
        split(["x"], known=["desktop"])
    with pytest.raises(UnknownRouteError, match=r"^domain value\(s\) \['x'\] .* mopd.teachers.<domain>"):
        split(["x"], known=["desktop"], field="domain")


def test_two_dimensional_keys_are_refused_with_their_shape():
    with pytest.raises(ValueError, match=re.escape("routing keys must be 1-D (one key per row), got shape (2, 1)")):
        split([["a"], ["b"]])


def test_merge_messages_name_the_keys_rows_and_shapes():
    x = torch.zeros(2, 3)
    with pytest.raises(KeyError, match=re.escape("parts have keys ['a'] but index has ['b']")):
        merge({"a": x}, {"b": np.array([0, 1])}, 2)
    with pytest.raises(ValueError, match=re.escape("merge: part 'a' has 2 rows, index has 3")):
        merge({"a": x}, {"a": np.array([0, 1, 2])}, 3)
    with pytest.raises(ValueError, match=re.escape("merge: 7 of 9 rows are covered by no part (first: [2 3 4 5 6])")):
        merge({"a": x}, {"a": np.array([0, 1])}, 9)
    with pytest.raises(ValueError, match=re.escape("merge: part 'b' has row shape (4,), expected (3,)")):
        merge({"a": x, "b": torch.zeros(1, 4)}, {"a": np.array([0, 1]), "b": np.array([2])}, 3)
    with pytest.raises(ValueError, match="^merge: no rows to merge and no fill tensor to take the shape from$"):
        merge({"a": x[:0]}, {"a": np.array([], dtype=np.int64)}, 2, fill=0.0)


@pytest.mark.parametrize("rows", [[-1, 0], [0, 2]])
def test_a_row_outside_the_result_is_an_index_error(rows):
    with pytest.raises(IndexError, match=re.escape("merge: index 'a' has rows outside [0, 2)")):
        merge({"a": torch.zeros(2, 1)}, {"a": np.array(rows)}, 2)


def test_a_key_with_an_empty_row_list_merges():
    out = merge({"a": torch.ones(2, 1), "b": torch.zeros(0, 1)}, {"a": [1, 0], "b": []}, 2)
    assert out.tolist() == [[1.0], [1.0]]


def test_a_fill_tensor_supplies_the_uncovered_rows_and_must_have_n_rows():
    fill = torch.tensor([[10.0, 11.0], [20.0, 21.0], [30.0, 31.0]])
    out = merge({"a": torch.tensor([[1.0, 2.0]])}, {"a": np.array([1])}, 3, fill=fill)
    assert out.tolist() == [[10.0, 11.0], [1.0, 2.0], [30.0, 31.0]]
    assert fill[1].tolist() == [20.0, 21.0]  # the fill tensor is not written into
    with pytest.raises(ValueError, match=re.escape("merge: fill has 1 rows, expected 3")):
        merge({"a": torch.tensor([[1.0, 2.0]])}, {"a": np.array([1])}, 3, fill=fill[:1])
    # a (n, 1) fill: its row count, not its width, is checked
    out = merge({"a": torch.tensor([[1.0]])}, {"a": np.array([0])}, 3, fill=torch.zeros(3, 1))
    assert out.tolist() == [[1.0], [0.0], [0.0]]


def test_nested_parts_refuse_a_fill():
    part = torch.nested.as_nested_tensor([torch.ones(2)], layout=torch.jagged)
    with pytest.raises(ValueError, match="^merge: `fill` is not supported for nested parts$"):
        merge({"a": part}, {"a": np.array([0])}, 2, fill=0.0)


def test_jagged_parts_with_a_trailing_dimension_keep_their_ragged_dimension():
    rows = [torch.arange(2 * n, dtype=torch.float32).reshape(n, 2) + 10 * i for i, n in enumerate((3, 1, 2))]
    index = {"a": np.array([0, 2]), "b": np.array([1])}
    parts = {k: torch.nested.as_nested_tensor([rows[i] for i in v], layout=torch.jagged) for k, v in index.items()}
    assert parts["a"]._ragged_idx == 1 and parts["a"].dim() == 3
    out = merge(parts, index, 3)
    assert out.is_nested and out._ragged_idx == 1
    for got, want in zip(out.unbind(0), rows, strict=True):
        assert torch.equal(got, want)


def test_routing_keys_are_an_object_array_of_the_column():
    td = tu.get_tensordict({"x": torch.zeros(3, 1), "platform": ["mobile", "desktop", "mobile"]})
    keys = routing_keys(td)
    assert keys.dtype == object and keys.tolist() == ["mobile", "desktop", "mobile"]
    data = DataProto.from_dict(tensors={"x": torch.zeros(2, 1)},
                               non_tensors={"platform": np.array(["desktop", "mobile"], dtype=object)})
    keys = routing_keys(data)
    assert keys.dtype == object and keys.tolist() == ["desktop", "mobile"]
    with pytest.raises(KeyError, match=re.escape("routing field 'domain' not in the batch (has ['platform', 'x'])")):
        routing_keys(td, field="domain")


def test_take_rows_with_a_list_and_an_empty_list():
    td = tu.get_tensordict({"x": torch.arange(4).reshape(4, 1), "platform": ["a", "b", "c", "d"]})
    assert take_rows(td, [2, 0])["x"].flatten().tolist() == [2, 0]
    data = DataProto.from_dict(tensors={"x": torch.arange(4).reshape(4, 1)})
    assert take_rows(data, [3, 1]).batch["x"].flatten().tolist() == [3, 1]
    assert len(take_rows(data, [])) == 0  # an empty list is an empty int64 selection


def test_get_field_reads_tensors_and_non_tensors_of_both_batch_types():
    data = DataProto.from_dict(tensors={"x": torch.arange(2).reshape(2, 1)},
                               non_tensors={"platform": np.array(["a", "b"], dtype=object)})
    assert get_field(data, "x").flatten().tolist() == [0, 1]
    assert get_field(data, "platform").tolist() == ["a", "b"]
    assert get_field(data, "missing") is None
    no_tensors = DataProto.from_dict(non_tensors={"platform": np.array(["a", "b"], dtype=object)})
    assert get_field(no_tensors, "platform").tolist() == ["a", "b"]
    td = tu.get_tensordict({"x": torch.arange(2).reshape(2, 1), "platform": ["a", "b"]})
    assert get_field(td, "x").flatten().tolist() == [0, 1]
    assert get_field(td, "missing") is None
