"""Named wall-clock phases, recorded only while a ``profile()`` context is open.

Layers mark their phases with ``phase(name)``; with no profile open it costs one list check. On CUDA
the phase boundaries synchronise the device so that kernel time lands in the right phase.
"""

from __future__ import annotations

import contextlib
import time
from collections import defaultdict
from collections.abc import Iterator

import torch

_active: list[dict[str, float]] = []


@contextlib.contextmanager
def profile() -> Iterator[dict[str, float]]:
    """Collect the seconds spent in each named phase inside the block: ``{name: seconds}``."""
    seconds: dict[str, float] = defaultdict(float)
    _active.append(seconds)
    try:
        yield seconds
    finally:
        _active.remove(seconds)


@contextlib.contextmanager
def phase(name: str) -> Iterator[None]:
    """Attribute the wall time of the block to ``name`` in every open profile."""
    if not _active:
        yield
        return
    synchronize_device()
    start = time.perf_counter()
    yield
    synchronize_device()
    elapsed = time.perf_counter() - start
    for seconds in _active:
        seconds[name] += elapsed


def synchronize_device() -> None:
    """Wait for the current CUDA device's kernels when CUDA is in use (so wall time covers them)."""
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        torch.cuda.synchronize()
