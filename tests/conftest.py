import os

import pytest

# Tests are CPU-only by default; keep thread counts small on a 2-core machine.
os.environ.setdefault("OMP_NUM_THREADS", "2")


def pytest_collection_modifyitems(config, items):
    import torch

    if torch.cuda.is_available():
        return
    skip_gpu = pytest.mark.skip(reason="needs a CUDA GPU")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip_gpu)

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent / "helpers"))  # shared test helpers (local_http, commands)
