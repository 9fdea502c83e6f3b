"""One CPU install for the whole tour: setup.py's ``tour`` extra holds what every tour command needs, the
test extra holds the tour's, and the README names that one install (the smoke's missing-dependency errors name it
too: ``testing/test_smoke_preflight_on_cpu.py``)."""

import pathlib
import subprocess
import sys
from email.parser import Parser

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from verl_mopd.gpu_stack import NO_DEPS

ROOT = pathlib.Path(__file__).parents[1]
#: what the tour's commands import beyond verl-mopd's own requirements: the demo's plot, the smoke's Qwen3-VL
#: stack (torchvision, qwen-vl-utils) and verl's Megatron engine on CPU (Megatron-Bridge comes with --no-deps)
TOUR_NEEDS = {"torch", "torchvision", "qwen-vl-utils", "matplotlib", "megatron-core", "mbridge", "megatron-energon",
              "nvidia-modelopt"}


@pytest.fixture(scope="module")
def extras(tmp_path_factory):
    """{extra: {distribution: Requirement}} from setup.py's own metadata (``egg_info``), as pip sees it."""
    out = tmp_path_factory.mktemp("egg")
    subprocess.run([sys.executable, "setup.py", "-q", "egg_info", "--egg-base", str(out)], cwd=ROOT, check=True,
                   capture_output=True)
    (info,) = out.glob("*.egg-info")
    meta = Parser().parsestr((info / "PKG-INFO").read_text())
    found: dict[str, dict[str, Requirement]] = {}
    for line in meta.get_all("Requires-Dist"):
        req = Requirement(line)
        for extra in meta.get_all("Provides-Extra"):
            if req.marker is not None and req.marker.evaluate({"extra": extra}):
                found.setdefault(extra, {})[canonicalize_name(req.name)] = req
    return found


def test_the_tour_extra_holds_what_every_tour_command_needs(extras):
    assert TOUR_NEEDS <= set(extras["tour"]), sorted(TOUR_NEEDS - set(extras["tour"]))
    # torch and torchvision as a matching pair (no torchvision on PyPI loads beside another torch)
    assert str(extras["tour"]["torch"].specifier).startswith("==")
    assert str(extras["tour"]["torchvision"].specifier).startswith("==")
    assert "megatron-bridge" not in extras["tour"]  # --no-deps: its requirements contradict verl's


def test_the_test_extra_is_the_tour_extra_and_the_test_tools(extras):
    tour, test = extras["tour"], extras["test"]
    def bare(r):  # the requirement without its extra marker
        return (sorted(r.extras), str(r.specifier))

    assert {name: bare(r) for name, r in tour.items()} == {name: bare(test[name]) for name in tour if name in test}
    assert {"pytest", "hypothesis"} <= set(test)


def test_the_readme_names_the_tour_install_and_the_cpu_wheel_index():
    text = (ROOT / "README.md").read_text()
    assert 'pip install -e ".[tour]" && pip install --no-deps megatron-bridge==' + NO_DEPS["megatron-bridge"] in text
    assert "https://download.pytorch.org/whl/cpu" in text
