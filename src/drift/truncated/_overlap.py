"""Collectives overlapped with computation: a tensor's rows in pieces, each piece's collective running
on drift's communication thread while the main thread computes the next piece.

Every rank computes the same pieces in the same order and one thread issues their collectives, so the
ranks issue the same collectives in the same order. The main thread issues no collective while pieces
are in flight: each function here returns only when all of its pieces' collectives have. Torch's
kernels and Gloo's waits release the GIL, so a piece's transfer proceeds while the next one computes.

With one piece nothing runs on the thread: compute, then communicate, as without overlap.
"""

from __future__ import annotations

import concurrent.futures
from collections.abc import Callable

import torch

_executor: concurrent.futures.ThreadPoolExecutor | None = None


def _thread() -> concurrent.futures.ThreadPoolExecutor:
    """drift's one communication thread (started on first use)."""
    global _executor
    if _executor is None:
        _executor = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="drift-comm")
    return _executor


def piece_slices(rows: int, pieces: int) -> list[slice]:
    """``rows`` in ``min(pieces, rows)`` consecutive slices whose lengths differ by at most one, the
    longer first (one empty slice for no rows)."""
    count = max(1, min(pieces, rows))
    base, longer = divmod(rows, count)
    bounds = [i * base + min(i, longer) for i in range(count + 1)]
    return [slice(a, b) for a, b in zip(bounds[:-1], bounds[1:], strict=True)]


def _no_grad(fn: Callable, *args) -> torch.Tensor:
    # Autograd's mode is per thread: the thread's collectives record nothing, as the caller's do not.
    with torch.no_grad():
        return fn(*args)


def _settle(futures: list[concurrent.futures.Future]) -> None:
    """Cancel the pieces not yet started and wait for the running one: after an error the next
    collective must not meet this call's."""
    for f in futures:
        f.cancel()
    concurrent.futures.wait(futures)


def compute_then_send(
    rows: int, pieces: int, compute: Callable[[slice], torch.Tensor], send: Callable[[torch.Tensor], torch.Tensor]
) -> torch.Tensor:
    """``cat([send(compute(s)) for s in piece_slices(rows, pieces)])``: each ``send`` (a collective on
    the piece's result, dim 0 its rows) runs on the communication thread while the next piece computes.
    ``compute`` must return a fresh tensor (the thread reads it while the next piece computes)."""
    slices = piece_slices(rows, pieces)
    if len(slices) == 1:
        return send(compute(slices[0]))
    futures: list[concurrent.futures.Future] = []
    try:
        for s in slices:
            futures.append(_thread().submit(_no_grad, send, compute(s)))
        return torch.cat([f.result() for f in futures])
    except BaseException:
        _settle(futures)
        raise


def receive_then_compute(
    rows: int,
    pieces: int,
    receive: Callable[[slice], torch.Tensor],
    compute: Callable[[slice, torch.Tensor], None],
) -> None:
    """``compute(s, receive(s))`` for each ``s`` of ``piece_slices(rows, pieces)``: every ``receive`` (a
    collective on rows ``s`` of the input) is queued on the communication thread at once, and each piece
    computes as soon as its collective is done, while the later ones proceed."""
    slices = piece_slices(rows, pieces)
    if len(slices) == 1:
        compute(slices[0], receive(slices[0]))
        return
    futures = [_thread().submit(_no_grad, receive, s) for s in slices]
    try:
        for s, f in zip(slices, futures, strict=True):
            compute(s, f.result())
    except BaseException:
        _settle(futures)
        raise
