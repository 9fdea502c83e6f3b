"""Prove that the documented GPU install resolves, and that what it runs is in it (needs the package index).

    python3.12 scripts/check_gpu_install.py [--glibc 2.34] [--index-url https://pypi.org/simple] [--keep DIR]

The pip-only install (``verl_mopd/gpu_stack.py``, README "GPU install") is three commands. This script
checks each one for Python 3.12 on linux x86_64 without installing anything:

1. ``pip install --prefer-binary -e ".[megatron,sglang]"``: pip's resolver in dry-run mode (``--dry-run
   --ignore-installed --report``) with ``--python-version 3.12``, ``--platform manylinux_2_X_x86_64``
   for every glibc up to ``--glibc`` and ``--only-binary=:all:``. The few pure-Python sdists the
   stack needs (``PURE_PYTHON_SDISTS``) are built to wheels first and offered with ``--find-links``.
2. ``pip install --no-deps sglang==... megatron-bridge==...``: their wheels' metadata (a
   ``--no-deps`` dry run) is read, and every requirement they declare is checked against step 1's
   resolution; one that is not met must be listed in ``OVERRIDES`` with the reason.
3. ``pip install --no-build-isolation --no-deps transformer-engine-torch==... flash-attn==...``: the sdists must
   be on the index; their declared requirements (``PKG-INFO``) are checked as in step 2.

Then what resolving cannot show:

- **the runtime closure**: the wheels of ``gpu_stack.WALKED`` at their resolved versions are downloaded
  (``pip download --no-deps``) and their imports walked statically (``ast``) from ``gpu_stack.RUNTIME_ROOTS``:
  verl's Megatron engine, Megatron-Bridge's save path, verl's checkpoint engines, SGLang and verl-mopd's own
  entry points. Every import that runs unless an import fails (module level everywhere; function bodies of
  the roots) must name a module of the walked wheels or a distribution of the resolved install, or be in
  ``NOT_ON_PATH`` with the reason it never runs. Skipped: imports under ``except ImportError`` (and the
  like), in ``with import_plugin(...)``, under conditions false on an NVIDIA GPU (``_is_hip``, ``_is_npu``,
  ...) or true only when a package is there (``HAVE_*``, ``*_available()``). A static walk: what a module
  imports by name at run time (``importlib.import_module(f"...")``) is not seen.
- **the attention backend**: verl's Megatron engine sets ``attention_backend: flash``; Transformer Engine's
  accepted flash-attn versions are read from its own source (``FlashAttentionUtils``) and the resolved
  flash-attn must be inside them (or flash-attn-3 installed), and flash-attn-4 must not be there.

Then the resolved versions are checked against ``SUPPORTED`` and printed with the date. Exit 0
when everything holds, 1 otherwise. Run it with a Python 3.12 interpreter on linux x86_64: pip
evaluates dependency markers with the interpreter that runs it. pip's configuration files and
``PIP_*`` variables are ignored (``PIP_CONFIG_FILE=/dev/null``), so local constraints or wheel
folders cannot change the answer. The import walk maps import names to distributions with
``gpu_stack.IMPORT_NAMES`` and this machine's installed metadata. Not part of the test suite (it needs
the index).
"""

from __future__ import annotations

import argparse
import ast
import datetime
import importlib.metadata
import io
import json
import os
import platform
import re
import runpy
import subprocess
import sys
import tarfile
import tempfile
import urllib.request
import zipfile
from email.parser import Parser
from pathlib import Path

try:
    from packaging.markers import Marker
    from packaging.requirements import Requirement
    from packaging.utils import canonicalize_name
except ImportError:  # a bare interpreter: pip's vendored copy
    from pip._vendor.packaging.markers import Marker  # noqa: F401
    from pip._vendor.packaging.requirements import Requirement
    from pip._vendor.packaging.utils import canonicalize_name

