"""What every resident plan shares: device resolution and strict input checks."""

from __future__ import annotations

import math

import torch

from drift.errors import PlanError


def resolve_device(device: torch.device | str | None) -> torch.device:
    """The plan's device, with an explicit index for CUDA (so equality with a tensor's device holds)."""
    device = torch.device("cpu") if device is None else torch.device(device)
    if device.type == "cuda" and device.index is None:
        device = torch.device("cuda", torch.cuda.current_device())
    return device


def complex_dtype(dtype: torch.dtype) -> torch.dtype:
    """The complex dtype of the real precision ``dtype`` (float32 or float64), else ValueError."""
    if dtype == torch.float32:
        return torch.complex64
    if dtype == torch.float64:
        return torch.complex128
    raise ValueError(f"dtype must be torch.float32 or torch.float64 (the real precision), got {dtype}")


def check_input(
    t: torch.Tensor,
    what: str,
    rank: int,
    shape: tuple[int, ...],
    dtype: torch.dtype,
    device: torch.device,
    strict: bool,
) -> torch.Tensor:
    """``t`` if it is ``(*batch, *shape)`` of ``dtype`` on ``device``, else PlanError naming both.

    A non-strict plan converts another floating dtype of the same kind (real or complex) or another
    device; the shape is checked either way.
    """
    d = len(shape)
    if t.dim() < d or tuple(t.shape[t.dim() - d :]) != shape:
        raise PlanError(
            f"{what} on rank {rank} expected shape (*batch, {', '.join(map(str, shape))}), got {tuple(t.shape)}"
        )
    if t.dtype == dtype and t.device == device:
        return t
    same_kind = t.is_complex() == dtype.is_complex and (t.is_floating_point() or t.is_complex())
    if strict or not same_kind:
        raise PlanError(f"{what} on rank {rank} expected dtype {dtype} on {device}, got {t.dtype} on {t.device}")
    return t.to(device=device, dtype=dtype)


class Workspace:
    """Resident work buffers for the passes that autograd does not record, one per (stage, role).

    Reusing them spares the page faults of fresh multi-gigabyte allocations on every call. A buffer
    grows when a larger one is asked for and serves smaller requests (a last, shorter chunk) as a view.
    Buffers are ordinary tensors even when first made under ``torch.inference_mode``, so later calls
    outside it can still write them.
    """

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self._buffers: dict[tuple, torch.Tensor] = {}

    def get(self, key: tuple, shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
        numel = math.prod(shape)
        buf = self._buffers.get(key)
        if buf is None or buf.dtype != dtype or buf.numel() < numel:
            self._buffers.pop(key, None)
            with torch.inference_mode(False):
                buf = torch.empty(numel, dtype=dtype, device=self.device)
            self._buffers[key] = buf
        return buf[:numel].view(shape)
