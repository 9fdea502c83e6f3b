"""A colocated teacher's weights between its calls: ``resident``, ``pinned`` or ``pageable``.

verl 0.9.1 offloads a forward-only Megatron model (not DDP-wrapped) parameter by parameter with
``param.data = param.data.to("cpu")`` and loads it back with ``param.data.to(device)``
(``verl.utils.megatron_utils.offload_megatron_model_to_cpu`` / ``load_megatron_model_to_gpu``, the
"ref module" branch): a fresh pageable host tensor every step, and a pageable host-to-device copy.
For DDP models the same functions reuse one pinned ``cpu_data`` buffer per bucket, allocated once
(``torch.empty(..., pin_memory=True)``, then ``copy_``). :class:`HostWeights` applies that DDP
scheme to each tensor of a forward-only teacher (``pinned``), keeps verl's ref behaviour
(``pageable``), or leaves the weights where they are (``resident``), and counts every copy by the
host memory it goes through (:attr:`HostWeights.counts`).
"""

from __future__ import annotations

from collections.abc import Iterable

import torch

__all__ = ["HostWeights", "resolve_policy"]


def resolve_policy(weights: str, offload: bool) -> str:
    """The policy a worker applies: ``resident`` when it does not offload at all (a dedicated or CPU
    teacher); ``auto`` not resolved by a plan falls back to ``pinned`` (the plan's own fallback)."""
    if not offload:
        return "resident"
    return "pinned" if weights == "auto" else weights


class HostWeights:
    """Move ``tensors`` (a model's parameters and buffers) off ``device`` and back, by ``policy``.

    Args:
        tensors: the tensors whose ``.data`` moves (``torch.nn.Parameter`` or buffers).
        device: where they compute.
        policy: ``resident`` (never moved), ``pinned`` (one host buffer per tensor, allocated once,
            page-locked when CUDA is available, copied into with ``copy_``), ``pageable`` (verl's
            forward-only way: a fresh host tensor each offload).
        pin: page-lock the pinned buffers (default: when CUDA is available; a CPU run cannot).

    ``counts``: ``pageable_copies`` (copies from or into a host tensor allocated for that copy),
    ``pinned_copies`` (copies from or into a reused buffer), ``host_allocations``, ``bytes`` moved.
    """

    POLICIES = ("resident", "pinned", "pageable")

    def __init__(self, tensors: Iterable[torch.Tensor], device, policy: str, pin: bool | None = None):
        if policy not in self.POLICIES:
            raise ValueError(f"weights={policy!r}: allowed values are {list(self.POLICIES)}")
        self.tensors = list(tensors)
        self.device = torch.device(device)
        self.policy = policy
        self.pin = torch.cuda.is_available() if pin is None else pin
        self.buffers: list[torch.Tensor | None] = [None] * len(self.tensors)
        self.counts = {"pageable_copies": 0, "pinned_copies": 0, "host_allocations": 0, "bytes": 0}

    def _moved(self, kind: str, t: torch.Tensor) -> None:
        self.counts[kind] += 1
        self.counts["bytes"] += t.numel() * t.element_size()

    @torch.no_grad()
    def offload(self) -> None:
        """Weights to host memory (nothing for ``resident``)."""
        if self.policy == "resident":
            return
        for i, t in enumerate(self.tensors):
            if self.policy == "pageable":
                t.data = t.data.to("cpu", copy=True)  # verl: param.data = param.data.to("cpu")
                self.counts["host_allocations"] += 1
                self._moved("pageable_copies", t)
                continue
            buf = self.buffers[i]
            if buf is None:  # once per tensor, as verl's DDP cpu_data
                buf = torch.empty(t.shape, dtype=t.dtype, device="cpu", pin_memory=self.pin)
                self.buffers[i] = buf
                self.counts["host_allocations"] += 1
            buf.copy_(t.data)  # synchronous: the device copy is freed next
            t.data = buf
            self._moved("pinned_copies", t)

    @torch.no_grad()
    def load(self) -> None:
        """Weights back on ``device`` (nothing for ``resident``)."""
        if self.policy == "resident":
            return
        kind = "pinned_copies" if self.policy == "pinned" else "pageable_copies"
        for t in self.tensors:
            t.data = t.data.to(self.device, non_blocking=self.policy == "pinned", copy=True)
            self._moved(kind, t)
        if self.device.type == "cuda":
            torch.cuda.current_stream().synchronize()