REPO = Path(__file__).resolve().parent.parent
STACK = runpy.run_path(str(REPO / "verl_mopd" / "gpu_stack.py"))
TARGET_MARKERS = {
    "python_version": STACK["PYTHON"], "python_full_version": STACK["PYTHON"] + ".0", "sys_platform": "linux",
    "platform_system": "Linux", "platform_machine": "x86_64", "os_name": "posix", "implementation_name": "cpython",
    "platform_python_implementation": "CPython",
}


def platforms(glibc: str) -> list[str]:
    """``manylinux_2_X_x86_64`` for X = minor..17 and the legacy aliases (pip does not expand them)."""
    major, minor = (int(x) for x in glibc.split("."))
    if major != 2 or minor < 17:
        raise SystemExit(f"--glibc={glibc}: expected 2.N with N >= 17")
    tags = [f"manylinux_2_{m}_x86_64" for m in range(minor, 16, -1)]
    return tags + ["manylinux2014_x86_64", "manylinux2010_x86_64", "manylinux1_x86_64", "linux_x86_64"]


def pip(args: list[str], *, quiet_ok: bool = False) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PIP_")}
    env["PIP_CONFIG_FILE"] = os.devnull
    env["PIP_DISABLE_PIP_VERSION_CHECK"] = "1"
    return subprocess.run([sys.executable, "-m", "pip", *args], env=env, capture_output=True, text=True, cwd=REPO)


def fail_with(proc: subprocess.CompletedProcess, what: str) -> None:
    noise = ("  ", "Collecting", "Downloading", "Using cached", "Obtaining", "Requested ", "Please use pip<24.1",
             "WARNING: Ignoring version")
    lines = [ln for ln in (proc.stdout + proc.stderr).splitlines() if not ln.startswith(noise) and "━" not in ln]
    print(f"FAIL: {what} (pip exit {proc.returncode})\n" + "\n".join(lines[-40:]))
    raise SystemExit(1)


def build_pure_sdists(index: str, folder: str) -> list[str]:
    built = []
    for name, version in STACK["PURE_PYTHON_SDISTS"].items():
        proc = pip(["wheel", "--no-deps", "--no-binary=:all:", "--index-url", index, "-w", folder,
                    f"{name}=={version}"])
        if proc.returncode:
            fail_with(proc, f"building the pure-Python sdist {name}=={version}")
        wheels = [w for w in os.listdir(folder) if canonicalize_name(w.split("-")[0]) == canonicalize_name(name)]
        if not wheels or not wheels[0].endswith("-py3-none-any.whl"):
            print(f"FAIL: {name}=={version} did not build to a pure-Python wheel: {wheels}")
            raise SystemExit(1)
        built.append(wheels[0])
    return built


def dry_run(target: list[str], report: str, common: list[str], *extra: str) -> dict:
    proc = pip(["install", "--dry-run", "--ignore-installed", "--report", report, "-q", *common, *extra, *target])
    if proc.returncode:
        fail_with(proc, "pip install --dry-run " + " ".join(target))
    with open(report) as f:
        return json.load(f)


def dry_run_as_typed(report: str, index: str) -> dict[str, dict]:
    """Step 1 exactly as README writes it (``pip install --prefer-binary -e ".[megatron,sglang]"``) on this
    interpreter and machine; sdists other than ``PURE_PYTHON_SDISTS`` are a failure (they would compile)."""
    proc = pip(["install", "--dry-run", "--ignore-installed", "--report", report, "-q", "--index-url", index,
                "--prefer-binary", "-e", f"{REPO}[megatron,sglang]"])
    if proc.returncode:
        fail_with(proc, 'pip install --dry-run --prefer-binary -e ".[megatron,sglang]"')
    with open(report) as f:
        data = json.load(f)
    allowed = {canonicalize_name(n) for n in STACK["PURE_PYTHON_SDISTS"]} | {"verl-mopd"}
    sdists = [i["metadata"]["name"] for i in data["install"] if not i["download_info"]["url"].endswith(".whl")
              and canonicalize_name(i["metadata"]["name"]) not in allowed]
    if sdists:
        print(f"FAIL: as typed, step 1 would build these from source: {sdists}")
        raise SystemExit(1)
    return resolved(data)


