"""Prove with pip's resolver that the documented GPU install resolves (needs the package index).

    python3.12 scripts/check_gpu_install.py [--glibc 2.34] [--index-url https://pypi.org/simple]

The install (``verl_mopd/gpu_stack.py``, README "GPU install") is three commands. This script
checks each one for Python 3.12 on linux x86_64 without installing anything:

1. ``pip install --prefer-binary -e ".[megatron,sglang]"``: pip's resolver in dry-run mode (``--dry-run
   --ignore-installed --report``) with ``--python-version 3.12``, ``--platform manylinux_2_X_x86_64``
   for every glibc up to ``--glibc`` and ``--only-binary=:all:``. The few pure-Python sdists the
   stack needs (``PURE_PYTHON_SDISTS``) are built to wheels first and offered with ``--find-links``.
2. ``pip install --no-deps sglang==... megatron-bridge==...``: their wheels' metadata (a
   ``--no-deps`` dry run) is read, and every requirement they declare is checked against step 1's
   resolution; one that is not met must be listed in ``OVERRIDES`` with the reason.
3. ``pip install --no-build-isolation --no-deps transformer-engine-torch==...``: the sdist must be on the
   index; its declared requirements (``PKG-INFO``) are checked as in step 2.

Then the resolved versions are checked against ``SUPPORTED`` and printed with the date. Exit 0
when everything holds, 1 otherwise. Run it with a Python 3.12 interpreter on linux x86_64: pip
evaluates dependency markers with the interpreter that runs it. pip's configuration files and
``PIP_*`` variables are ignored (``PIP_CONFIG_FILE=/dev/null``), so local constraints or wheel
folders cannot change the answer. Not part of the test suite (it needs the index).
"""

from __future__ import annotations

import argparse
import datetime
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


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--glibc", default="2.34", help="oldest glibc of the GPU nodes (sglang 0.5.12 wheels need 2.34)")
    parser.add_argument("--index-url", default="https://pypi.org/simple")
    parser.add_argument("--keep", metavar="DIR", help="keep pip's JSON reports in DIR")
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
        (build_name, build_version), = STACK["SOURCE_BUILD"].items()
        build_requires = sdist_requirements(args.index_url, build_name, build_version)
        print(f"step 3  pip install --no-build-isolation --no-deps {build_name}=={build_version}: sdist found")

    final = {**step1, **step2, canonicalize_name(build_name): {"name": build_name, "version": build_version}}
    problems, overridden = [], {}
    for owner, requires in [(m["name"], m.get("requires_dist") or []) for m in step2.values()] + [
            (build_name, build_requires)]:
        p, o = check_requirements(owner, requires, final)
        problems += p
        overridden.update(o)
    # nothing resolved in step 1 may ask for another version of what steps 2-3 install
    late = set(step2) | {canonicalize_name(build_name)}
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

    print("\nresolved versions (the supported GPU stack):")
    for dist in STACK["SUPPORTED"]:
        got = final.get(canonicalize_name(dist))
        print(f"  {dist:26s} {got['version'] if got else 'MISSING'}")
    print(f"\nrequirements of the --no-deps / source-built packages not met on purpose ({len(overridden)}):")
    for line in overridden.values():
        print("  " + line)
    if stale:
        print("\nnote: OVERRIDES entries no longer needed: " + ", ".join(stale))
    if problems:
        print(f"\nFAIL ({len(problems)}):")
        for line in problems:
            print("  " + line)
        return 1
    print("\nOK: the GPU install resolves")
    return 0


if __name__ == "__main__":
    sys.exit(main())
