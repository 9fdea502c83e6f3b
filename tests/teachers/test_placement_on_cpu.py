"""S3-1 / S3-2: which colocated teachers run together, and where their weights wait between steps.

The plan (``verl_mopd.teachers.placement.plan_teachers``) against hand arithmetic; ``validate-recipe``
prints it and refuses a weight choice that cannot fit; ``HostWeights`` moves a real model's tensors
and every copy it makes is counted by a ``TorchDispatchMode`` that sees the aten copy ops, not by the
class's own counters alone.
"""

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from verl_mopd.errors import ConfigError
from verl_mopd.teachers.config import TeacherConfig
from verl_mopd.teachers.placement import GPU_BYTES, RESERVE_BYTES, plan_teachers, teacher_weight_bytes
from verl_mopd.teachers.weights import HostWeights

GIB = 2**30


def colocated(platform, **kw):
    base = dict(model_path="/ckpt/x", backend="megatron", placement="colocated", n_gpus_per_node=8, nnodes=8,
                tensor_model_parallel_size=8, platform=platform, micro_batch_tokens=16384)
    return TeacherConfig(**{**base, **kw})


def test_two_32b_teachers_at_tp8_go_together_and_stay_resident():
    teachers = {"desktop": colocated("desktop"), "mobile": colocated("mobile")}
    plan = plan_teachers(teachers, {"desktop": 33.5e9, "mobile": 33.5e9}, rollout_fraction=0.6, actor_offloaded=True)
    w = 33.5e9 * 2 / 8
    assert teacher_weight_bytes(teachers["desktop"], 33.5e9) == w
    assert plan.waves == [["desktop", "mobile"]] and plan.together()
    assert plan.weights == {"desktop": "resident", "mobile": "resident"} and not plan.problems
    assert RESERVE_BYTES + 2 * w + 0.6 * GPU_BYTES <= GPU_BYTES  # the rollout phase the plan checked
    assert any("desktop + mobile dispatched together" in line for line in plan.lines)


def test_teachers_that_do_not_fit_together_run_in_turn_and_pinned_when_not_resident():
    teachers = {p: colocated(p, tensor_model_parallel_size=2, n_gpus_per_node=8) for p in ("a", "b", "c")}
    params = {p: 12e9 for p in teachers}  # 12 GB weights per GPU each at TP 2 bf16
    plan = plan_teachers(teachers, params, rollout_fraction=0.6, actor_offloaded=True)
    # resident while the rollout phase fits: 3 GiB + n x 12 GB + 0.6 x 79.6 GiB <= 79.6 GiB -> n = 2
    assert plan.weights == {"a": "resident", "b": "resident", "c": "pinned"}
    # teacher phase: 3 GiB + 24 GB resident + (12 GB + 1 GiB) for c; all three fit in one wave
    assert plan.waves == [["a", "b", "c"]]
    small = plan_teachers(teachers, params, rollout_fraction=0.6, actor_offloaded=True, gpu_bytes=36 * GIB)
    assert small.waves == [["a", "b"], ["c"]] and small.weights == {"a": "resident", "b": "pinned", "c": "pinned"}


def test_unknown_sizes_or_an_unoffloaded_actor_run_in_turn():
    teachers = {"desktop": colocated("desktop"), "mobile": colocated("mobile")}
    for params, offloaded in (({"desktop": None, "mobile": 1e9}, True), ({"desktop": 1e9, "mobile": 1e9}, False)):
        plan = plan_teachers(teachers, params, rollout_fraction=0.6, actor_offloaded=offloaded)
        assert plan.waves == [["desktop"], ["mobile"]] and set(plan.weights.values()) == {"pinned"}
        assert not plan.problems and any("run in turn" in line for line in plan.lines)


def test_a_resident_choice_that_cannot_fit_is_refused_with_the_arithmetic():
    teachers = {"desktop": colocated("desktop", weights="resident"), "mobile": colocated("mobile", weights="resident")}
    plan = plan_teachers(teachers, {"desktop": 33.5e9, "mobile": 33.5e9}, rollout_fraction=0.85, actor_offloaded=True)
    [problem] = plan.problems
    assert "mopd.teachers.desktop/mobile.weights='resident'" in problem and "gpu_memory_utilization to 0.76" in problem
    unknown = plan_teachers(teachers, {"desktop": None, "mobile": None}, rollout_fraction=0.5, actor_offloaded=True)
    assert "params_b" in unknown.problems[0]
    dedicated = plan_teachers({"d": colocated("d", placement="dedicated", weights="pinned")}, {"d": 1e9},
                              rollout_fraction=0.5, actor_offloaded=True)
    assert "a dedicated teacher owns its GPUs" in dedicated.problems[0]