def resolved(report: dict) -> dict[str, dict]:
    return {canonicalize_name(i["metadata"]["name"]): i["metadata"] for i in report["install"]}


def applies(req: Requirement, extra: str = "") -> bool:
    return req.marker is None or req.marker.evaluate({**TARGET_MARKERS, "extra": extra})


def check_requirements(owner: str, requires: list[str], env: dict[str, dict]) -> tuple[list[str], dict[tuple, str]]:
    """``(problems, overridden)`` for the requirements ``owner`` declares, against the resolved ``env``;
    ``overridden`` maps an ``OVERRIDES`` key that was needed to the line saying what it overrides."""
    problems, overridden = [], {}
    reasons = {(canonicalize_name(o), canonicalize_name(r)): (o, r) for o, r in STACK["OVERRIDES"]}
    for line in requires:
        req = Requirement(line)
        if not applies(req):
            continue
        name = canonicalize_name(req.name)
        got = env.get(name)
        key = reasons.get((canonicalize_name(owner), name))
        unmet = []
        if got is None:
            unmet.append("not installed")
        else:
            if got["version"] not in req.specifier:
                unmet.append(f"wants {req.specifier}, gets {got['version']}")
            for ext in sorted(canonicalize_name(e) for e in req.extras):  # the extra's requirements too
                for sub in got.get("requires_dist") or []:
                    sreq = Requirement(sub)
                    if sreq.marker is None or not applies(sreq, ext) or applies(sreq, ""):
                        continue
                    have = env.get(canonicalize_name(sreq.name))
                    if have is None or have["version"] not in sreq.specifier:
                        unmet.append(f"[{ext}] needs {sreq.name}{sreq.specifier}, "
                                     f"gets {have['version'] if have else 'nothing'}")
        if not unmet:
            continue
        text = f"{owner} requires {line.split(';')[0].strip()}: {'; '.join(unmet[:3])}"
        if key:
            overridden[key] = f"{text}\n      why: {STACK['OVERRIDES'][key]}"
        else:
            problems.append(text)
    return problems, overridden


def sdist_requirements(index: str, name: str, version: str) -> list[str]:
    """``Requires-Dist`` of an sdist on the index (its ``PKG-INFO``)."""
    page = urllib.request.urlopen(f"{index.rstrip('/')}/{canonicalize_name(name)}/", timeout=60).read().decode()
    stem = f"{name.replace('-', '_')}-{version}.tar.gz"
    hrefs = [h for h in re.findall(r'href="([^"]+)"', page) if h.split("#")[0].endswith("/" + stem)]
    if not hrefs:
        raise SystemExit(f"FAIL: {stem} is not on {index}")
    url = hrefs[0].split("#")[0]
    data = urllib.request.urlopen(url, timeout=300).read()
    with tarfile.open(fileobj=io.BytesIO(data)) as tar:
        info = tar.extractfile(f"{stem[: -len('.tar.gz')]}/PKG-INFO").read().decode()
    return Parser().parsestr(info).get_all("Requires-Dist") or []



# -- the runtime closure: a static import walk over the resolved wheels ---------------------------------

#: an ``except`` of one of these around an import makes it optional (the code runs without the module)
GUARDING_EXCEPTIONS = {"ImportError", "ModuleNotFoundError", "PackageNotFoundError", "Exception", "BaseException",
                       "OSError", "RuntimeError", "AttributeError"}
#: ``with <this>(...)``: a context manager that swallows the ImportError (ModelOpt's plugins, contextlib.suppress)
GUARDING_CONTEXTS = {"import_plugin", "suppress"}
#: a condition on one of these names is false on an NVIDIA GPU (ROCm, Ascend, Moore Threads, Intel, Apple, CPU)
OTHER_HARDWARE = re.compile(r"^_?(?:is|use)_(?:hip|npu|musa|xpu|mlx|hpu|mps|cpu|aiter)\w*$")
#: a condition like these runs its body only when a package is there, or the user opts in
AVAILABILITY = re.compile(r"HAVE_|_available|is_installed|getenv|environ|TYPE_CHECKING|__name__")


