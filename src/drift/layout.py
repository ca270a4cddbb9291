"""Where the blocks of a sharded field live: a DeviceMesh, DTensor placements, ``torch.chunk`` blocks.

A global extent N split over P ranks follows ``torch.chunk``, as DTensor's ``Shard`` does: blocks of
ceil(N/P) elements in rank order, the last non-empty one shorter, trailing ones possibly empty. A
``Layout`` says which mesh dim splits each transformed dim of a field; it owns every block computation
and the padded collectives that uneven blocks need (the pad, the collective through ``drift.comm``, the
unpad), so no other module repeats them.
"""

from __future__ import annotations

import datetime
import itertools
import math
import operator
from collections.abc import Sequence
from typing import NamedTuple

import torch
from torch.distributed.tensor import DTensor, Partial, Replicate, Shard
from torch.nn import functional as F

from drift import comm
from drift.errors import PlanError


def chunk_slice(n: int, parts: int, index: int) -> slice:
    """The slice of ``range(n)`` that block ``index`` of ``parts`` holds (``torch.chunk``'s blocks)."""
    step = -(-n // parts)
    start = min(index * step, n)
    return slice(start, min(start + step, n))


def chunk_sizes(n: int, parts: int) -> list[int]:
    """Extents of the ``parts`` blocks of ``n`` elements."""
    return [s.stop - s.start for s in (chunk_slice(n, parts, q) for q in range(parts))]


def nested_chunk(n: int, parts: Sequence[int], coords: Sequence[int]) -> slice:
    """The slice of ``range(n)`` held by coordinates ``coords`` when ``n`` is chunked over each of
    ``parts`` in turn (DTensor's nested ``Shard`` of one dim over several mesh dims)."""
    start, stop = 0, n
    for p, c in zip(parts, coords, strict=True):
        s = chunk_slice(stop - start, p, c)
        start, stop = start + s.start, start + s.stop
    return slice(start, stop)


def _mesh_shape(mesh) -> tuple[int, ...]:
    return () if mesh is None else tuple(mesh.shape)


class Layout:
    """The transformed dims ``(N1, ..., Nd)`` of a field and the mesh dims that split them.

    Args:
        global_shape: the global extents of the transformed dims.
        mesh: a ``DeviceMesh`` of any number of dims, or None (one device, nothing split).
        placements: one per mesh dim, describing a field of shape ``global_shape`` as a DTensor would:
            ``Shard(i)`` splits transformed dim i (negative i counts from the last) in ``torch.chunk``
            blocks; ``Replicate()`` leaves the field whole along that mesh dim (its ranks compute the
            same). One dim split over two mesh dims and ``Partial`` are not supported.
        reduction: how the shares of a flat dim are summed and joined (``reduce_scatter_shares``,
            ``all_gather_shares``) over the ranks that share the field: None, one collective per spatial
            mesh dim; or a ``reduction_mesh`` over those ranks whose consecutive dims split each spatial
            mesh dim in turn (a slab of 32 as ``(8, 4)``, a 16 x 4 pencil as ``(4, 4, 2, 2)``), one
            collective per dim of it. It changes neither the blocks nor the shares, nor the bytes sent;
            layouts that differ only in it are equal.

    Attributes: ``axes`` (per dim, the mesh dim splitting it or None), ``parts`` (ranks per dim),
    ``coords`` (this rank's block index per dim), ``local_slices``, ``local_shape``,
    ``spatial_axes`` (the mesh dims that split some dim, in mesh order).
    """

    def __init__(
        self, global_shape: Sequence[int], mesh=None, placements: Sequence | None = None, reduction=None
    ) -> None:
        if any(isinstance(n, bool) or not hasattr(n, "__index__") for n in global_shape):
            raise ValueError(f"global_shape {tuple(global_shape)} needs integer extents")
        self.global_shape = tuple(operator.index(n) for n in global_shape)
        d = len(self.global_shape)
        if d == 0 or any(n < 1 for n in self.global_shape):
            raise ValueError(f"global_shape {self.global_shape} needs at least one dim, every extent positive")
        self.mesh = mesh
        mesh_shape = _mesh_shape(mesh)
        if placements is None:
            placements = (Replicate(),) * len(mesh_shape)
        placements = tuple(placements)
        if len(placements) != len(mesh_shape):
            raise ValueError(f"placements {placements} need one entry per dim of the mesh {mesh_shape}")
        axes: list[int | None] = [None] * d
        for axis, p in enumerate(placements):
            if isinstance(p, Partial):
                raise ValueError(f"mesh dim {axis}: Partial placements are not supported (reduce first)")
            if isinstance(p, Replicate):
                continue
            if not isinstance(p, Shard):
                raise ValueError(f"mesh dim {axis}: unsupported placement {p!r}")
            if not -d <= p.dim < d:
                raise ValueError(f"mesh dim {axis}: Shard({p.dim}) is out of range for {d} transformed dims")
            dim = p.dim % d
            if axes[dim] is not None:
                raise ValueError(
                    f"transformed dim {dim} is split over mesh dims {axes[dim]} and {axis}: one dim over "
                    "several mesh dims is not supported"
                )
            axes[dim] = axis
        self.placements = tuple(
            Shard(axes.index(axis)) if axis in axes else Replicate() for axis in range(len(mesh_shape))
        )
        self.axes = tuple(axes)
        self.parts = tuple(1 if a is None else mesh_shape[a] for a in axes)
        coordinate = (0,) * len(mesh_shape) if mesh is None else tuple(mesh.get_coordinate())
        self.coordinate = coordinate
        self.coords = tuple(0 if a is None else coordinate[a] for a in axes)
        self.spatial_axes = tuple(sorted(a for a in axes if a is not None))
        for axis in self.spatial_axes:
            lines = mesh.mesh.movedim(axis, -1).reshape(-1, mesh_shape[axis])
            if bool((lines.diff() <= 0).any()):
                raise ValueError(
                    f"mesh dim {axis} of the mesh of ranks {mesh.mesh.tolist()} lists them out of increasing "
                    "order: drift's collectives order a group's blocks by rank, so a mesh dim that splits the "
                    "field must list its ranks in increasing order"
                )
        self.local_slices = self.slices(self.coords)
        self.local_shape = tuple(s.stop - s.start for s in self.local_slices)
        if reduction is not None:
            ranks = field_ranks(mesh, self.spatial_axes).flatten().tolist() if mesh is not None else [0]
            if reduction.mesh.flatten().tolist() != ranks:
                raise ValueError(
                    f"reduction mesh over ranks {reduction.mesh.flatten().tolist()} does not span, in order, the "
                    f"ranks {ranks} that share this rank's field: make it with drift.reduction_mesh"
                )
            split_reduction(tuple(reduction.shape), [self.axis_size(a) for a in self.spatial_axes])
        self.reduction = reduction

    def __repr__(self) -> str:
        reduction = "" if self.reduction is None else f", reduction={tuple(self.reduction.shape)}"
        return (
            f"Layout(global_shape={self.global_shape}, mesh={_mesh_shape(self.mesh)}, "
            f"placements={self.placements}{reduction})"
        )

    def __eq__(self, other) -> bool:
        return (
            isinstance(other, Layout)
            and self.global_shape == other.global_shape
            and self.mesh == other.mesh
            and self.placements == other.placements
        )

    def __hash__(self) -> int:
        return hash((self.global_shape, self.placements))

    @property
    def size(self) -> int:
        """The number of ranks sharing one field (the product of the spatial mesh dims)."""
        return math.prod(self.parts)

    def slices(self, coords: Sequence[int]) -> tuple[slice, ...]:
        """Global index slices of the block at per-dim block indices ``coords``."""
        return tuple(chunk_slice(n, p, c) for n, p, c in zip(self.global_shape, self.parts, coords, strict=True))

    def blocks(self) -> list[tuple[slice, ...]]:
        """The slices of every block, in row-major order of the per-dim block indices."""
        return [self.slices(c) for c in itertools.product(*(range(p) for p in self.parts))]

    def group(self, axis: int):
        """The process group of the ranks that differ from this one only along mesh dim ``axis``."""
        return self.mesh.get_group(axis)

    def axis_size(self, axis: int) -> int:
        return self.mesh.size(axis)

    # Collectives over the spatial mesh dims (one per dim, outermost first).

    def all_reduce(self, x: torch.Tensor, *, replicated_grad: bool = False) -> torch.Tensor:
        """The sum of ``x`` over the ranks that share the field, on each of them. Its backward sums the
        per-rank gradients (torch.distributed's convention), or with ``replicated_grad`` passes the
        gradient through (DTensor's: a Replicate result's gradient is already whole on every rank)."""
        reduce = comm.sum_to_replicated if replicated_grad else comm.all_reduce
        for axis in self.spatial_axes:
            x = reduce(x, group=self.group(axis))
        return x

    def replicate(self, x: torch.Tensor) -> torch.Tensor:
        """``x`` unchanged, for a tensor that every rank sharing the field holds alike; its backward
        sums the gradient over those ranks (``comm.replicate``)."""
        for axis in self.spatial_axes:
            x = comm.replicate(x, group=self.group(axis))
        return x

    # Uneven shards of a flat dim over the spatial mesh dims (the retained modes' shares).

    def share_slice(self, n: int, coordinate: Sequence[int] | None = None) -> slice:
        """The share of ``range(n)`` a rank holds when ``n`` is chunked over the spatial mesh dims in
        mesh order (a nested ``Shard``); this rank's unless ``coordinate`` (mesh coordinates) is given."""
        coordinate = self.coordinate if coordinate is None else coordinate
        axes = self.spatial_axes
        return nested_chunk(n, [self.axis_size(a) for a in axes], [coordinate[a] for a in axes])

    def share_placements(self, dim: int) -> tuple:
        """DTensor placements of a tensor whose ``dim`` holds the shares (``share_slice``)."""
        return tuple(Shard(dim) if a in self.spatial_axes else Replicate() for a in range(len(self.placements)))

    def reduce_scatter_shares(self, x: torch.Tensor) -> torch.Tensor:
        """``x``: ``(b, n, *rest)`` on every spatial rank; returns ``(b, m, *rest)``, this rank's share
        (``share_slice(n)``) of the sum over the spatial ranks. Per spatial mesh dim, outermost first,
        the shares of that dim padded to equal blocks, then one reduce-scatter per reduction mesh dim
        that splits it, the last first (without a reduction mesh: one over the mesh dim). The bytes
        are those of one reduce-scatter per mesh dim, the latency steps sum(P_i - 1) over the
        reduction mesh dims. Differentiable (adjoint: ``all_gather_shares``)."""
        for axis, levels in self._reduction_levels():
            b, n, rest = x.shape[0], x.shape[1], x.shape[2:]
            parts = self.axis_size(axis)
            c = -(-n // parts)
            padded = x if parts * c == n else F.pad(x, (0, 0) * (x.dim() - 2) + (0, parts * c - n))
            blocks = padded.view(b, *(r for r, _ in levels), c, *rest)
            for i in reversed(range(len(levels))):
                ranks, group = levels[i]
                send = blocks.movedim(i + 1, 0).reshape(ranks * b, *blocks.shape[1 : i + 1], c, *rest)
                blocks = comm.reduce_scatter(send, group=group)
            mine = chunk_slice(n, parts, self.coordinate[axis])
            x = blocks[:, : mine.stop - mine.start]
        return x

    def all_gather_shares(self, x: torch.Tensor, n: int) -> torch.Tensor:
        """The inverse of ``reduce_scatter_shares`` without the sum: every rank's share ``(b, m_q, *rest)``
        joined into ``(b, n, *rest)`` on every spatial rank, per spatial mesh dim innermost first, one
        all-gather per reduction mesh dim splitting it, the first first. Differentiable (adjoint:
        ``reduce_scatter_shares``)."""
        extents = []  # the extent each level chunks, outermost first
        for axis in self.spatial_axes:
            extents.append(n)
            s = chunk_slice(n, self.axis_size(axis), self.coordinate[axis])
            n = s.stop - s.start
        for (axis, levels), m in zip(reversed(self._reduction_levels()), reversed(extents), strict=True):
            parts = self.axis_size(axis)
            c = -(-m // parts)
            blocks = x if x.shape[1] == c else F.pad(x, (0, 0) * (x.dim() - 2) + (0, c - x.shape[1]))
            for i, (_, group) in enumerate(levels):
                blocks = comm.all_gather(blocks.unsqueeze(0), group=group).movedim(0, i + 1)
            x = blocks.reshape(x.shape[0], parts * c, *x.shape[2:])[:, :m]
        return x

    def _reduction_levels(self) -> list[tuple[int, list[tuple[int, object]]]]:
        """Per spatial mesh dim, in mesh order: the mesh dim and the ``(ranks, group)`` of each level
        that reduces it, outermost first (the reduction mesh dims that split it, or the mesh dim itself)."""
        if self.reduction is None:
            return [(axis, [(self.axis_size(axis), self.group(axis))]) for axis in self.spatial_axes]
        split = split_reduction(tuple(self.reduction.shape), [self.axis_size(a) for a in self.spatial_axes])
        return [
            (axis, [(self.reduction.size(d), self.reduction.get_group(d)) for d in dims])
            for axis, dims in zip(self.spatial_axes, split, strict=True)
        ]

    def _join_chunks(self, x: torch.Tensor, dim: int, n: int, axis: int) -> torch.Tensor:
        """Every rank's ``torch.chunk`` block of ``n`` along ``dim`` (this rank's is ``x``) joined along
        ``dim`` on every rank of mesh dim ``axis``: one all-gather of blocks padded to the largest."""
        parts = self.axis_size(axis)
        c = -(-n // parts)
        padded = x if c == x.shape[dim] else F.pad(x, (0, 0) * (x.dim() - 1 - dim) + (0, c - x.shape[dim]))
        every = comm.all_gather(padded.unsqueeze(0), group=self.group(axis))
        return torch.cat([every[q].narrow(dim, 0, size) for q, size in enumerate(chunk_sizes(n, parts))], dim=dim)

    # Whole fields (tests and I/O, not the hot path).

    def scatter(self, x_global: torch.Tensor) -> torch.Tensor:
        """This rank's block of the last d dims of ``x_global`` (given on every rank); no communication."""
        d = len(self.global_shape)
        if x_global.dim() < d or tuple(x_global.shape[x_global.dim() - d :]) != self.global_shape:
            raise PlanError(f"scatter expected a tensor ending in {self.global_shape}, got {tuple(x_global.shape)}")
        return x_global[(..., *self.local_slices)].contiguous()

    def gather(self, x_local: torch.Tensor) -> torch.Tensor:
        """The full tensor ``(*batch, N1, ..., Nd)`` on every rank from every rank's block: one
        all-gather of padded blocks per spatial mesh dim."""
        d = len(self.global_shape)
        if x_local.dim() < d or tuple(x_local.shape[x_local.dim() - d :]) != self.local_shape:
            raise PlanError(f"gather expected a local block ending in {self.local_shape}, got {tuple(x_local.shape)}")
        x = x_local
        for dim, axis in enumerate(self.axes):
            if axis is not None:
                x = self._join_chunks(x, x.dim() - d + dim, self.global_shape[dim], axis)
        return x.clone() if x is x_local else x


def split_reduction(shape: Sequence[int], sizes: Sequence[int]) -> list[list[int]]:
    """The dims of a reduction mesh of ``shape`` that split each spatial mesh dim of ``sizes`` in turn
    (consecutive dims whose sizes multiply to it; dims of one rank go along); ValueError if there are none."""
    shape = tuple(shape)
    split, dim = [], 0
    for parts in sizes:
        dims, ranks = [], 1
        while ranks < parts and dim < len(shape):
            dims.append(dim)
            ranks *= shape[dim]
            dim += 1
        if ranks != parts:
            raise ValueError(
                f"reduction {shape} does not split the spatial mesh dims {tuple(sizes)} in turn: consecutive "
                f"entries must multiply to each of them, e.g. {tuple(sizes)} or a refinement of it"
            )
        split.append(dims)
    if split:
        split[-1] += range(dim, len(shape))  # trailing dims of one rank
    return split


def field_ranks(mesh, spatial_axes: Sequence[int]) -> torch.Tensor:
    """The global ranks that share this rank's field: ``mesh.mesh`` at this rank's coordinate on every
    mesh dim but ``spatial_axes``, shaped as those dims."""
    coordinate = mesh.get_coordinate()
    index = tuple(slice(None) if a in spatial_axes else coordinate[a] for a in range(mesh.ndim))
    return mesh.mesh[index]


def reduction_mesh(mesh, spatial_axes: Sequence[int], shape: Sequence[int], *, timeout_s: float = 1800.0):
    """A ``DeviceMesh`` of ``shape`` over the ranks that share this rank's field (the ``spatial_axes`` of
    ``mesh``, in row-major order), whose groups time out after ``timeout_s``: a factorised reduction of
    the shares (``Layout(..., reduction=)``). Consecutive entries of ``shape`` split each spatial mesh
    dim in turn, and within one the last is reduced first, so for a slab on ranks numbered node by node
    ``shape = (nodes, ranks_per_node)`` reduces within each node, then across. Call on every rank;
    ValueError, before any group is made, when ``shape`` does not factor the field's rank count so."""
    from torch.distributed.device_mesh import DeviceMesh

    shape = tuple(shape)
    if not shape or any(isinstance(p, bool) or not isinstance(p, int) or p < 1 for p in shape):
        raise ValueError(f"reduction {shape} needs one or more positive ints")
    spatial_axes = tuple(sorted(spatial_axes))
    split = math.prod(mesh.size(a) for a in spatial_axes)
    if math.prod(shape) != split:
        dims = ", ".join(str(a) for a in spatial_axes) or "none"
        raise ValueError(
            f"reduction {shape} has {math.prod(shape)} ranks but the field is split over {split} "
            f"(mesh dims {dims} of the {tuple(mesh.shape)} mesh): its entries must multiply to {split}"
        )
    split_reduction(shape, [mesh.size(a) for a in spatial_axes])
    if mesh.mesh.numel() != comm.world_size():
        # Every rank must make every group, but a sub-mesh's ranks know only their own fields' groups.
        raise ValueError(
            f"reduction needs a mesh over all {comm.world_size()} ranks, got a sub-mesh of {mesh.mesh.numel()}: "
            "use the whole mesh (its other dims as data-parallel or replicated dims)"
        )
    others = [a for a in range(mesh.ndim) if a not in spatial_axes]
    every_field = mesh.mesh.permute(*others, *spatial_axes).reshape(-1, *shape)
    if any(bool((line.diff() <= 0).any()) for line in every_field.reshape(-1, split)):
        raise ValueError(f"reduction needs the ranks of each field in increasing order in {mesh}")
    groups = comm.mesh_groups(shape, datetime.timedelta(seconds=timeout_s), every_field)
    names = tuple(f"reduction{i}" for i in range(len(shape)))
    ranks = field_ranks(mesh, spatial_axes).reshape(shape)
    return DeviceMesh.from_group(groups, mesh.device_type, ranks, mesh_dim_names=names)


class InputRoles(NamedTuple):
    """What each mesh dim does to a model's inputs ``(batch, channels, *spatial)`` (``input_roles``)."""

    placements: tuple  # the placements, each Shard's dim made non-negative
    data_axes: tuple[int, ...]  # the mesh dims that shard the batch (data parallel)
    spatial_axes: tuple[int, ...]  # the mesh dims that split a spatial dim
    parts: tuple[int, ...]  # ranks per spatial dim


def input_roles(mesh, placements: Sequence, d: int) -> InputRoles:
    """The roles of ``mesh``'s dims for inputs ``(batch, channels, *d spatial dims)`` placed as
    ``placements``, one per mesh dim: each shards the batch (``Shard(0)``) or one spatial dim
    (``Shard(2)`` .. ``Shard(d + 1)``), or is a ``Replicate`` of one rank; ValueError naming the mesh dim
    for anything else."""
    if len(placements) != mesh.ndim:
        raise ValueError(f"placements {tuple(placements)} need one entry per dim of the {tuple(mesh.shape)} mesh")
    data, spatial, seen = [], [], set()
    for axis, p in enumerate(placements):
        if isinstance(p, Shard) and not -(2 + d) <= p.dim < 2 + d:
            raise ValueError(f"mesh dim {axis}: {p!r} is out of range for inputs of {2 + d} dims")
        if isinstance(p, Shard) and p.dim % (2 + d) == 0:
            data.append(axis)
        elif isinstance(p, Shard) and p.dim % (2 + d) >= 2:
            dim = p.dim % (2 + d)
            if dim in seen:
                raise ValueError(f"mesh dim {axis}: spatial dim {dim} is already split by another mesh dim")
            seen.add(dim)
            spatial.append(axis)
        elif isinstance(p, Replicate) and mesh.size(axis) == 1:
            continue
        else:
            raise ValueError(
                f"mesh dim {axis} ({mesh.size(axis)} ranks) has placement {p!r}: each mesh dim must shard the batch "
                f"(Shard(0), data parallel) or a spatial dim (Shard(2) .. Shard({d + 1})) of the input"
            )
    placements = tuple(Shard(p.dim % (2 + d)) if isinstance(p, Shard) else p for p in placements)
    parts = tuple(math.prod(mesh.size(a) for a in spatial if placements[a].dim == 2 + i) for i in range(d))
    return InputRoles(placements, tuple(data), tuple(spatial), parts)


def dtensor_layout(x: DTensor, d: int, *, batch_axes_ok: bool) -> tuple[Layout, tuple[int, ...]]:
    """The ``Layout`` of the last ``d`` dims of the DTensor ``x`` and the mesh dims that shard its dim 0
    (data parallel: allowed only where ``batch_axes_ok``). ValueError naming the dim for placements
    drift cannot use: a sharded leading dim (other than dim 0 where allowed), a Partial placement, a
    transformed dim over two mesh dims; PlanError for a local block that is not the layout's (made by
    hand with ``DTensor.from_local``, not in ``torch.chunk`` blocks)."""
    lead = x.dim() - d
    if lead < 0:
        raise ValueError(f"a DTensor of shape {tuple(x.shape)} has fewer than the {d} transformed dims")
    placements, data_axes = [], []
    for axis, p in enumerate(x.placements):
        if isinstance(p, Shard) and p.dim % x.dim() < lead:
            dim = p.dim % x.dim()
            if batch_axes_ok and dim == 0:
                data_axes.append(axis)
                placements.append(Replicate())
                continue
            what = "the batch dim" if dim == 0 else f"dim {dim}"
            raise ValueError(
                f"mesh dim {axis} shards {what} of a {tuple(x.shape)} DTensor: the spectral transform splits "
                f"only its last {d} dims" + ("" if batch_axes_ok else " (no data-parallel dim here)")
            )
        placements.append(Shard(p.dim % x.dim() - lead) if isinstance(p, Shard) else p)
    layout = Layout(x.shape[lead:], x.device_mesh, placements)
    local = x.to_local()
    if local.shape[lead:] != layout.local_shape:
        raise PlanError(f"expected a block ending in {layout.local_shape}, got shape {tuple(local.shape)}")
    return layout, tuple(data_axes)


def local_block(t: torch.Tensor) -> torch.Tensor:
    """This rank's block of ``t``: a DTensor's local tensor, else ``t`` itself."""
    return t.to_local() if isinstance(t, DTensor) else t


def to_dtensor(local: torch.Tensor, mesh, placements: Sequence, global_shape: Sequence[int]) -> DTensor:
    """``DTensor.from_local`` with the global shape given (uneven shards) and no check collective."""
    shape = torch.Size(global_shape)
    stride = torch.empty(0).new_empty(shape, device="meta").stride()
    return DTensor.from_local(local, mesh, tuple(placements), run_check=False, shape=shape, stride=stride)


def shift_placements(placements: Sequence, lead: int) -> tuple:
    """Placements of a field's transformed dims (``Shard(i)``: transformed dim i) for a tensor with
    ``lead`` leading dims before them."""
    return tuple(Shard(p.dim + lead) if isinstance(p, Shard) else p for p in placements)


def device_mesh(shape: Sequence[int], names: Sequence[str], device_type: str = "cpu", *, timeout_s: float = 1800.0):
    """A row-major ``DeviceMesh`` of ``shape`` over the default group with mesh dims ``names``, whose
    groups time out after ``timeout_s`` (``init_device_mesh`` gives its sub-groups torch's 30-minute
    default instead, so a failed rank would keep its peers waiting that long). Call on every rank."""
    from torch.distributed.device_mesh import DeviceMesh

    shape = tuple(int(p) for p in shape)
    groups = comm.mesh_groups(shape, datetime.timedelta(seconds=timeout_s))
    return DeviceMesh.from_group(
        groups, device_type, torch.arange(comm.world_size()).view(shape), mesh_dim_names=tuple(names)
    )


def grid_mesh(grid: Sequence[int], device_type: str = "cpu", *, timeout_s: float = 1800.0) -> tuple:
    """A ``DeviceMesh`` and the placements that split transformed dim i over ``grid[i]`` ranks (the
    mpi4py-fft style of saying a decomposition): one mesh dim per entry above 1, in dim order (named
    "dim<i>"), whose groups time out after ``timeout_s``. Call on every rank of the default group; its
    size must be ``prod(grid)``. ``(None, ())`` on one process without a process group."""
    grid = tuple(int(p) for p in grid)
    if any(p < 1 for p in grid):
        raise ValueError(f"grid {grid} needs positive entries")
    size = comm.world_size()
    if math.prod(grid) != size:
        raise ValueError(f"grid {grid} has {math.prod(grid)} ranks but the process group has {size}")
    if not comm.is_initialized():
        return None, ()
    split = [(i, p) for i, p in enumerate(grid) if p > 1] or [(0, 1)]
    mesh = device_mesh([p for _, p in split], [f"dim{i}" for i, _ in split], device_type, timeout_s=timeout_s)
    return mesh, tuple(Shard(i) if p > 1 else Replicate() for i, p in split)
