"""A run's numeric precision: float32, or bfloat16 matrix products and aggregation with float32 weights
(``bf16``: the layers under ``torch.autocast``, the weights, the optimizer's state, the loss and attention's
softmax in float32; docs/performance.md, "Precision"); ``auto`` takes bfloat16 where the hardware computes it
natively (a CUDA GPU with bfloat16 support, a CPU with AMX or AVX512-BF16), float32 elsewhere.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from pathlib import Path

import torch


@dataclass(frozen=True)
class Precision:
    name: str = "fp32"  # fp32 or bf16 (resolved)
    reason: str = ""  # why: what the hardware offers

    def autocast(self, device: torch.device):
        """The context the model's forward pass runs in."""
        if self.name != "bf16":
            return contextlib.nullcontext()
        return torch.autocast(device.type, dtype=precision_dtype(self.name))


def precision_dtype(name: str) -> torch.dtype:
    """The dtype of a run's features and products under the resolved precision ``name`` (fp32 or bf16)."""
    return torch.bfloat16 if name == "bf16" else torch.float32


def compute_dtype(x: torch.Tensor) -> torch.dtype:
    """The dtype a layer's products run in: autocast's where it is on for ``x``'s device, else ``x``'s."""
    if torch.is_autocast_enabled(x.device.type):
        return torch.get_autocast_dtype(x.device.type)
    return x.dtype


def sum_dtype(x: torch.Tensor) -> torch.dtype:
    """Sums of half-precision rows are float32 sums."""
    return torch.float32 if x.dtype in (torch.bfloat16, torch.float16) else x.dtype


def cpu_bf16_units() -> list[str]:
    """The CPU's native bfloat16 matrix units: ``amx_bf16`` and/or ``avx512_bf16`` (empty if neither)."""
    probes = {"amx_bf16": "_is_amx_tile_supported", "avx512_bf16": "_is_avx512_bf16_supported"}
    cpu = getattr(torch._C, "_cpu", None)
    return [name for name, probe in probes.items()
            if (getattr(cpu, probe)() if hasattr(cpu, probe) else name in _cpuinfo_flags())]


def _cpuinfo_flags() -> set[str]:
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return set()
    for line in text.splitlines():
        if line.startswith("flags"):
            return set(line.split(":", 1)[1].split())
    return set()


def native_bf16(device: torch.device) -> tuple[bool, str]:
    """Whether ``device`` computes bfloat16 products natively, and what it has."""
    if device.type == "cuda":
        try:
            ok = torch.cuda.is_bf16_supported(including_emulation=False)
        except TypeError:  # older torch: no emulation argument
            ok = torch.cuda.is_bf16_supported()
        name = torch.cuda.get_device_name(device)
        return ok, f"{name} {'has' if ok else 'lacks'} native bfloat16"
    units = cpu_bf16_units()
    if units:
        return True, f"this CPU has {' and '.join(u.upper().replace('_', '-') for u in units)}"
    return False, ("this CPU has neither AMX-BF16 nor AVX512-BF16 (bfloat16 would be emulated: its matrix products run"
            " about ten times slower than float32)")


def resolve_precision(setting: str, device: torch.device) -> Precision:
    """``fp32``, ``bf16`` or ``auto`` (bf16 where ``device`` computes it natively) as a ``Precision``."""
    if setting == "fp32":
        return Precision("fp32", "as configured")
    native, why = native_bf16(device)
    if setting == "bf16":
        return Precision("bf16", why if native else
                         f"as configured, although {why}; precision auto or fp32 avoids that")
    return Precision("bf16" if native else "fp32", f"auto: {why}")