def _catches_import_errors(handlers) -> bool:
    for handler in handlers:
        if handler.type is None:
            return True
        for node in handler.type.elts if isinstance(handler.type, ast.Tuple) else [handler.type]:
            name = node.id if isinstance(node, ast.Name) else getattr(node, "attr", "")
            if name in GUARDING_EXCEPTIONS:
                return True
    return False


def _condition(test) -> bool | None:
    """What ``if test`` is on an NVIDIA GPU with every installed package: True, False, or None (either)."""
    if isinstance(test, ast.UnaryOp) and isinstance(test.op, ast.Not):
        inner = _condition(test.operand)
        return None if inner is None else not inner
    if isinstance(test, ast.BoolOp):
        parts = [_condition(v) for v in test.values]
        if isinstance(test.op, ast.And):
            return False if False in parts else (True if all(p is True for p in parts) else None)
        return True if True in parts else (False if all(p is False for p in parts) else None)
    node = test.func if isinstance(test, ast.Call) else test
    name = node.id if isinstance(node, ast.Name) else getattr(node, "attr", "")
    if OTHER_HARDWARE.match(name or ""):
        return False
    if AVAILABILITY.search(ast.unparse(test)):
        return False  # its body is optional: it runs only if the package is there (or the user asks)
    return None


class _Module:
    """A module of the walked trees: its file, and whether it is a package (for relative imports)."""

    def __init__(self, sites: list[Path], name: str):
        self.name = name
        for site in sites:
            base = site.joinpath(*name.split("."))
            if (base / "__init__.py").is_file():
                self.path, self.package = base / "__init__.py", True
                return
            if base.with_suffix(".py").is_file():
                self.path, self.package = base.with_suffix(".py"), False
                return
        for site in sites:  # a namespace package (megatron)
            if site.joinpath(*name.split(".")).is_dir():
                self.path, self.package = None, True
                return
        raise KeyError(name)

    def absolute(self, module: str | None, level: int) -> str:
        if not level:
            return module or ""
        base = self.name.split(".")[: None if self.package else -1]
        base = base[: len(base) - level + 1]
        return ".".join(base + ([module] if module else []))


def module_imports(module: _Module, functions) -> list[tuple[str, int, tuple[str, ...]]]:
    """``(module, line, names)`` of every import that runs unless an import fails: module level, and in
    function bodies when ``functions`` is True (all) or names them (``Class.method``). Skipped: imports
    under an ``except ImportError`` (and the like), in a ``with import_plugin(...)``, under a condition
    that is false on an NVIDIA GPU, or that holds only if the package is there (``_condition``)."""
    if module.path is None:
        return []
    out: list[tuple[str, int, tuple[str, ...]]] = []

    def wanted(qual: list[str]) -> bool:
        if functions is True or not functions:
            return functions is True
        dotted = ".".join(qual)
        return any(dotted == f or dotted.startswith(f + ".") for f in functions)

    def visit(body, qual: list[str], in_function: bool) -> None:
        for node in body:
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                if in_function and not wanted(qual):
                    continue
                if isinstance(node, ast.Import):
                    out.extend((a.name, node.lineno, ()) for a in node.names)
                else:
                    out.append((module.absolute(node.module, node.level), node.lineno,
                                tuple(a.name for a in node.names)))
            elif isinstance(node, ast.Try) or type(node).__name__ == "TryStar":
                if not _catches_import_errors(node.handlers):
                    visit(node.body, qual, in_function)
                    visit(node.orelse, qual, in_function)
                visit(node.finalbody, qual, in_function)
            elif isinstance(node, ast.If):
                cond = _condition(node.test)
                if cond is not False:
                    visit(node.body, qual, in_function)
                if cond is not True:
                    visit(node.orelse, qual, in_function)
            elif isinstance(node, (ast.With, ast.AsyncWith)):
                ctx = [i.context_expr for i in node.items]
                names = {(c.func.id if isinstance(c.func, ast.Name) else getattr(c.func, "attr", ""))
                         for c in ctx if isinstance(c, ast.Call)}
                if not names & GUARDING_CONTEXTS:
                    visit(node.body, qual, in_function)
            elif isinstance(node, (ast.For, ast.AsyncFor, ast.While)):
                visit(node.body, qual, in_function)
            elif isinstance(node, ast.ClassDef):
                visit(node.body, qual + [node.name], in_function)
            elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                visit(node.body, qual + [node.name], True)

    visit(ast.parse(module.path.read_bytes(), str(module.path)).body, [], False)
    return out