def test_bad_weights_and_params_b_values_name_the_field():
    with pytest.raises(ConfigError, match=r"mopd.teachers.desktop.weights='swap': allowed values are \['auto', "
                                          r"'resident', 'pinned', 'pageable'\]"):
        colocated("desktop", weights="swap")
    with pytest.raises(ConfigError, match=r"mopd.teachers.desktop.params_b=-1"):
        colocated("desktop", params_b=-1)


def test_validate_recipe_prints_the_plan_and_refuses_what_cannot_fit(capsys, monkeypatch):
    from verl_mopd.checks.recipe_cli import validate_recipe_cli

    monkeypatch.setenv("CKPT_DIR", "/mnt/ckpt")
    recipe = "recipes/ui_mopd/stage2_mopd_qwen3vl8b.yaml"
    assert validate_recipe_cli(recipe, []) == 0
    err = capsys.readouterr().err
    assert "PLAN: colocated teachers wave 1: desktop + mobile dispatched together" in err
    assert "PLAN: teacher desktop: colocated, weights resident" in err
    assert validate_recipe_cli(recipe, ["mopd.teachers.desktop.weights=resident",
                                        "actor_rollout_ref.rollout.gpu_memory_utilization=0.9"]) == 1
    err = capsys.readouterr().err
    assert "ERROR: mopd.teachers.desktop.weights='resident'" in err and "> 79.6 GiB during rollout" in err


class CopyCounter(TorchDispatchMode):
    """Every aten op that copies tensor data: ``_to_copy`` (a new tensor) and ``copy_`` (into an existing one)."""

    def __init__(self):
        super().__init__()
        self.new, self.into = 0, []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func is torch.ops.aten._to_copy.default:
            self.new += 1
        elif func is torch.ops.aten.copy_.default:
            self.into.append(args[0].data_ptr())
        return func(*args, **(kwargs or {}))


def _model():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.GELU(), torch.nn.Linear(16, 4))


@pytest.mark.parametrize("policy", ["resident", "pinned", "pageable"])
def test_weight_copies_per_step_by_policy(policy):
    model = _model()
    x = torch.randn(3, 8)
    expected = model(x)
    tensors = list(model.parameters())
    weights = HostWeights(tensors, "cpu", policy, pin=False)
    weights.offload()  # after init_model
    buffers = [b.data_ptr() for b in weights.buffers if b is not None]
    for _ in range(3):  # three steps: load, forward, offload
        with CopyCounter() as seen:
            weights.load()
            out = model(x)
            weights.offload()
        assert torch.equal(out, expected)
        n = len(tensors)
        if policy == "resident":
            assert (seen.new, seen.into) == (0, [])
        elif policy == "pinned":
            # loads copy out of the reused buffers; offloads copy into the same buffers: no new host tensor
            assert seen.new == n and sorted(seen.into) == sorted(buffers)
            assert [b.data_ptr() for b in weights.buffers] == buffers
            assert all(t.data_ptr() in buffers for t in tensors)  # between steps, the weights live in them
        else:  # verl's forward-only way: a fresh host tensor per offload, a copy each way
            assert seen.new == 2 * n and seen.into == []
    counts = weights.counts
    if policy == "pinned":
        assert counts["pageable_copies"] == 0 and counts["host_allocations"] == len(tensors)
        assert counts["pinned_copies"] == len(tensors) * 7  # the first offload + 3 x (load, offload)
    elif policy == "pageable":
        assert counts["pageable_copies"] == len(tensors) * 7 and counts["pinned_copies"] == 0
    else:
        assert counts == {"pageable_copies": 0, "pinned_copies": 0, "host_allocations": 0, "bytes": 0}


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_pinned_buffers_are_page_locked_on_a_gpu():
    model = _model().cuda()
    weights = HostWeights(list(model.parameters()), "cuda", "pinned")
    weights.offload()
    assert all(b.is_pinned() for b in weights.buffers)
    assert all(p.device.type == "cpu" and p.is_pinned() for p in model.parameters())
    weights.load()
    assert all(p.device.type == "cuda" for p in model.parameters())
