"""Reading ahead (``Prefetch``): the next batch read in a background thread while the caller's step works
on the current one."""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from types import TracebackType
from typing import Generic, TypeVar

K = TypeVar("K")
V = TypeVar("V")

# How long leaving a Prefetch waits for a read still running (the next batch of a run that stops): a
# read that hangs (a file system that stopped answering) is left to its daemon thread after that.
CLOSE_S = 30.0


class _Reading(threading.Thread):
    """``read(key)`` in a daemon thread; ``result()`` waits for it and returns its value or raises its error."""

    def __init__(self, read: Callable[[K], V], key: K) -> None:
        super().__init__(name="drift-prefetch", daemon=True)
        self._read, self._key = read, key
        self._value: V | None = None
        self._error: BaseException | None = None

    def run(self) -> None:
        try:
            self._value = self._read(self._key)
        except BaseException as exc:  # handed to the thread that asks for the value
            self._error = exc
        finally:
            self._read = self._key = None

    def result(self) -> V:
        self.join()
        if self._error is not None:
            raise self._error
        return self._value


class Prefetch(Generic[K, V]):
    """``read(key)`` for each of ``keys``, in order, one read ahead of the caller.

    ``take()`` returns the next key's value, waiting for its read, then starts the read of the key after
    it in a background (daemon) thread, so that the read runs while the caller works on this value. The
    first read starts at construction. Memory: besides what the caller keeps, at most two values exist at
    once, the one just taken and the one being read. A read's exception is raised by the ``take()`` that
    asks for its value, in the calling thread, never earlier. ``ahead=False``: each read runs inside
    ``take()`` itself, in the calling thread (the same values, nothing in the background).

    ``read`` must not share output buffers between calls (each value is new), and it runs in another
    thread than the caller's: it must be thread-safe against what the caller does meanwhile. Leaving the
    ``with`` block (or ``close()``) waits up to ``close_s`` for a read still running, which then finishes
    alone, its value dropped. Signals reach the main thread only, so a stop request is seen by the caller
    whatever a read does; a read the caller waits on in ``take()`` delays it as a read in the caller would.
    """

    def __init__(
        self, read: Callable[[K], V], keys: Sequence[K], *, ahead: bool = True, close_s: float = CLOSE_S
    ) -> None:
        self._read, self._keys, self._ahead, self._close_s = read, list(keys), ahead, close_s
        self._taken = 0
        self._pending = self._start(0) if ahead else None

    def __len__(self) -> int:
        """Values not yet taken."""
        return len(self._keys) - self._taken

    def _start(self, i: int) -> _Reading | None:
        if i >= len(self._keys):
            return None
        reading = _Reading(self._read, self._keys[i])
        reading.start()
        return reading

    def take(self) -> V:
        """The next key's value (IndexError when every one was taken)."""
        if not len(self):
            raise IndexError(f"all {len(self._keys)} values were taken")
        i, self._taken = self._taken, self._taken + 1
        if not self._ahead:
            return self._read(self._keys[i])
        current, self._pending = self._pending, None
        value = current.result()
        self._pending = self._start(i + 1)
        return value

    def close(self) -> None:
        """Wait up to ``close_s`` for a read still running; no read starts after this."""
        pending, self._pending, self._taken = self._pending, None, len(self._keys)
        if pending is not None:
            pending.join(self._close_s)

    def __enter__(self) -> Prefetch[K, V]:
        return self

    def __exit__(self, kind: type | None, value: BaseException | None, tb: TracebackType | None) -> None:
        self.close()
