"""``verl-mopd check``'s GPU part: each GPU package's installed version against the supported stack.

The supported versions are ``verl_mopd.gpu_stack.SUPPORTED`` (the pins of setup.py's GPU extras
and of the README's three-command GPU install). Reads distribution metadata only: nothing is
imported, so it runs (and says what is missing) on a CPU machine too.
"""

from __future__ import annotations

import importlib.metadata as md
import sys
from dataclasses import dataclass

from packaging.specifiers import SpecifierSet
from packaging.version import InvalidVersion, Version

from verl_mopd import gpu_stack

__all__ = ["PackageStatus", "gpu_stack_status", "print_gpu_stack"]


@dataclass(frozen=True)
class PackageStatus:
    """One row: ``status`` is ``ok``, ``missing`` or ``off`` (installed, outside ``supported``)."""

    name: str
    installed: str | None
    supported: str
    status: str

    def line(self) -> str:
        want = self.supported or "any version"
        if self.status == "missing":
            return f"  [MISSING] {self.name}: not installed (supported {want})"
        tag = "ok" if self.status == "ok" else "OFF"
        return f"  [{tag}] {self.name} {self.installed} (supported {want})"


def _installed(name: str) -> str | None:
    try:
        return md.version(name)
    except md.PackageNotFoundError:
        return None


def gpu_stack_status(installed=_installed, supported: dict[str, str] | None = None) -> list[PackageStatus]:
    """A row per supported GPU package, in ``gpu_stack.SUPPORTED`` order.

    Args:
        installed: distribution name -> installed version or None (default: this environment's metadata).
        supported: distribution -> PEP 440 specifier, "" for any version (default ``gpu_stack.SUPPORTED``).
    """
    rows = []
    for name, spec in (gpu_stack.SUPPORTED if supported is None else supported).items():
        version = installed(name)
        if version is None:
            status = "missing"
        else:
            try:
                # a local build tag (torch 2.11.0+cu130) is the supported release
                status = "ok" if not spec or Version(version).public in SpecifierSet(spec) else "off"
            except InvalidVersion:
                status = "off"
        rows.append(PackageStatus(name, version, spec, status))
    return rows


def print_gpu_stack(out=None, rows: list[PackageStatus] | None = None) -> bool:
    """Print the table and a one-line verdict; True when every supported package is installed and on version."""
    out = out or sys.stdout
    rows = gpu_stack_status() if rows is None else rows
    py = f"{sys.version_info.major}.{sys.version_info.minor}"
    print(f"GPU stack (Python {gpu_stack.PYTHON}; README \"GPU install\"), this is Python {py}"
          f"{'' if py == gpu_stack.PYTHON else ' [OFF]'}:", file=out)
    for row in rows:
        print(row.line(), file=out)
    missing = [r.name for r in rows if r.status == "missing"]
    off = [r.name for r in rows if r.status == "off"]
    if not missing and not off and py == gpu_stack.PYTHON:
        print("  the GPU stack is complete", file=out)
        return True
    parts = ([f"missing: {', '.join(missing)}"] if missing else []) + ([f"off: {', '.join(off)}"] if off else [])
    print(f"  not the supported GPU stack ({'; '.join(parts) or 'Python ' + py}); fine for CPU use", file=out)
    return False
