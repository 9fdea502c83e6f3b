"""``verl-mopd smoke --device cuda`` fits one GPU of a 16-core machine (issue 41, part 4).

The GPU profile (``+smoke=stage2_gpu`` on the stage-2 recipe) is placed the way verl places it, on a Ray
cluster of 1 GPU and 16 CPUs (fake resources, so this runs on CPU): verl's ``_init_resource_pool_mgr``
and ``ResourcePoolManager.create_resource_pool`` build the global pool, its placement groups are
created; the teachers go where ``PlatformTeacherGroup.build`` puts them (colocated: the actor's pool;
dedicated: ``dedicated_resource_pool``); TransferQueue's controller and storage units hold the CPUs
their Ray actor classes declare. No trainer runs. The profile before issue 41 (a dedicated desktop
teacher, verl's 8 storage units) waits forever for a second GPU and asks for more than 16 CPUs.
"""

import pathlib
import threading
from types import SimpleNamespace

import pytest
import ray
from hydra import compose, initialize_config_dir
from ray.util.placement_group import placement_group, remove_placement_group

RECIPES = pathlib.Path(__file__).parents[2] / "recipes" / "ui_mopd"
GPUS, CPUS = 1, 16
#: the profile as it was before issue 41 (recipes/ui_mopd/smoke/stage2_gpu.yaml at 0e2d039)
OLD_LAYOUT = ["mopd.teachers.desktop.placement=dedicated", "transfer_queue.backend.SimpleStorage.num_data_storage_units=8"]


def _compose(overrides=()):
    with initialize_config_dir(config_dir=str(RECIPES), version_base=None):
        return compose(config_name="stage2_mopd_qwen3vl8b", overrides=["+smoke=stage2_gpu", *overrides])


def _verl_pools(cfg):
    """verl's own pool creation: ``PPOTrainer._init_resource_pool_mgr`` on the composed config."""
    from verl.trainer.ppo.v1.trainer_base import PPOTrainer

    trainer = SimpleNamespace(config=cfg)
    PPOTrainer._init_resource_pool_mgr(trainer)
    return trainer


def _tq_cpus(cfg) -> list[float]:
    """The CPUs TransferQueue's Ray actors hold: the controller and one per storage unit (their classes' options)."""
    from transfer_queue.controller import TransferQueueController
    from transfer_queue.storage.simple_storage import SimpleStorageUnit

    units = int(cfg.transfer_queue.backend.SimpleStorage.num_data_storage_units)
    return [TransferQueueController._default_options["num_cpus"]] + [SimpleStorageUnit._default_options["num_cpus"]] * units


def _teacher_pools(cfg, actor_pool):
    """Where ``PlatformTeacherGroup.build`` puts each teacher: the actor's pool, or a dedicated one."""
    from verl_mopd.teachers.group import dedicated_resource_pool
    from verl_mopd.trainer.hooks import mopd_config_from

    teachers = mopd_config_from(cfg).teachers
    return {p: actor_pool if t.placement == "colocated" else dedicated_resource_pool(t, use_gpu=True, name=f"t_{p}")
            for p, t in teachers.items()}


def _placed(pool, seconds: float) -> bool:
    """verl's ``get_placement_groups`` (it waits on the placement without a timeout) within ``seconds``."""
    done = []
    thread = threading.Thread(target=lambda: done.append(pool.get_placement_groups(device_name="cuda")), daemon=True)
    thread.start()
    thread.join(seconds)
    return bool(done)


@pytest.fixture(scope="module")
def cluster():
    if ray.is_initialized():  # an earlier test's Ray (its resources are not the 1-GPU/16-CPU node measured here)
        ray.shutdown()
    ray.init(num_cpus=CPUS, num_gpus=GPUS, include_dashboard=False, log_to_driver=False, namespace="placement_test")
    yield
    ray.shutdown()


def test_the_gpu_smoke_fits_one_gpu_and_16_cpus(cluster):
    from verl_mopd.checks.cluster_checks import _check_colocated_slots

    cfg = _compose()
    trainer = _verl_pools(cfg)
    manager = trainer.resource_pool_manager
    assert manager.resource_pool_spec == {"global_pool": [1]}  # no teacher pool of verl's, no reward pool
    manager.create_resource_pool()
    actor_pool = manager.resource_pool_dict["global_pool"]
    assert _placed(actor_pool, 60)
    pools = _teacher_pools(cfg, actor_pool)
    assert all(pool is actor_pool for pool in pools.values()), pools  # both teachers colocated
    problems = []
    _check_colocated_slots(cfg, problems)  # actor/rollout + 2 teachers <= verl's 3 processes per GPU
    assert not problems, problems
    tq = [placement_group([{"CPU": c}]) for c in _tq_cpus(cfg)]
    try:
        assert len(tq) == 2  # the controller and one storage unit
        assert all(pg.wait(30) for pg in tq)
        left = ray.available_resources()
        assert left.get("GPU", 0) == 0 and left.get("CPU", 0) >= 1, left  # verl's own actors schedule with 1 CPU
        used = CPUS - left["CPU"]
        assert used == actor_pool.max_colocate_count + sum(_tq_cpus(cfg)) == 5
    finally:
        for pg in tq:
            remove_placement_group(pg)
        for pg in actor_pool.pgs or []:
            remove_placement_group(pg)


def test_the_old_dedicated_teacher_layout_does_not_fit(cluster):
    cfg = _compose(OLD_LAYOUT)
    trainer = _verl_pools(cfg)
    manager = trainer.resource_pool_manager
    manager.create_resource_pool()
    actor_pool = manager.resource_pool_dict["global_pool"]
    assert _placed(actor_pool, 60)
    pools = _teacher_pools(cfg, actor_pool)
    dedicated = pools["desktop"]
    assert dedicated is not actor_pool and pools["mobile"] is actor_pool
    try:
        # verl would wait on this forever: the only GPU is the actor's
        assert not _placed(dedicated, 5)
        # and its CPU bundles: 3 (actor) + 10 (the dedicated teacher's bundle) + 9 (TransferQueue) > 16
        demand = actor_pool.max_colocate_count + dedicated.max_colocate_count + sum(_tq_cpus(cfg))
        assert demand == 22 > CPUS
    finally:
        for pg in actor_pool.pgs or []:  # the dedicated pool's stays pending until ray.shutdown
            remove_placement_group(pg)
