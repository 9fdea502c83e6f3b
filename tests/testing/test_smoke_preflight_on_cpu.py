"""`verl-mopd smoke` on an install that lacks the smoke's stack: one error naming the tour's one install."""

import importlib
import importlib.util

import pytest

from verl_mopd.errors import UsageError
from verl_mopd.gpu_stack import NO_DEPS
from verl_mopd.testing import smoke

INSTALL = f"pip install -e '.[tour]' && pip install --no-deps megatron-bridge=={NO_DEPS['megatron-bridge']}"


def test_the_smokes_missing_dependency_errors_name_the_tour_install(monkeypatch):
    profile = smoke.PROFILES[smoke.profile_name("cpu", "megatron")]
    real_import, real_find = importlib.import_module, importlib.util.find_spec

    def no_torchvision(name, *args):
        if name == "torchvision":
            raise ImportError("No module named 'torchvision'")
        return real_import(name, *args)

    monkeypatch.setattr(importlib, "import_module", no_torchvision)
    with pytest.raises(UsageError) as err:
        smoke.preflight("cpu", profile)
    assert "torchvision" in str(err.value) and INSTALL in str(err.value) and ".[test]" not in str(err.value)

    monkeypatch.setattr(importlib, "import_module", real_import)
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name.startswith("megatron") else real_find(name, *a))
    with pytest.raises(UsageError) as err:
        smoke.preflight("cpu", profile)
    assert "megatron-core, megatron-bridge" in str(err.value) and INSTALL in str(err.value)
