"""What every resident plan shares: device resolution, strict input checks, workspaces, and module
conversions (``.to``, ``.double``) that keep complex tensors complex."""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable

import torch

from drift._compat import ConversionHooks
from drift.errors import PlanError


def chunk_bound(bounds: dict[str, int], other: int, device: torch.device) -> int:
    """The bound of a chunk's intermediates in ``bounds`` for ``device``'s type, else ``other``. Under
    ``torch.compile`` always ``other``: the compiler orders the work, and a chunk loop would unroll into
    the graph."""
    return other if torch.compiler.is_compiling() else bounds.get(device.type, other)


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


_COMPLEX = {torch.float16: torch.complex32, torch.float32: torch.complex64, torch.float64: torch.complex128}
_REAL = {c: r for r, c in _COMPLEX.items()}


def real_dtype(dtype: torch.dtype) -> torch.dtype:
    """The real precision of a real or complex floating dtype."""
    return _REAL.get(dtype, dtype)


class ComplexModule(ConversionHooks):
    """A module whose complex parameters and buffers follow conversions as their real precision does.

    torch's ``Module.to(torch.float64)`` casts a complex tensor to a real one (dropping the imaginary
    part) and ``.double()`` leaves it complex64. Here a complex tensor goes wherever ``fn`` sends a real
    tensor of its precision: ``.double()`` or ``.to(torch.float64)`` make complex64 complex128,
    ``.float()`` the reverse, ``.to(device)`` moves it. Where ``fn`` already treats a complex tensor so
    (``to_empty``, ``share_memory``, a move) it applies as it is. Children get the same treatment.
    """

    def _conversion(self, fn: Callable[[torch.Tensor], torch.Tensor]) -> Callable[[torch.Tensor], torch.Tensor]:
        if getattr(fn, "_complex_aware", False):
            return fn

        def apply(t: torch.Tensor) -> torch.Tensor:
            if not t.is_complex():
                return fn(t)
            probe = fn(torch.empty(0, dtype=real_dtype(t.dtype), device=t.device))
            target = probe.dtype if probe.is_complex() else _COMPLEX.get(probe.dtype, t.dtype)
            with warnings.catch_warnings():  # a cast of the empty complex probe to a real dtype warns
                warnings.simplefilter("ignore")
                complex_probe = fn(torch.empty(0, dtype=t.dtype, device=t.device))
            if (complex_probe.dtype, complex_probe.device) == (target, probe.device):
                return fn(t)
            return t.to(device=probe.device, dtype=target)

        apply._complex_aware = True
        return apply


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
    grows when a larger one is asked for and serves smaller requests (a last, shorter chunk) as a view;
    one asked for on another device or in another dtype (after ``module.to``) replaces it. Buffers are
    ordinary tensors even when first made under ``torch.inference_mode``, so later calls outside it can
    still write them. ``empty(shape, dtype, device)`` makes a buffer (default ``torch.empty``;
    ``drift.memory.empty`` for a workspace of one call, whose buffers then go back to the pool).
    """

    def __init__(
        self, empty: Callable[[tuple[int, ...], torch.dtype, torch.device], torch.Tensor] | None = None
    ) -> None:
        self._buffers: dict[tuple, torch.Tensor] = {}
        self._empty = empty or (lambda shape, dtype, device: torch.empty(shape, dtype=dtype, device=device))

    def get(self, key: tuple, shape: tuple[int, ...], dtype: torch.dtype, device: torch.device) -> torch.Tensor:
        if torch.compiler.is_compiling():  # the compiled graph allocates its own intermediates
            return torch.empty(shape, dtype=dtype, device=device)
        numel = math.prod(shape)
        buf = self._buffers.get(key)
        if buf is None or buf.dtype != dtype or buf.device != device or buf.numel() < numel:
            self._buffers.pop(key, None)
            with torch.inference_mode(False):
                buf = self._empty((numel,), dtype, device)
            self._buffers[key] = buf
        return buf[:numel].view(shape)

    def clear(self) -> None:
        self._buffers.clear()

    def buffers(self) -> list[torch.Tensor]:
        """The buffers held now."""
        return list(self._buffers.values())
