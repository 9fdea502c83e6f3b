"""The supported GPU stack (``verl_mopd.gpu_stack``): setup.py's GPU extras come from it, they are
never silently skipped on another Python, and ``verl-mopd check`` reports every GPU package's
installed version against it. (That the install resolves is ``scripts/check_gpu_install.py``'s
job: it needs the package index.)"""

import importlib.metadata as md
import io
import pathlib
import subprocess
import sys
from email.parser import Parser

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from verl_mopd import gpu_stack
from verl_mopd.install_check import gpu_stack_status, print_gpu_stack

ROOT = pathlib.Path(__file__).parents[1]


@pytest.fixture(scope="module")
def built_metadata(tmp_path_factory):
    """setup.py's own metadata (``egg_info``), so the extras checked are the ones pip would see."""
    out = tmp_path_factory.mktemp("egg")
    subprocess.run([sys.executable, "setup.py", "-q", "egg_info", "--egg-base", str(out)], cwd=ROOT, check=True,
                   capture_output=True)
    (info,) = out.glob("*.egg-info")
    return Parser().parsestr((info / "PKG-INFO").read_text())


def test_setup_py_gpu_extras_are_gpu_stack_extras(built_metadata):
    for extra, reqs in gpu_stack.EXTRAS.items():
        assert extra in built_metadata.get_all("Provides-Extra")
        declared = sorted(str(Requirement(r.split(";")[0])) for r in built_metadata.get_all("Requires-Dist")
                          if f'extra == "{extra}"' in r)
        assert declared == sorted(str(Requirement(r)) for r in reqs), extra


@pytest.mark.parametrize("python", ["3.10", "3.11", "3.12", "3.13"])
def test_no_gpu_requirement_is_silently_skipped_on_any_python(python):
    """A marker that drops a requirement on some Python installs half a stack there (the old
    ``megatron-bridge; python_version >= '3.12'`` did on 3.11); without markers pip refuses loudly."""
    env = {"python_version": python, "python_full_version": python + ".0", "sys_platform": "linux",
           "platform_machine": "x86_64", "extra": ""}
    for extra, reqs in gpu_stack.EXTRAS.items():
        for line in reqs:
            req = Requirement(line)
            assert req.marker is None or req.marker.evaluate({**env, "extra": extra}), (extra, line, python)


def test_the_no_deps_and_source_built_packages_are_not_in_the_extras():
    in_extras = {canonicalize_name(Requirement(r).name) for reqs in gpu_stack.EXTRAS.values() for r in reqs}
    later = {canonicalize_name(n) for n in [*gpu_stack.NO_DEPS, *gpu_stack.SOURCE_BUILD]}
    assert not in_extras & later  # with their dependencies they cannot resolve (the module docstring)
    assert {canonicalize_name(o) for o, _ in gpu_stack.OVERRIDES} <= later
    for name, version in {**gpu_stack.NO_DEPS, **gpu_stack.SOURCE_BUILD}.items():
        assert gpu_stack.SUPPORTED[name] == f"=={version}"


def test_status_classifies_missing_off_and_ok():
    supported = {"a": "==1.2.0", "b": ">=2,<3", "c": "==0.1", "d": "", "e": "==2.11.0"}
    installed = {"a": "1.2.0", "b": "3.0", "d": "7", "e": "2.11.0+cu130"}.get
    rows = {r.name: r for r in gpu_stack_status(installed, supported)}
    assert [r.name for r in gpu_stack_status(installed, supported)] == list(supported)
    assert (rows["a"].status, rows["b"].status, rows["c"].status, rows["d"].status) == ("ok", "off", "missing", "ok")
    assert rows["e"].status == "ok"  # a local CUDA build tag is the supported release
    assert rows["b"].line() == "  [OFF] b 3.0 (supported >=2,<3)"
    assert rows["c"].line() == "  [MISSING] c: not installed (supported ==0.1)"
    out = io.StringIO()
    assert print_gpu_stack(out, list(rows.values())) is False
    assert "missing: c; off: b" in out.getvalue()


def _installed(name):
    try:
        return md.version(name)
    except md.PackageNotFoundError:
        return None


def test_check_prints_every_gpu_package_against_this_environment():
    proc = subprocess.run([sys.executable, "-m", "verl_mopd.cli", "check"], capture_output=True, text=True, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr
    for name, spec in gpu_stack.SUPPORTED.items():
        version = _installed(name)
        if version is None:
            assert f"[MISSING] {name}: not installed" in proc.stdout
        else:
            assert f"{name} {version} (supported {spec or 'any version'})" in proc.stdout
    assert "not the supported GPU stack" in proc.stdout or "the GPU stack is complete" in proc.stdout
