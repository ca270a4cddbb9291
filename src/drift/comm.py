"""Collectives: the only module that calls ``torch.distributed``.

Every collective drift issues goes through here, so that ``comm_log`` can count calls and bytes, and
each has an autograd adjoint under torch.distributed's sum convention (the global loss is the sum of
every rank's loss): all-reduce <-> all-reduce, reduce-scatter <-> all-gather.

A group of one rank issues no collective and records nothing; without ``init_process_group`` the
default group is that embedded one-rank group.
"""

from __future__ import annotations

import contextlib
import datetime
import pickle
import time
from collections.abc import Iterator
from dataclasses import dataclass, field

import torch
import torch.distributed as dist

from drift.profiling import synchronize_device


def is_initialized() -> bool:
    """Whether the default process group exists."""
    return dist.is_available() and dist.is_initialized()


def world_size(group=None) -> int:
    """Number of ranks in ``group`` (1 for the embedded default when no process group exists)."""
    if is_initialized():
        return dist.get_world_size(group)
    if group is not None:
        raise RuntimeError("a process group was given but torch.distributed is not initialised")
    return 1


def rank(group=None) -> int:
    """This process's rank in ``group`` (0 for the embedded default)."""
    return dist.get_rank(group) if is_initialized() else 0


# The groups drift made besides the default one (a mesh's, a reduction's): ``set_timeout`` reaches them all.
_groups: list = []


def set_timeout(seconds: float) -> None:
    """From now on, a collective on the default group or on any group drift made (``mesh_groups``) fails
    after ``seconds`` instead of waiting for a peer that does not answer (``ProcessGroup.set_timeout``)."""
    if not is_initialized():
        return
    timeout = datetime.timedelta(seconds=seconds)
    for group in (dist.group.WORLD, *_groups):
        group.set_timeout(timeout)


def mesh_groups(shape: tuple[int, ...], timeout: datetime.timedelta, ranks: torch.Tensor | None = None) -> list:
    """This rank's process group along each dim of a row-major mesh of ``shape``, each created with
    ``timeout`` (call on every rank of the default group). ``ranks``: the global ranks of one or several
    disjoint meshes of ``shape``, ``(m, *shape)``, each line along a dim in increasing order; default
    one mesh over the whole default group. ``init_device_mesh`` gives its sub-groups torch's 30-minute
    default instead, so a rank failing mid-collective would keep its peers waiting that long."""
    ranks = torch.arange(world_size()).view(1, *shape) if ranks is None else ranks
    mine = []
    for dim in range(len(shape)):
        lines = ranks.movedim(dim + 1, -1).reshape(-1, shape[dim])
        for line in lines.tolist():
            group = dist.new_group(line, timeout=timeout)  # every rank creates every group, in order
            if rank() in line:
                mine.append(group)
    _groups.extend(mine)
    return mine


def destroy_process_group() -> None:
    """Leave the default process group and every group made from it (a DeviceMesh's included)."""
    if dist.is_initialized():
        dist.destroy_process_group()
    _groups.clear()


@dataclass(frozen=True)
class Collective:
    """One collective as this rank saw it.

    ``bytes`` is the payload this rank handed to the collective (its input tensor); ``wire_bytes`` is
    what this rank sends under a bandwidth-optimal (ring) algorithm: all-reduce 2(P-1)/P of the
    payload, reduce-scatter and all-to-all (P-1)/P of it, all-gather P-1 times it.
    """

    kind: str
    bytes: int
    wire_bytes: int
    group_size: int
    seconds: float


@dataclass
class CommLog:
    """The collectives issued while a ``comm_log`` context is open."""

    calls: list[Collective] = field(default_factory=list)

    @property
    def bytes(self) -> int:
        """Total payload bytes over all recorded calls."""
        return sum(c.bytes for c in self.calls)

    def kinds(self) -> list[str]:
        """The kinds of the recorded calls, in order."""
        return [c.kind for c in self.calls]


_active_logs: list[CommLog] = []

