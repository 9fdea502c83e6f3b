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
from packaging.specifiers import SpecifierSet
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


# -- scripts/check_gpu_install.py's import walk and the attention-backend row (issue 41, part 2) ----------

SCRIPT = None


def _script():
    global SCRIPT
    if SCRIPT is None:
        import runpy

        SCRIPT = runpy.run_path(str(ROOT / "scripts" / "check_gpu_install.py"), run_name="check_gpu_install")
    return SCRIPT


def _tree(root: pathlib.Path, files: dict[str, str]) -> pathlib.Path:
    for rel, text in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return root


def test_the_walk_follows_what_runs_and_skips_what_is_optional(tmp_path):
    site = _tree(tmp_path, {
        "pkg/__init__.py": "import needed_top\nfrom . import engine\n",
        "pkg/engine.py": (
            "import torch\n"
            "try:\n    import optional_one\nexcept ImportError:\n    optional_one = None\n"
            "with import_plugin('x'):\n    import plugin_only\n"
            "if _is_hip:\n    import rocm_only\nelse:\n    import cuda_side\n"
            "if not _is_npu:\n    import also_cuda_side\n"
            "if HAVE_FANCY:\n    import fancy\n"
            "if TYPE_CHECKING:\n    import typing_only\n"
            "if __name__ == '__main__':\n    import main_only\n"
            "def save(self):\n    import lazy_on_path\n"
            "def other(self):\n    import lazy_elsewhere\n"
            "class Saver:\n    def save_hf(self):\n        from pkg.sub import thing\n"
        ),
        "pkg/sub.py": "import from_sub\nimport pkg.gone\n",
    })
    walk = _script()["walk_imports"]
    walked, external, missing = walk([site], {"pkg.engine": ["save", "Saver.save_hf"]})
    assert {"pkg", "pkg.engine", "pkg.sub"} <= walked
    assert set(external) == {"needed_top", "torch", "cuda_side", "also_cuda_side", "lazy_on_path", "from_sub"}
    assert [m.split(" (")[0] for m in missing] == ["pkg.gone"]
    _, external_all, _ = walk([site], {"pkg.engine": True})  # every function body
    assert {"lazy_on_path", "lazy_elsewhere"} <= set(external_all)
    _, external_none, _ = walk([site], {"pkg.engine": False})  # module level only
    assert not {"lazy_on_path", "lazy_elsewhere", "from_sub"} & set(external_none)


def test_the_runtime_closure_fails_on_an_import_the_install_lacks(tmp_path):
    """The check can fail: a package the walked code imports, absent from the resolved install, is a problem;
    one listed in NOT_ON_PATH is reported with its reason instead."""
    import zipfile

    wheel = tmp_path / "walked-1.0-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as zf:
        zf.writestr("walked/__init__.py", "import cupy\nimport numpy\n")
    check = _script()["check_runtime_closure"]
    stack = _script()["STACK"]
    roots = stack["RUNTIME_ROOTS"]
    try:
        stack["RUNTIME_ROOTS"] = {"walked": False}
        final = {"walked": {"version": "1.0"}, "numpy": {"version": "2.0"}}
        lines, problems = check(final, {"walked": wheel}, tmp_path / "a", installed_map={"numpy": ["numpy"]})
        assert problems == ["import cupy (cupy-cuda13x) is not in the install: walked/__init__.py:1"], problems
        lines, problems = check({**final, "cupy-cuda13x": {"version": gpu_stack.CUPY}}, {"walked": wheel},
                                tmp_path / "b", installed_map={})
        assert problems == [] and "1 modules walked" in lines[0]
    finally:
        stack["RUNTIME_ROOTS"] = roots


