#!/usr/bin/env python
"""verl's own CPU tests, with and without verl-mopd loaded: report every test whose outcome differs.

Run it when the verl pin moves (the contributor page says so). The method is the peer review's of
2026-12-07, as a script:

1. verl's ``tests/`` at the commit matching the installed verl (:data:`PIN_COMMITS`, or ``--commit``)
   are taken out of a git clone of verl (``--verl-git``, a ``.git`` folder or a bare clone) with
   ``git archive``, into ``--work``; ``pytest.ini`` is verl's CI pattern (``python_files = *_on_cpu.py``,
   ``.github/workflows/cpu_unit_tests.yml``); the few repo-path files some tests open are linked to the
   installed verl's (:data:`REPO_PATH_SHIMS`).
2. The same pytest runs once per condition, each writing a junit XML:

   - ``with``: this interpreter as it is (verl's ``VERL_USE_EXTERNAL_PLUGINS=auto`` loads verl-mopd's
     ``verl.plugins`` entry point, as every verl process does);
   - ``nodist``: a venv on the same interpreter whose ``site-packages`` links every entry of this one
     except verl-mopd's distribution and editable finder: verl-mopd is not importable, no entry point;
   - ``envnone``: this interpreter with ``VERL_USE_EXTERNAL_PLUGINS=none`` (verl skips the entry points).

   Environment of every run: offline Hugging Face, no CUDA, ``RAY_OVERRIDE_RESOURCES='{"CPU": 128}'``
   (verl's TransferQueue tests start 3 one-CPU actors, which never schedule on a 2-core machine
   otherwise), ``--asyncio-mode=auto`` as verl's CI, ``--continue-on-collection-errors``.
3. Outcomes are compared per test id (the worst of setup, call and teardown); the script prints each
   condition's counts and every test whose outcome differs, and exits 1 if any does.

Tests that fail the same way in every condition (version skew between the commit's tests and the wheel,
missing model weights, a repo layout) are not differences: the review lists 91 of them at 1dda039.

verl's CI needs ``pytest-asyncio`` (and this script's ``--timeout`` needs ``pytest-timeout``); neither is
in the test extra. Put them on a folder and pass it with ``--addons``::

    pip install --no-deps --target /tmp/verl_addons pytest-asyncio==1.4.0 pytest-timeout==2.4.0
    python scripts/verl_suite.py --verl-git /path/to/verl/.git --addons /tmp/verl_addons \\
        [--conditions with,nodist] [--timeout 300] [tests/trainer/ppo/v1 ...]

The whole CPU set (about 1,080 tests) takes 5-10 minutes per condition on 2 cores.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import importlib.util
import json
import os
import subprocess
import sys
import sysconfig
import xml.etree.ElementTree as ET
from collections import Counter
from pathlib import Path

#: installed verl version -> (commit of github.com/verl-project/verl whose tests to run, why that one)
PIN_COMMITS = {
    "0.9.1": ("1dda039b9c6311889a9c9a26040677e1254814f9",
              "no public v0.9.1 tag: main of 2026-08-22, where 325 of the wheel's 419 files match by blob hash "
              "(289 at v0.9.0); every file equal at v0.9.0 is equal there (the peer review of 2026-12-07)"),
}
#: files some verl tests open by their path in a verl checkout: linked to the installed verl's
REPO_PATH_SHIMS = ("trainer/config", "workers/rollout/vllm_rollout/weight_update_utils.py",
                   "workers/engine/veomni/utils.py")
CONDITIONS = ("with", "nodist", "envnone")
#: site-packages entries that make verl-mopd importable (left out of the ``nodist`` venv)
OURS = ("verl_mopd", "verl_mopd-", "__editable__.verl_mopd", "__editable___verl_mopd", "__pycache__")
RANK = {"absent": -1, "passed": 0, "skipped": 1, "failed": 2, "error": 3}


def outcomes(junit: Path) -> dict[str, str]:
    """``{classname::name: outcome}`` from a junit XML; the worst outcome of a test's reports."""
    result: dict[str, str] = {}
    for case in ET.parse(junit).getroot().iter("testcase"):
        name = f"{case.get('classname')}::{case.get('name')}"
        kinds = {child.tag for child in case}
        outcome = ("failed" if "failure" in kinds else "error" if "error" in kinds
                   else "skipped" if "skipped" in kinds else "passed")
        if RANK[outcome] > RANK.get(result.get(name, "absent"), -1):
            result[name] = outcome
    return result