# torch 2.13 renamed the single-tensor collectives; older releases only have the old names.
_reduce_scatter_single = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor
_all_gather_single = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor


@contextlib.contextmanager
def comm_log() -> Iterator[CommLog]:
    """Record every collective drift issues on this rank inside the ``with`` block."""
    log = CommLog()
    _active_logs.append(log)
    try:
        yield log
    finally:
        _active_logs.remove(log)


@contextlib.contextmanager
def _recorded(kind: str, payload: int, wire: int, size: int) -> Iterator[None]:
    """Time the collective issued inside the block and record it in every open log (on CUDA, between
    device synchronisations while a log is open: NCCL calls return before they finish)."""
    if _active_logs:
        synchronize_device()
    start = time.perf_counter()
    yield
    if _active_logs:
        synchronize_device()
    seconds = time.perf_counter() - start
    for log in _active_logs:
        log.calls.append(Collective(kind, payload, wire, size, seconds))


def _real(x: torch.Tensor) -> torch.Tensor:
    return torch.view_as_real(x) if x.is_complex() else x


def _all_reduce(x: torch.Tensor, group) -> torch.Tensor:
    size = world_size(group)
    out = x.resolve_conj().clone(memory_format=torch.contiguous_format)
    if size > 1:
        n = out.numel() * out.element_size()
        with _recorded("all_reduce", n, 2 * (size - 1) * n // size, size):
            dist.all_reduce(_real(out), group=group)
    return out


def _reduce_scatter(x: torch.Tensor, group) -> torch.Tensor:
    size = world_size(group)
    if x.shape[0] % size:
        raise ValueError(f"reduce_scatter needs dim 0 ({x.shape[0]}) divisible by the group size {size}")
    if size == 1:
        return x.clone(memory_format=torch.contiguous_format)
    x = x.resolve_conj().contiguous()
    out = x.new_empty(x.shape[0] // size, *x.shape[1:])
    n = x.numel() * x.element_size()
    with _recorded("reduce_scatter", n, (size - 1) * n // size, size):
        if x.device.type == "cpu":
            # Each share goes to its owner, which sums them: the same bytes as Gloo's reduce_scatter, which
            # is slower on local ranks (benchmarks/reduce_scatter.py, docs/benchmarks/clusters.md).
            parts = torch.empty_like(x)
            dist.all_to_all_single(_real(parts), _real(x), group=group)
            torch.sum(_real(parts).view(size, *_real(out).shape), 0, out=_real(out))
        else:
            _reduce_scatter_single(_real(out), _real(x), group=group)
    return out


def _all_gather(x: torch.Tensor, group) -> torch.Tensor:
    size = world_size(group)
    if size == 1:
        return x.clone(memory_format=torch.contiguous_format)
    x = x.resolve_conj().contiguous()
    out = x.new_empty(size * x.shape[0], *x.shape[1:])
    n = x.numel() * x.element_size()
    with _recorded("all_gather", n, (size - 1) * n, size):
        _all_gather_single(_real(out), _real(x), group=group)
    return out


def _all_to_all(x: torch.Tensor, send: list[int], recv: list[int], group, out=None) -> torch.Tensor:
    size = world_size(group)
    x = x.resolve_conj()
    out = x.new_empty(sum(recv)) if out is None else out
    if size == 1:
        return out.copy_(x)
    x = x.contiguous()
    me = rank(group)
    n = x.numel() * x.element_size()
    with _recorded("all_to_all", n, (x.numel() - send[me]) * x.element_size(), size):
        dist.all_to_all_single(_real(out), _real(x), recv, send, group=group)
    return out


def sendrecv(send: torch.Tensor, recv: torch.Tensor, peer: int, *, group=None) -> None:
    """Send ``send`` to rank ``peer`` of ``group`` and receive ``recv`` from it (both contiguous).

    The pairwise exchange of the in-place transposes; not differentiable.
    """
    n = send.numel() * send.element_size()
    dst = dist.get_global_rank(group, peer) if group is not None else peer
    ops = [dist.P2POp(dist.isend, _real(send), dst, group), dist.P2POp(dist.irecv, _real(recv), dst, group)]
    with _recorded("sendrecv", n, n, world_size(group)):
        for work in dist.batch_isend_irecv(ops):
            work.wait()


class _AllToAll(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, send, recv, group):
        ctx.send, ctx.recv, ctx.group = send, recv, group
        return _all_to_all(x, send, recv, group)

    @staticmethod
    def backward(ctx, grad):
        return _AllToAll.apply(grad, ctx.recv, ctx.send, ctx.group), None, None, None


class _Replicate(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, group):
        ctx.group = group
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        return _AllReduce.apply(grad, ctx.group), None


class _AllReduce(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, group):
        ctx.group = group
        return _all_reduce(x, group)

    @staticmethod
    def backward(ctx, grad):
        return _AllReduce.apply(grad, ctx.group), None


class _SumToReplicated(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, group):
        return _all_reduce(x, group)

    @staticmethod
    def backward(ctx, grad):
        if torch.is_grad_enabled():
            # A second derivative's gradient here is each rank's own term, not the whole one the convention
            # assumes: passing it through would drop the other ranks' terms.
            raise RuntimeError(
                "a Replicate DTensor sum (TruncatedFFT's replicated spectrum) is differentiable once: for "
                "second derivatives take the spectrum with sharded=True or from plain tensors"
            )
        return grad, None


class _ReduceScatter(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, group):
        ctx.group = group
        return _reduce_scatter(x, group)

    @staticmethod
    def backward(ctx, grad):
        return _AllGather.apply(grad, ctx.group), None


class _AllGather(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, group):
        ctx.group = group
        return _all_gather(x, group)

    @staticmethod
    def backward(ctx, grad):
        return _ReduceScatter.apply(grad, ctx.group), None


def broadcast(x: torch.Tensor, *, src: int = 0, group=None) -> torch.Tensor:
    """Rank ``src``'s ``x`` on every rank (a new tensor; not differentiable)."""
    out = x.clone()
    size = world_size(group)
    if size > 1:
        n = out.numel() * out.element_size()
        with _recorded("broadcast", n, n if rank(group) == src else 0, size):
            dist.broadcast(_real(out), dist.get_global_rank(group, src) if group is not None else src, group=group)
    return out


def broadcast_object(obj: object, *, src: int = 0) -> object:
    """Rank ``src``'s picklable ``obj`` on every rank of the default group (``obj`` itself on one rank)."""
    if world_size() == 1:
        return obj
    objects = [obj]
    n = len(pickle.dumps(obj)) if rank() == src else 0
    with _recorded("broadcast_object", n, n, world_size()):
        dist.broadcast_object_list(objects, src=src)
    return objects[0]


def all_gather_object(obj: object) -> list:
    """Every rank's picklable ``obj`` in rank order, on every rank of the default group (``[obj]`` on one rank)."""
    size = world_size()
    if size == 1:
        return [obj]
    objects: list = [None] * size
    n = len(pickle.dumps(obj))
    with _recorded("all_gather_object", n, (size - 1) * n, size):
        dist.all_gather_object(objects, obj)
    return objects


def barrier(group=None) -> None:
    """Wait until every rank of ``group`` arrives (nothing to do on one rank)."""
    if world_size(group) > 1:
        dist.barrier(group=group)


def replicate(x: torch.Tensor, *, group=None) -> torch.Tensor:
    """``x`` unchanged, for a tensor held identically on every rank (a replicated parameter).

    Its backward all-reduces the gradient, so each rank's ``.grad`` is the gradient of the global loss
    (the sum of every rank's loss), also under gradient accumulation.
    """
    return _Replicate.apply(x, group)


def all_reduce(x: torch.Tensor, *, group=None) -> torch.Tensor:
    """Sum of ``x`` over the ranks of ``group``, returned on every rank (a new tensor).

    Differentiable: the gradient of each rank's input is the all-reduce of the output gradients.
    """
    return _AllReduce.apply(x, group)


def all_reduce_max(x: torch.Tensor, *, group=None) -> torch.Tensor:
    """Elementwise maximum of a real ``x`` over the ranks of ``group``, on every rank (a new tensor; not
    differentiable)."""
    out = x.clone(memory_format=torch.contiguous_format)
    size = world_size(group)
    if size > 1:
        n = out.numel() * out.element_size()
        with _recorded("all_reduce_max", n, 2 * (size - 1) * n // size, size):
            dist.all_reduce(out, op=dist.ReduceOp.MAX, group=group)
    return out


def sum_to_replicated(x: torch.Tensor, *, group=None) -> torch.Tensor:
    """Sum of ``x`` over the ranks of ``group`` (a new tensor), under DTensor's gradient convention: the
    result is one replicated value whose gradient is already the same whole gradient on every rank, so
    the backward passes it through unchanged (``all_reduce``'s backward sums per-rank contributions)."""
    return _SumToReplicated.apply(x, group)


def reduce_scatter(x: torch.Tensor, *, group=None) -> torch.Tensor:
    """Rank p's share of the sum over ranks: ``x`` is ``(P * c, ...)``; returns ``(c, ...)``.

    Block p of dim 0 of the summed tensor goes to rank p. Differentiable (adjoint: all-gather).
    """
    return _ReduceScatter.apply(x, group)


def all_to_all(
    x: torch.Tensor, send: list[int], recv: list[int], *, group=None, out: torch.Tensor | None = None
) -> torch.Tensor:
    """Exchange pieces of a flat tensor: ``send[q]`` elements of ``x`` (in rank order) go to rank q,
    and ``recv[q]`` elements from rank q fill the returned flat tensor in rank order.

    Differentiable (adjoint: the reverse exchange), unless ``out`` is given: then the result is
    written into ``out`` (a flat buffer of ``sum(recv)`` elements) outside autograd.
    """
    if out is not None:
        return _all_to_all(x, list(send), list(recv), group, out)
    return _AllToAll.apply(x, list(send), list(recv), group)


def all_gather(x: torch.Tensor, *, group=None) -> torch.Tensor:
    """Every rank's ``x`` (``(c, ...)``) concatenated along dim 0 in rank order: ``(P * c, ...)``.

    Differentiable (adjoint: reduce-scatter of the output gradient).
    """
    return _AllGather.apply(x, group)


def init_process_group(
    backend: str, *, timeout_s: float, store: dist.Store | None = None, rank: int = -1, world_size: int = -1
) -> None:
    """Join the default process group on ``backend`` ("gloo" or "nccl"): the one the environment describes
    (``RANK``, ``WORLD_SIZE``, ``MASTER_ADDR``, ``MASTER_PORT``: torchrun's), or as ``rank`` of
    ``world_size`` on ``store`` (``drift.jobs.launch``'s pool); its collectives time out after ``timeout_s``
    seconds."""
    from datetime import timedelta

    dist.init_process_group(
        backend, timeout=timedelta(seconds=timeout_s), store=store, rank=rank, world_size=world_size
    )


def store(
    host: str, port: int, *, timeout_s: float, world_size: int | None = None, is_master: bool = False, prefix: str = ""
) -> dist.Store:
    """A TCP key-value store at ``host:port`` (``is_master``: this process serves it; port 0 then takes a
    free port, ``store.port`` says which) that groups join through ``init_process_group``; its waits time
    out after ``timeout_s``. ``prefix``: the keys of this use of a shared store, apart from an earlier one's."""
    tcp = dist.TCPStore(
        host,
        port,
        world_size,
        is_master=is_master,
        timeout=datetime.timedelta(seconds=timeout_s),
        wait_for_workers=world_size is not None,
    )
    return dist.PrefixStore(prefix, tcp) if prefix else tcp


def backends_available() -> list[str]:
    """The torch.distributed backends of this torch build, of gloo, nccl and mpi."""
    if not dist.is_available():
        return []
    return [b for b in ("gloo", "nccl", "mpi") if getattr(dist, f"is_{b}_available")()]