def walk_imports(sites: list[Path], roots: dict) -> tuple[set[str], dict[str, list[str]], list[str]]:
    """The modules reached from ``roots`` (module -> which function bodies run too: True, False or names),
    through every module of ``sites``; returns ``(walked, external, missing)``: the walked modules, each
    top-level name outside the trees with where it is imported, and imports of the trees' own packages
    that name a module the trees lack."""
    tops = {p.name.removesuffix(".py") for site in sites for p in site.iterdir()
            if not p.name.endswith((".dist-info", ".data", ".egg-info"))}
    done: set[tuple] = set()
    external: dict[str, list[str]] = {}
    missing: list[str] = []
    parent: dict[str, str] = {}  # module -> the module that first imported it (for the chain in a report)

    def chain(name: str) -> str:
        hops = [name]
        while hops[-1] in parent and len(hops) < 12:
            hops.append(parent[hops[-1]])
        return " <- ".join(hops[1:]) if len(hops) > 1 else "a root"

    queue = [(name, spec) for name, spec in roots.items()]
    while queue:
        name, spec = queue.pop()
        key = (name, tuple(sorted(spec)) if isinstance(spec, (set, list, tuple)) else spec)
        if key in done:
            continue
        done.add(key)
        try:
            module = _Module(sites, name)
        except KeyError:
            missing.append(f"{name} (a root)")
            continue
        parts = name.split(".")
        for i in range(1, len(parts)):  # its packages run first
            parent.setdefault(".".join(parts[:i]), name)
            queue.append((".".join(parts[:i]), False))
        for target, line, names in module_imports(module, spec):
            where = f"{module.name.replace('.', '/')}{'/__init__' if module.package else ''}.py:{line}"
            if target.split(".")[0] not in tops:
                external.setdefault(target.split(".")[0], []).append(where)
                continue
            try:
                _Module(sites, target)
            except KeyError:
                missing.append(f"{target} ({where}, reached from {chain(module.name) if module.name in parent else 'a root'})")
                continue
            parent.setdefault(target, module.name)
            queue.append((target, False))
            for sub in names:  # `from package import module`
                try:
                    _Module(sites, f"{target}.{sub}")
                except KeyError:
                    continue
                parent.setdefault(f"{target}.{sub}", module.name)
                queue.append((f"{target}.{sub}", False))
    return {k[0] for k in done}, external, missing


def import_distributions(installed_map: dict[str, list[str]] | None = None) -> dict[str, set[str]]:
    """import name -> distributions that provide it: ``gpu_stack.IMPORT_NAMES`` first, then this machine's
    installed distributions (the CPU suite's venv has most of the stack's pure-Python packages)."""
    mapping = {k: {canonicalize_name(v)} for k, v in STACK["IMPORT_NAMES"].items()}
    for top, dists in (installed_map if installed_map is not None
                       else importlib.metadata.packages_distributions()).items():
        mapping.setdefault(top, set()).update(canonicalize_name(d) for d in dists)
    return mapping