def differences(runs: dict[str, dict[str, str]]) -> list[tuple[str, dict[str, str]]]:
    """The tests whose outcome is not the same in every run (a test missing from a run counts as ``absent``)."""
    names = sorted(set().union(*runs.values()))
    out = []
    for name in names:
        seen = {label: run.get(name, "absent") for label, run in runs.items()}
        if len(set(seen.values())) > 1:
            out.append((name, seen))
    return out


def verl_commit(explicit: str | None) -> tuple[str, str]:
    version = importlib.metadata.version("verl")
    if explicit:
        return explicit, f"given with --commit (installed verl {version})"
    if version not in PIN_COMMITS:
        raise SystemExit(
            f"installed verl {version}: no commit known for it (known: {sorted(PIN_COMMITS)}). Pass --commit with the "
            "verl commit the wheel was cut from (its tag; without one, the commit where most of the wheel's files "
            "match by blob hash), and add it to PIN_COMMITS")
    commit, why = PIN_COMMITS[version]
    return commit, f"verl {version}: {why}"


def extract_tests(verl_git: Path, commit: str, work: Path) -> Path:
    """verl's ``tests/`` at ``commit`` in ``work/verl`` (the checkout layout its tests expect)."""
    root = work / "verl"
    if not (root / "tests").exists():
        root.mkdir(parents=True, exist_ok=True)
        archive = subprocess.run(["git", f"--git-dir={verl_git}", "archive", commit, "tests"],
                                 capture_output=True, check=False)
        if archive.returncode:
            raise SystemExit(f"git archive {commit} tests from {verl_git}: {archive.stderr.decode()[-500:]}")
        subprocess.run(["tar", "-x", "-C", str(root)], input=archive.stdout, check=True)
    (root / "pytest.ini").write_text("[pytest]\npython_files = *_on_cpu.py\n")
    installed = Path(importlib.util.find_spec("verl").origin).parent
    for shim in REPO_PATH_SHIMS:
        link = root / "verl" / shim
        if (installed / shim).exists() and not link.exists():
            link.parent.mkdir(parents=True, exist_ok=True)
            link.symlink_to(installed / shim)
    return root


def nodist_python(work: Path) -> Path:
    """A venv on this interpreter with every site-packages entry of this one but verl-mopd's (linked)."""
    venv = work / "venv_nodist"
    python = venv / "bin" / "python"
    if not python.exists():
        subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
        ours = Path(sysconfig.get_paths()["purelib"])
        theirs = Path(subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                                     capture_output=True, text=True, check=True).stdout.strip())
        for entry in ours.iterdir():
            if not entry.name.startswith(OURS) and not (theirs / entry.name).exists():
                (theirs / entry.name).symlink_to(entry)
    check = subprocess.run([str(python), "-c", "import importlib.util, importlib.metadata as m; "
                            "print(importlib.util.find_spec('verl_mopd') is None, "
                            "[e.name for e in m.entry_points(group='verl.plugins')])"],
                           capture_output=True, text=True, check=True, cwd=work,
                           env={k: v for k, v in os.environ.items() if k != "PYTHONPATH"}).stdout.strip()
    if check != "True []":
        raise SystemExit(f"{venv}: verl-mopd is still visible there ({check}); delete the folder and rerun")
    return python


