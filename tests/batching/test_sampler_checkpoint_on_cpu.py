"""The quota sampler's ``batching_state.json``: written atomically, a bad file refused by name."""

import json
import os

import pytest

from verl_mopd.batching.sampler import STATE_FILE, QuotaReplayBufferAsync

from .memory_tq import Domain
from .test_sampler_on_cpu import SHARES, build, kwargs, make_world


@pytest.fixture
def sampler(monkeypatch):
    world = make_world(monkeypatch, [Domain("mobile", 1, 1.0), Domain("desktop", 2, 1.0)], seed=5)
    rb = build(QuotaReplayBufferAsync, world, kwargs(quota={"shares": SHARES, "max_wait_groups": 64}), mode="separate_async")
    world.submit(8)
    for step in (1, 2):
        world.global_steps = step
        batch, _ = rb.sample(step, "train", 2)
        world.tq.kv_clear(keys=batch.keys, partition_id="train")
        world.submit(2)
    return rb


def test_a_failed_save_keeps_the_previous_file_whole(sampler, tmp_path, monkeypatch):
    folder = tmp_path / "global_step_2"
    path = sampler.save_checkpoint(str(folder))
    good = open(path).read()
    assert json.loads(good)["scheduler"]["batches_total"] == 2
    state = sampler.state_dict()
    monkeypatch.setattr(sampler, "state_dict", lambda: {**state, "scheduler": {**state["scheduler"], "x": float("nan")}})
    with pytest.raises(ValueError):
        sampler.save_checkpoint(str(folder))
    monkeypatch.setattr(sampler, "state_dict", lambda: {**state, "oops": object()})
    with pytest.raises(TypeError):
        sampler.save_checkpoint(str(folder))
    assert open(path).read() == good and os.listdir(folder) == [STATE_FILE]  # no temporary left behind


def _edit(**changes):
    """A state file with ``section.name`` set (``None``: removed) in the scheduler block."""

    def make(text):
        state = json.loads(text)
        for key, value in changes.items():
            section, _, name = key.partition("__")
            node = state["scheduler"] if not name else state["scheduler"][section]
            name = name or section
            if value is None:
                del node[name]
            else:
                node[name] = value
        return json.dumps(state)

    return make


@pytest.mark.parametrize(
    "make, field",
    [
        (lambda text: text[: len(text) // 2], "Expecting|Unterminated"),  # torn mid-write
        (lambda text: "", "Expecting value"),
        (lambda text: "\ufeff{oops", "Expecting|Unexpected"),
        (lambda text: "{}", "'scheduler' object"),
        (lambda text: "[1, 2]", "'scheduler' object"),
        (lambda text: '{"scheduler": null}', "'scheduler' object"),
        (_edit(granted_total__mobile="two"), r"granted_total\['mobile'\]='two'"),
        (_edit(granted_total__mobile=float("nan")), r"granted_total\['mobile'\]=nan"),
        (_edit(accepted_total__desktop=None), "expected a count for each domain"),
        (_edit(batches_total=-1), "batches_total=-1"),
        (_edit(batches_total=None), r"lacks \['batches_total'\]"),
    ],
)
def test_a_corrupt_state_file_is_refused_naming_the_file_and_the_field(sampler, monkeypatch, tmp_path, make, field):
    folder = tmp_path / "global_step_2"
    path = sampler.save_checkpoint(str(folder))
    with open(path, encoding="utf-8") as f:
        text = make(f.read())
    with open(path, "w", encoding="utf-8") as f:
        f.write(text)
    world = make_world(monkeypatch, [Domain("mobile", 1, 1.0), Domain("desktop", 2, 1.0)])
    fresh = build(QuotaReplayBufferAsync, world, kwargs(quota={"shares": SHARES}), mode="separate_async")
    before = fresh.state_dict()
    with pytest.raises(ValueError, match=field) as e:
        fresh.load_checkpoint(str(folder))
    assert str(e.value).startswith(f"{path}: cannot resume the quota sampler")
    assert fresh.state_dict() == before