def check_runtime_closure(final: dict[str, dict], wheels: dict[str, Path], workdir: Path,
                          installed_map: dict[str, list[str]] | None = None) -> tuple[list[str], list[str]]:
    """Walk the imports of ``gpu_stack.RUNTIME_ROOTS`` over the wheels in ``wheels`` (distribution -> file)
    and this repository; ``(report lines, problems)``: every module reached must be in the trees, and
    every outside package it imports must be in ``final`` (the resolved install) or ``NOT_ON_PATH``."""
    site = workdir / "site"
    site.mkdir(parents=True, exist_ok=True)
    for wheel in wheels.values():
        with zipfile.ZipFile(wheel) as zf:
            zf.extractall(site)
    walked, external, missing = walk_imports([site, REPO], STACK["RUNTIME_ROOTS"])
    mapping = import_distributions(installed_map)
    lines, problems, excused = [], [], []
    for top in sorted(external):
        if top in sys.stdlib_module_names or top == "__future__":
            continue
        dists = mapping.get(top) or {canonicalize_name(top)}
        have = sorted(d for d in dists if d in final)
        if have:
            continue
        where = ", ".join(external[top][:2]) + (f" (+{len(external[top]) - 2})" if len(external[top]) > 2 else "")
        if top in STACK["NOT_ON_PATH"]:
            excused.append(f"{top} ({where})\n      why: {STACK['NOT_ON_PATH'][top]}")
        else:
            problems.append(f"import {top} ({'/'.join(sorted(dists))}) is not in the install: {where}")
    for line in missing:
        key = line.split(" (")[0]
        reason = STACK["NOT_ON_PATH"].get(key)
        if reason:
            excused.append(f"{line}\n      why: {reason}")
        else:
            problems.append(f"module {line} does not exist in the resolved wheels")
    lines.append(f"runtime closure: {len(walked)} modules walked from {len(STACK['RUNTIME_ROOTS'])} roots "
                 f"(verl's Megatron engine, Megatron-Bridge's save path, verl's checkpoint engines, SGLang, "
                 f"verl-mopd) over {', '.join(f'{n} {final[canonicalize_name(n)]['version']}' for n in wheels)}; "
                 f"{sum(1 for t in external if t not in sys.stdlib_module_names)} outside packages imported")
    if excused:
        lines.append(f"  imported, not installed on purpose ({len(excused)}; gpu_stack.NOT_ON_PATH):")
        lines += ["    " + e for e in excused]
    return lines, problems


def flash_attention_window(te_wheel: Path) -> tuple[str, str]:
    """Transformer Engine's accepted flash-attn versions, read from its own source (``FlashAttentionUtils``):
    ``(">=min,<=max", ">=min_blackwell,<=max")``."""
    with zipfile.ZipFile(te_wheel) as zf:
        text = zf.read("transformer_engine/pytorch/attention/dot_product_attention/utils.py").decode()
    found = dict(re.findall(r'^\s+(version_required|version_required_blackwell|max_version) = PkgVersion\("([^"]+)"\)',
                            text, re.MULTILINE))
    return (f">={found['version_required']},<={found['max_version']}",
            f">={found['version_required_blackwell']},<={found['max_version']}")


def download_wheels(names: list[str], final: dict[str, dict], folder: str, common: list[str]) -> dict[str, Path]:
    """The resolved version's wheel of each of ``names`` (``pip download --no-deps``), name -> file."""
    pins = [f"{n}=={final[canonicalize_name(n)]['version']}" for n in names]
    args = [a for i, a in enumerate(common) if a != "--target" and not (i and common[i - 1] == "--target")]
    proc = pip(["download", "--no-deps", "-q", "-d", folder, *args, *pins])
    if proc.returncode:
        fail_with(proc, "pip download --no-deps " + " ".join(pins))
    out = {}
    for name in names:
        stem = canonicalize_name(name).replace("-", "_")
        (wheel,) = [Path(folder, f) for f in os.listdir(folder)
                    if f.endswith(".whl") and canonicalize_name(f.split("-")[0]).replace("-", "_") == stem]
        out[name] = wheel
    return out