def test_the_window_of_transformer_engine_is_read_from_its_source(tmp_path):
    import zipfile

    wheel = tmp_path / "transformer_engine-2.14.1-py3-none-any.whl"
    source = ('class FlashAttentionUtils:\n    version_required = PkgVersion("2.1.1")\n'
              '    version_required_blackwell = PkgVersion("2.7.3")\n    max_version = PkgVersion("2.8.3")\n')
    with zipfile.ZipFile(wheel, "w") as zf:
        zf.writestr("transformer_engine/pytorch/attention/dot_product_attention/utils.py", source)
    assert _script()["flash_attention_window"](wheel) == gpu_stack.FLASH_ATTN_WINDOW_TE
    assert gpu_stack.SOURCE_BUILD["flash-attn"] == gpu_stack.FLASH_ATTN
    assert gpu_stack.FLASH_ATTN in SpecifierSet(gpu_stack.FLASH_ATTN_WINDOW_TE[0])
    assert "2.8.3.post1" not in SpecifierSet(gpu_stack.FLASH_ATTN_WINDOW_TE[0])  # TE would ignore a .post


def test_check_reports_the_attention_backend_te_will_use():
    from verl_mopd.install_check import attention_backend, print_attention_backend

    window = lambda: gpu_stack.FLASH_ATTN_WINDOW_TE
    versions = {"transformer-engine": "2.14.1", "flash-attn": "2.8.3"}
    state, line = attention_backend({}.get, window)
    assert state == "n/a" and "not applicable" in line and "Transformer Engine is not installed" in line
    state, line = attention_backend(versions.get, window)
    assert state == "ok" and "flash-attn 2.8.3 inside Transformer Engine 2.14.1's window >=2.1.1,<=2.8.3" in line
    for fa in ("2.8.3.post2", "2.0.9", None):  # outside the window, or only flash-attn-4
        state, line = attention_backend({**versions, "flash-attn": fa, "flash-attn-4": "4.0.0b15"}.get, window)
        assert state == "none" and "No dot product attention backend is available" in line, fa
        out = io.StringIO()
        assert print_attention_backend(out, (state, line)) is False and "[NONE]" in out.getvalue()
    state, _ = attention_backend({**versions, "flash-attn": None, "flash-attn-3": "3.0.0b1"}.get, window)
    assert state == "ok"


def test_what_the_install_leaves_out_is_off_in_every_recipe():
    """gpu_stack.NOT_ON_PATH says why three imports of the walk never run: LoRA / Megatron-FSDP, async
    checkpoint saves and MoE routing replay are off in every recipe (composed as launched)."""
    import os

    from hydra import compose, initialize_config_dir
    from omegaconf import OmegaConf

    assert set(gpu_stack.NOT_ON_PATH) == {"megatron.energon", "megatron.core.dist_checkpointing.strategies.base",
                                          "sglang.srt.layers.moe.routed_experts_capturer"}
    os.environ.setdefault("CKPT_DIR", "/mnt/ckpt")
    with initialize_config_dir(config_dir=str(ROOT / "recipes" / "ui_mopd"), version_base=None):
        for name in ("stage2_mopd_qwen3vl8b", "stage2_mopd_small", "stage1_teacher_sft_desktop"):
            cfg = compose(config_name=name)
            off = {
                "lora": [OmegaConf.select(cfg, k, default=0) for k in
                         ("actor_rollout_ref.model.lora.rank", "actor_rollout_ref.model.lora_rank", "model.lora.rank",
                          "model.lora_rank")],
                "fsdp": [OmegaConf.select(cfg, k, default=False) for k in
                         ("actor_rollout_ref.actor.megatron.use_megatron_fsdp", "engine.use_megatron_fsdp")],
                "async": [OmegaConf.select(cfg, k, default=False) for k in
                          ("actor_rollout_ref.actor.checkpoint.async_save", "checkpoint.async_save")],
                "replay": [OmegaConf.select(cfg, "actor_rollout_ref.rollout.enable_rollout_routing_replay",
                                            default=False)],
            }
            assert not any(v for values in off.values() for v in values), (name, off)
            assert OmegaConf.select(cfg, "actor_rollout_ref.model.lora_adapter_path", default=None) is None