def run_condition(condition: str, root: Path, work: Path, pytest_args: list[str], addons: list[str]) -> Path:
    python = nodist_python(work) if condition == "nodist" else Path(sys.executable)
    env = {**os.environ, "PYTHONDONTWRITEBYTECODE": "1", "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
           "TORCH_COMPILE_DISABLE": "1", "TORCHINDUCTOR_DISABLE": "1", "CUDA_VISIBLE_DEVICES": "",
           "RAY_OVERRIDE_RESOURCES": os.environ.get("RAY_OVERRIDE_RESOURCES", json.dumps({"CPU": 128})),
           "RAY_DISABLE_USAGE_STATS": "1", "PYTHONPATH": os.pathsep.join(addons)}
    env.pop("VERL_USE_EXTERNAL_PLUGINS", None)
    env.pop("VERL_USE_EXTERNAL_MODULES", None)
    if condition == "envnone":
        env["VERL_USE_EXTERNAL_PLUGINS"] = "none"
    junit = work / f"junit.{condition}.xml"
    log = work / f"pytest.{condition}.log"
    command = [str(python), "-m", "pytest", "-p", "no:cacheprovider", "-q", "-rA", "--continue-on-collection-errors",
               f"--junitxml={junit}", *pytest_args]
    print(f"[{condition}] {' '.join(command)}  (log: {log})", flush=True)
    with open(log, "w", encoding="utf-8") as out:
        done = subprocess.run(command, cwd=root, env=env, stdout=out, stderr=subprocess.STDOUT, check=False)
    if not junit.exists():
        raise SystemExit(f"[{condition}] pytest wrote no junit XML (exit {done.returncode}); see {log}")
    return junit


def _has(module: str, addons: list[str]) -> bool:
    probe = subprocess.run([sys.executable, "-c", f"import {module}"], capture_output=True, check=False,
                           env={**os.environ, "PYTHONPATH": os.pathsep.join(addons)})
    return probe.returncode == 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--verl-git", required=True, type=Path, help="a git folder of github.com/verl-project/verl")
    parser.add_argument("--commit", help="the verl commit whose tests to run (default: PIN_COMMITS of the installed verl)")
    parser.add_argument("--work", type=Path, default=Path("/tmp/verl_suite"), help="folder for the tests, venv and runs")
    parser.add_argument("--conditions", default="with,nodist", help=f"comma-separated, from {list(CONDITIONS)}")
    parser.add_argument("--addons", action="append", default=[], help="a folder put on PYTHONPATH (pytest-asyncio, ...)")
    parser.add_argument("--timeout", type=int, help="per-test timeout in seconds (needs pytest-timeout)")
    parser.add_argument("paths", nargs="*", default=["tests/"], help="pytest paths or ids inside verl's checkout")
    args = parser.parse_args(argv)
    conditions = args.conditions.split(",")
    if len(conditions) < 2 or not set(conditions) <= set(CONDITIONS) or "with" not in conditions:
        parser.error(f"--conditions {args.conditions!r}: 'with' and at least one of 'nodist', 'envnone'")
    addons = [str(Path(a).resolve()) for a in args.addons]
    work = args.work.resolve()
    work.mkdir(parents=True, exist_ok=True)
    commit, why = verl_commit(args.commit)
    print(f"verl tests at {commit}: {why}", flush=True)
    root = extract_tests(args.verl_git, commit, work)
    pytest_args = []
    if _has("pytest_asyncio", addons):
        pytest_args.append("--asyncio-mode=auto")
    else:
        print("warning: pytest-asyncio is not importable (pass --addons): verl's async tests fail alike in every "
              "condition", flush=True)
    if args.timeout:
        if not _has("pytest_timeout", addons):
            parser.error("--timeout needs pytest-timeout (pass --addons)")
        pytest_args.append(f"--timeout={args.timeout}")
    runs = {c: outcomes(run_condition(c, root, work, [*pytest_args, *args.paths], addons)) for c in conditions}
    for label, run in runs.items():
        counts = Counter(run.values())
        print(f"{label:>8}: {len(run)} tests, " + ", ".join(f"{counts[k]} {k}" for k in ("passed", "failed", "error",
                                                                                       "skipped")))
    diff = differences(runs)
    print(f"tests whose outcome differs: {len(diff)}")
    for name, seen in diff:
        print(f"  {name}  " + "  ".join(f"{label}={outcome}" for label, outcome in seen.items()))
    return 1 if diff else 0


if __name__ == "__main__":
    sys.exit(main())