def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--glibc", default="2.34", help="oldest glibc of the GPU nodes (sglang 0.5.12 wheels need 2.34)")
    parser.add_argument("--index-url", default="https://pypi.org/simple")
    parser.add_argument("--keep", metavar="DIR", help="keep pip's JSON reports in DIR")
    parser.add_argument("--from-reports", metavar="DIR",
                        help="reuse the step-1/step-2 reports a --keep run wrote to DIR instead of resolving again "
                             "(the sdists, the wheel downloads and the import walk still run)")
    args = parser.parse_args(argv)
    if (sys.version_info[:2] != tuple(int(x) for x in STACK["PYTHON"].split("."))
            or sys.platform != "linux" or platform.machine() != "x86_64"):
        print(f"run this with Python {STACK['PYTHON']} on linux x86_64 (pip evaluates dependency markers with the "
              f"running interpreter); this is Python {platform.python_version()} on {sys.platform} {platform.machine()}")
        return 2
    pip_version = pip(["--version"]).stdout.split()[1]
    print(f"date {datetime.date.today().isoformat()}  pip {pip_version}  Python {STACK['PYTHON']}  linux x86_64  "
          f"glibc <= {args.glibc}  index {args.index_url}")
    with tempfile.TemporaryDirectory() as tmp:
        out = args.keep or tmp
        os.makedirs(out, exist_ok=True)
        wheels = os.path.join(tmp, "wheels")
        os.makedirs(wheels)
        print("built pure-Python sdists:", ", ".join(build_pure_sdists(args.index_url, wheels)) or "none")
        # --target: pip < 24 allows platform options only with it (nothing is written in a dry run)
        common = ["--python-version", STACK["PYTHON"], "--only-binary=:all:", "--index-url", args.index_url,
                  "--find-links", wheels, "--target", os.path.join(tmp, "target")]
        common += [a for p in platforms(args.glibc) for a in ("--platform", p)]

        if args.from_reports:
            with open(os.path.join(args.from_reports, "step1.json")) as f:
                step1 = resolved(json.load(f))
            with open(os.path.join(args.from_reports, "step2.json")) as f:
                step2 = resolved(json.load(f))
            print(f"steps 1-2: reports of an earlier run reused ({args.from_reports}): {len(step1)} distributions")
        else:
            step1 = resolved(dry_run([f"{REPO}[megatron,sglang]"], os.path.join(out, "step1.json"), common))
            print(f"step 1  pip install --prefer-binary -e \".[megatron,sglang]\": resolved, {len(step1)} distributions "
                  f"(binary wheels, Python {STACK['PYTHON']}, manylinux glibc <= {args.glibc})")
            # the command as a user types it, on this machine: sdists allowed, so it could pick another version
            as_typed = dry_run_as_typed(os.path.join(out, "step1_as_typed.json"), args.index_url)
            differ = sorted(f"{n} {as_typed[n]['version']} (binary-only: {step1[n]['version'] if n in step1 else 'absent'})"
                            for n in as_typed if n not in step1 or as_typed[n]["version"] != step1[n]["version"])
            differ += sorted(f"{n} absent (binary-only: {step1[n]['version']})" for n in step1 if n not in as_typed)
            print(f"        as typed here (--prefer-binary, this machine's glibc): {len(as_typed)} distributions, "
                  f"{'the same versions' if not differ else 'DIFFERENT: ' + '; '.join(differ)}")
            no_deps = [f"{n}=={v}" for n, v in STACK["NO_DEPS"].items()]
            step2 = resolved(dry_run(no_deps, os.path.join(out, "step2.json"), common, "--no-deps"))
            print(f"step 2  pip install --no-deps {' '.join(no_deps)}: wheels found")
        build_requires = {name: sdist_requirements(args.index_url, name, version)
                          for name, version in STACK["SOURCE_BUILD"].items()}
        print(f"step 3  pip install --no-build-isolation --no-deps "
              f"{' '.join(f'{n}=={v}' for n, v in STACK['SOURCE_BUILD'].items())}: sdists found")

        final = {**step1, **step2, **{canonicalize_name(n): {"name": n, "version": v}
                                      for n, v in STACK["SOURCE_BUILD"].items()}}
        walked_wheels = download_wheels([n for n in STACK["WALKED"] if canonicalize_name(n) in final],
                                        final, os.path.join(tmp, "walked"), common)
        closure_lines, closure_problems = check_runtime_closure(final, walked_wheels, Path(tmp))
        window = flash_attention_window(walked_wheels["transformer-engine"])

    problems, overridden = [], {}
    for owner, requires in [(m["name"], m.get("requires_dist") or []) for m in step2.values()] + list(
            build_requires.items()):
        p, o = check_requirements(owner, requires, final)
        problems += p
        overridden.update(o)
    # nothing resolved in step 1 may ask for another version of what steps 2-3 install
    late = set(step2) | {canonicalize_name(n) for n in STACK["SOURCE_BUILD"]}
    for meta in step1.values():
        reqs = [r for r in meta.get("requires_dist") or [] if canonicalize_name(Requirement(r).name) in late]
        problems += check_requirements(meta["name"], reqs, final)[0]
    for dist, spec in STACK["SUPPORTED"].items():
        got = final.get(canonicalize_name(dist))
        if got is None:
            problems.append(f"{dist}: not in the install (supported {spec or 'any version'})")
        elif spec and got["version"] not in Requirement(f"x{spec}").specifier:
            problems.append(f"{dist}: resolves to {got['version']}, supported {spec}")
    stale = [f"{o} -> {r}" for (o, r) in STACK["OVERRIDES"] if (o, r) not in overridden]

    # the attention backend: verl's Megatron engine asks TE for flash; TE takes flash-attn only inside its window
    te_version = final[canonicalize_name("transformer-engine")]["version"]
    fa = final.get("flash-attn")
    fa3 = final.get("flash-attn-3")
    attention = (f"attention: Transformer Engine {te_version} accepts flash-attn {window[0]} ({window[1]} on "
                 f"Blackwell), read from its FlashAttentionUtils; the install has flash-attn "
                 f"{fa['version'] if fa else 'none'}{', flash-attn-3 ' + fa3['version'] if fa3 else ''}")
    if window != tuple(STACK["FLASH_ATTN_WINDOW_TE"]):
        problems.append(f"Transformer Engine {te_version}'s flash-attn window is {window}, gpu_stack.FLASH_ATTN_WINDOW_TE "
                        f"says {tuple(STACK['FLASH_ATTN_WINDOW_TE'])}")
    if fa3 is None and (fa is None or fa["version"] not in Requirement("x" + window[0]).specifier):
        problems.append(f"no attention backend: verl's Megatron engine sets attention_backend=flash and Transformer "
                        f"Engine {te_version} accepts flash-attn {window[0]} or flash-attn-3; the install has "
                        f"{'flash-attn ' + fa['version'] if fa else 'neither'}")
    if "flash-attn-4" in final:
        problems.append(f"flash-attn-4 {final['flash-attn-4']['version']} is in the install: it ships the same "
                        "flash_attn/cute/ files as flash-attn 2.8.3 (verl 0.9.1 drops it)")
    problems += closure_problems

    print("\nresolved versions (the supported GPU stack):")
    for dist in STACK["SUPPORTED"]:
        got = final.get(canonicalize_name(dist))
        print(f"  {dist:26s} {got['version'] if got else 'MISSING'}")
    print(f"\nrequirements of the --no-deps / source-built packages not met on purpose ({len(overridden)}):")
    for line in overridden.values():
        print("  " + line)
    if stale:
        print("\nnote: OVERRIDES entries no longer needed: " + ", ".join(stale))
    print("\n" + attention)
    print("\n".join(closure_lines))
    if problems:
        print(f"\nFAIL ({len(problems)}):")
        for line in problems:
            print("  " + line)
        return 1
    print("\nOK: the GPU install resolves, its runtime closure is installed, and Transformer Engine has flash-attn "
          f"{fa['version'] if fa else ''} as its attention backend")
    return 0


if __name__ == "__main__":
    sys.exit(main())
