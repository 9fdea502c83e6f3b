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

__all__ = ["PackageStatus", "attention_backend", "gpu_stack_status", "print_attention_backend", "print_gpu_stack"]


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


#: TE's module that holds ``FlashAttentionUtils`` (its accepted flash-attn versions)
_TE_ATTENTION_UTILS = "transformer_engine/pytorch/attention/dot_product_attention/utils.py"


def _te_flash_window(files=None) -> tuple[str, str] | None:
    """Transformer Engine's accepted flash-attn versions as ``(">=min,<=max", ">=min_blackwell,<=max")``, read
    from the installed TE's source text (not imported); None without TE."""
    import re

    try:
        files = md.files("transformer-engine") if files is None else files
    except md.PackageNotFoundError:
        return None
    source = next((f for f in files or [] if str(f).replace("\\", "/").endswith(_TE_ATTENTION_UTILS)), None)
    if source is None:
        return None
    text = source.read_text() if hasattr(source, "read_text") else str(source)
    found = dict(re.findall(r'^\s+(version_required|version_required_blackwell|max_version) = PkgVersion\("([^"]+)"\)',
                            text, re.MULTILINE))
    if len(found) < 3:
        return None
    return (f">={found['version_required']},<={found['max_version']}",
            f">={found['version_required_blackwell']},<={found['max_version']}")


def attention_backend(installed=_installed, window=_te_flash_window) -> tuple[str, str]:
    """``(status, line)``: which attention backend Transformer Engine will use for verl's Megatron engine, which
    asks for ``flash`` (``attention_backend: flash``). Status ``ok`` (FlashAttention inside TE's window, or
    flash-attn-3), ``none`` (TE installed, no backend: every Megatron forward raises "No dot product attention
    backend is available") or ``n/a`` (no Transformer Engine: a CPU machine, where Megatron-Core runs its
    local attention). Reads metadata and TE's source text only."""
    te = installed("transformer-engine")
    fa, fa3 = installed("flash-attn"), installed("flash-attn-3")
    if te is None:
        return "n/a", ("  [n/a] attention backend: none, not applicable (Transformer Engine is not installed: a CPU "
                       f"machine; flash-attn {fa or 'not installed'}); on a GPU node verl's Megatron engine asks "
                       f"TE for flash (flash-attn {gpu_stack.FLASH_ATTN})")
    win = window()
    if fa3 is not None:
        return "ok", f"  [ok] attention backend: flash, FlashAttention 3 (flash-attn-3 {fa3}; Transformer Engine {te})"
    if fa is not None and win is not None:
        try:
            v = Version(fa)
            inside = v in SpecifierSet(win[0])
            blackwell = v in SpecifierSet(win[1])
        except InvalidVersion:
            inside = blackwell = False
        if inside:
            note = "" if blackwell else f"; not on Blackwell, where TE takes {win[1]}"
            return "ok", (f"  [ok] attention backend: flash, FlashAttention 2 (flash-attn {fa} inside Transformer "
                          f"Engine {te}'s window {win[0]}{note})")
    where = f"window {win[0]}" if win else "window unknown (its FlashAttentionUtils not found)"
    return "none", (f"  [NONE] attention backend: none. verl's Megatron engine asks Transformer Engine {te} for flash, "
                    f"which takes flash-attn {where} or flash-attn-3; installed: flash-attn {fa or 'none'}. Every "
                    f"Megatron forward raises 'No dot product attention backend is available': install flash-attn=="
                    f"{gpu_stack.FLASH_ATTN} (README \"GPU install\", step 3)")


def print_attention_backend(out=None, status: tuple[str, str] | None = None) -> bool:
    """Print the attention-backend row; False only when TE is installed without a backend it accepts."""
    state, line = attention_backend() if status is None else status
    print(line, file=out or sys.stdout)
    return state != "none"
