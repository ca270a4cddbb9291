"""Large CPU tensors reused between calls: a small caching allocator for the tensors drift hands to
autograd (a block's activations, its gradients, the spectral weights' gradients).

On the CPU glibc maps every allocation above its mmap threshold (at most 32 MiB) afresh and the kernel
zero-fills its pages on first touch, so each block-sized tensor of a training step pays its page faults
again on every step (9.5 GB a step for the FNO of ``benchmarks/train_step.py`` before this pool, which
cost more than the step's arithmetic on this project's 2-core VM).

``empty`` hands out the storage of an earlier tensor that nothing references any more (its storage use
count is the pool's own reference alone), so from the second step on these tensors cost no faults. The
pool holds at most what was live at once plus what went unused for ``STALE_TAKES`` requests; CUDA has
its own caching allocator, and small tensors reuse glibc's heap, so both get ``torch.empty``.

``LiveBytes`` is drift's accounting of a computation's memory on a rank: the peak of the bytes of the
tensors it touches while they live (the pool's storages included while handed out), without the
process's start-up or the allocator's slack, for the tests and the estimates of ``drift.cost.memory``.
"""

from __future__ import annotations

import math
import sys
import threading
import weakref
from dataclasses import dataclass

import torch
from torch.distributed.tensor import DTensor
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

from drift._compat import counts_storage_uses, storage_use_count

# Smaller tensors come from glibc's heap without faults. Larger ones fault: above 32 MiB (its largest mmap
# threshold) every time, and down to a few MiB whenever glibc has returned the heap's top to the kernel
# (a training step's 10 MB spectra did).
MIN_BYTES = 2**20
STALE_TAKES = 256  # a free storage not handed out in the last this many requests is released


@dataclass
class _Entry:
    storage: torch.UntypedStorage
    last_take: int
    python_refs: int = 0

    @classmethod
    def new(cls, nbytes: int, device: torch.device, take: int) -> _Entry:
        entry = cls(torch.UntypedStorage(nbytes, device=device), take)
        entry.python_refs = sys.getrefcount(entry.storage)  # the entry's, as is_free counts
        return entry

    def is_free(self) -> bool:
        """Whether nothing but the pool holds the storage: no tensor (a view, a saved tensor, a numpy
        array's base all hold one), and no Python reference to the storage object itself (which
        ``Tensor.untyped_storage()`` returns, the same object for every tensor on it)."""
        tensors_free = storage_use_count(self.storage) == 1
        return tensors_free and sys.getrefcount(self.storage) == self.python_refs


class TensorPool:
    """Storages of large CPU tensors, handed out again once only the pool references them."""

    def __init__(self) -> None:
        self._entries: list[_Entry] = []
        self._takes = 0
        self._lock = threading.Lock()

    def empty(self, shape: tuple[int, ...], dtype: torch.dtype, device: torch.device | str = "cpu") -> torch.Tensor:
        """An uninitialised contiguous ``shape`` tensor of ``dtype`` on ``device`` (not a view: autograd
        treats it as a fresh tensor)."""
        shape, device = tuple(shape), torch.device(device)
        nbytes = math.prod(shape) * dtype.itemsize
        if device.type != "cpu" or nbytes < MIN_BYTES or not counts_storage_uses():
            return torch.empty(shape, dtype=dtype, device=device)
        with self._lock:
            self._takes += 1
            entry = next((e for e in self._entries if e.storage.nbytes() == nbytes and e.is_free()), None)
            if entry is None:
                entry = _Entry.new(nbytes, device, self._takes)
                self._entries.append(entry)
            entry.last_take = self._takes
            # Storages freed in bulk (a list of kept outputs dropped) go back once left unused.
            self._entries = [e for e in self._entries if not (self._stale(e) and e.is_free())]
            return torch.empty(0, dtype=dtype, device=device).set_(entry.storage, 0, shape)

    def _stale(self, entry: _Entry) -> bool:
        return self._takes - entry.last_take > STALE_TAKES

    def empty_cache(self) -> None:
        """Release every storage that nothing but the pool references."""
        with self._lock:
            self._entries = [e for e in self._entries if not e.is_free()]

    def cached_bytes(self) -> int:
        """Bytes the pool holds, in use or free."""
        with self._lock:
            return sum(e.storage.nbytes() for e in self._entries)


_POOL = TensorPool()


def empty(shape: tuple[int, ...], dtype: torch.dtype, device: torch.device | str = "cpu") -> torch.Tensor:
    """``torch.empty(shape, dtype=dtype, device=device)``, from the process's pool for a large CPU tensor
    (not under ``torch.compile``, whose graph allocates its own)."""
    if torch.compiler.is_compiling():
        return torch.empty(shape, dtype=dtype, device=device)
    return _POOL.empty(shape, dtype, device)


def empty_like(t: torch.Tensor) -> torch.Tensor:
    """A contiguous uninitialised tensor of ``t``'s shape, dtype and device (``empty``)."""
    return empty(tuple(t.shape), t.dtype, t.device)


def empty_cache() -> None:
    """Release the pooled storages no tensor uses (as ``torch.cuda.empty_cache`` does for CUDA's)."""
    _POOL.empty_cache()


def cached_bytes() -> int:
    """Bytes held by the process's pool, in use or free."""
    return _POOL.cached_bytes()


class LiveBytes(TorchDispatchMode):
    """A context that follows the bytes of every storage an operation in it reads or writes (on this thread),
    from the first operation that touches it until it is freed: ``live`` now, ``peak`` the most at once.
    A DTensor counts its local block. Storages made outside the context count from their first use in it
    (the caller's input, resident buffers); an operation's internal scratch is not seen. For measurements,
    not production: every operation pays a Python call.

    >>> import torch
    >>> from drift.memory import LiveBytes
    >>> x = torch.ones(1000)
    >>> with LiveBytes() as counted:
    ...     y = x * 2
    ...     del y
    ...     z = x + 1
    >>> counted.peak, counted.live
    (8000, 8000)
    """

    def __init__(self) -> None:
        super().__init__()
        self.live = 0
        self.peak = 0
        self._seen: set[int] = set()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        result = func(*args, **(kwargs or {}))
        for t in tree_leaves((args, kwargs, result)):
            if isinstance(t, torch.Tensor):
                self._touch(t._local_tensor if isinstance(t, DTensor) else t)
        return result

    def _touch(self, t: torch.Tensor) -> None:
        if t.device.type == "meta":
            return
        storage = t.untyped_storage()
        key = id(storage)
        if key in self._seen:
            return
        nbytes = storage.nbytes()
        self._seen.add(key)
        self.live += nbytes
        self.peak = max(self.peak, self.live)
        weakref.finalize(storage, self._freed, key, nbytes)

    def _freed(self, key: int, nbytes: int) -> None:
        self._seen.discard(key)
        self.live -= nbytes
