import pytest


@pytest.fixture(scope="package")
def ray_tq():
    """A local Ray cluster with the real TransferQueue (controller + one storage unit) on it.

    Ray CPUs are logical: TransferQueue's two actors take two, the teacher ranks one each.
    """
    import ray
    import transfer_queue as tq
    from omegaconf import OmegaConf
    from verl.utils import transferqueue_utils

    ray.init(num_cpus=8, include_dashboard=False, log_to_driver=False)
    tq.init(OmegaConf.create({"backend": {"SimpleStorage": {"num_data_storage_units": 1}}}))
    yield tq
    tq.close()
    transferqueue_utils.TQ_INITIALIZED = False
    ray.shutdown()
