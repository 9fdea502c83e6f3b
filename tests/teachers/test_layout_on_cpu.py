"""``position_rows``: each sample's position ids from whatever layout TransferQueue and verl hand over."""

import pickle

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from verl.utils.tensordict_utils import maybe_fix_3d_position_ids, nested_tensor_from_tensor_list
from tensordict import TensorDict

from verl_mopd.teachers.layout import position_rows


@settings(max_examples=200, deadline=None)
@given(bs=st.integers(1, 6), channels=st.sampled_from([None, 3, 4]), equal=st.booleans(),
       lengths=st.lists(st.integers(1, 9), min_size=6, max_size=6), verl_fix=st.booleans(), pickled=st.booleans(),
       how=st.sampled_from(["transfer_queue", "verl_ragged_last", "stacked"]))
def test_every_packing_gives_back_the_samples_rows(bs, channels, equal, lengths, verl_fix, pickled, how):
    lengths = [lengths[0]] * bs if equal else lengths[:bs]
    if how == "stacked":
        lengths = [lengths[0]] * bs
    rows = [torch.arange(n * (channels or 1)).reshape(*([channels] if channels else []), n) + 100 * i
            for i, n in enumerate(lengths)]
    if how == "transfer_queue":  # TransferQueue's _pack_field_values
        packed = torch.nested.as_nested_tensor(rows, layout=torch.jagged)
    elif how == "verl_ragged_last":
        packed = nested_tensor_from_tensor_list(rows, ragged_idx=rows[0].dim())
    else:
        packed = torch.stack(rows)
    data = TensorDict({"position_ids": packed}, batch_size=[bs])
    if pickled:
        data = pickle.loads(pickle.dumps(data))
    if verl_fix:  # what verl's engines do to every 3-D nested position_ids
        maybe_fix_3d_position_ids(data)
    got = position_rows(data["position_ids"], lengths)
    assert len(got) == bs and all(torch.equal(g, r) for g, r in zip(got, rows, strict=True))


def test_verls_own_fix_breaks_the_equal_length_packing_which_is_why_position_rows_exists():
    rows = [torch.arange(8).reshape(4, 2), torch.arange(8).reshape(4, 2) + 10]
    data = TensorDict({"position_ids": torch.nested.as_nested_tensor(rows, layout=torch.jagged)}, batch_size=[2])
    maybe_fix_3d_position_ids(data)
    try:
        verl_reads = [tuple(r.shape) for r in data["position_ids"].unbind(0)]
    except RuntimeError:  # torch 2.14 refuses the unbind; the slicing of the values gives (8, 2) garbage
        verl_reads = None
    assert verl_reads != [(4, 2), (4, 2)]  # if verl fixes this, position_rows may give way to its reading
    assert [tuple(r.shape) for r in position_rows(data["position_ids"], [2, 2])] == [(4, 2), (4, 2)]


def test_rows_that_do_not_match_the_sequence_lengths_are_an_error_naming_the_shapes():
    packed = torch.nested.as_nested_tensor([torch.zeros(4, 5), torch.zeros(4, 6)], layout=torch.jagged)
    with pytest.raises(ValueError, match=r"sequence lengths \[5, 7\]"):
        position_rows(packed, [5, 7])
