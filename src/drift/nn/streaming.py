"""An FNO's forward without autograd that streams through memory: one field of ``width`` channels a rank,
which the lift writes and every block overwrites in place.

A forward needs, at the floor, its input, its output and one activation: ``(in + out + width) x bytes x
points`` a rank (``drift.cost.memory``). The streaming forward keeps that and chunk-sized buffers:

- the lift writes the activation, a resident buffer of the FNO's ``Executor``, in the activations'
  precision (``FNO(activations=torch.bfloat16)`` halves it), each chunk of points computed in the
  parameters' precision;
- each plain block ``act(K x + W x + b)`` overwrites its input (``block_in_place``): drift's K reduces the
  field to its retained spectrum (small: modes x channels), after which the inverse runs a slab of the
  first dim at a time (``TruncatedFFT.inverse_slab``), each slab's skip gemm and activation written over
  that slab of the field, which nothing reads again. The dfno methods' K returns a whole field (their transposes
  move it); the block's tail accumulates into it and its activation is written over the input;
- the projection runs a chunk of points at a time into the fresh output (``mlp_unrecorded``).

A block's channel MLP and its skip (neuraloperator's blocks) run on each slab too (``mlp_tail``) before
it is written over the input. Blocks with a norm, a skip that is not linear or dropout in training mode,
complex data and autocast take the executor's other paths.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch

from drift._plan import Workspace, chunk_bound
from drift.layout import Layout
from drift.nn.block import FNOBlock
from drift.nn.chunked import CHUNK_BYTES, OTHER_DEVICES_CHUNK_BYTES, _activate_into, _tail_into, activate_
from drift.nn.mixing import mix_channels
from drift.nn.pointwise import PointwiseLinear
from drift.profiling import phase
from drift.truncated import TruncatedFFT


def _chunk_bytes(device: torch.device) -> int:
    return chunk_bound(CHUNK_BYTES, OTHER_DEVICES_CHUNK_BYTES, device)


def lift_into(
    lift: PointwiseLinear,
    x: torch.Tensor,
    out: torch.Tensor,
    work: Workspace,
    lift_out: PointwiseLinear | None = None,
    act=None,
    coordinates: Callable[[int, int, torch.dtype, torch.device], torch.Tensor] | None = None,
) -> torch.Tensor:
    """``out`` ``(b, width, *spatial)`` (contiguous, any floating dtype) overwritten by ``lift(x)`` for ``x``
    ``(b, in, *spatial)`` (with ``lift_out``: ``lift_out(act(lift(x)))``, neuraloperator's two-layer lift)
    in the lift's precision, a chunk of points at a time, each chunk rounded to ``out``'s dtype as it is
    stored; returns ``out``. ``coordinates(start, stop, dtype, device)``: channels appended to the points
    ``start:stop`` of ``x`` (``drift.nn.embedding.grid_coordinates``), computed a chunk at a time."""
    weight = lift.weight
    if out.dtype == weight.dtype and lift_out is None and coordinates is None:
        return lift(x, out=out)
    flat_x, flat = x.reshape(x.shape[0], x.shape[1], -1), out.view(out.shape[0], out.shape[1], -1)
    hidden = weight.shape[0]
    per_point = x.shape[0] * (lift.weight.shape[1] + hidden + out.shape[1]) * weight.element_size()
    step = max(1, _chunk_bytes(x.device) // per_point)
    for s in range(0, flat.shape[2], step):
        part = flat_x[..., s : s + step].to(weight.dtype)
        if coordinates is not None:
            coords = coordinates(s, s + part.shape[2], weight.dtype, x.device)
            part = torch.cat((part, coords.expand(x.shape[0], -1, -1)), dim=1)
        chunk = lift(part, out=work.get(("lift",), (x.shape[0], hidden, part.shape[2]), weight.dtype, x.device))
        if lift_out is not None:
            activate_(act, chunk)
            shape = (x.shape[0], flat.shape[1], part.shape[2])
            chunk = lift_out(chunk, out=work.get(("lift_out",), shape, weight.dtype, x.device))
        flat[..., s : s + step].copy_(chunk)
    return out


def block_in_place(block: FNOBlock, x: torch.Tensor, layout: Layout, work: Workspace) -> torch.Tensor:
    """``x`` (this rank's block ``(b, width, *layout.local_shape)``, contiguous, outside autograd; float32
    or the activations' lower precision) overwritten by the plain ``block``'s output (``block.plain``),
    computed in the block's precision; returns ``x``. Collectives: the spectral method's, as the block's
    own forward."""
    spectral, skip = block.spectral, block.skip
    act = block.non_linearity if block.activation else None
    plan = spectral.plan(layout)
    if not isinstance(plan, TruncatedFFT):
        return _whole_spectral_output(block, x, layout, act)
    dtype = plan.dtype
    b, c = x.shape[:2]
    with phase("transform"):
        shares = _shares(plan, x, work)
    with phase("multiply"):
        mixed = mix_channels(shares, spectral._local_weight(plan))
        fold = skip.bias is not None and plan.has_constant_mode
        if fold:
            plan.add_constant_(mixed, skip.bias, sharded=True)
    with phase("transform"):
        spectrum = plan.layout.all_gather_shares(mixed.reshape(b * c, *mixed.shape[2:]), plan.mode_shape[0])
    local = layout.local_shape
    n = local[0]
    length = max(1, _chunk_bytes(x.device) // (b * c * (math.prod(local) // max(n, 1)) * dtype.itemsize))
    weight = skip.weight.expand(b, -1, -1)
    for start in range(0, n, length):
        points = slice(start, min(n, start + length))
        shape = (points.stop - points.start, *local[1:])
        target = x[:, :, points]  # a slab of the first dim: each channel's one run of memory
        with phase("transform"):
            y = plan.inverse_slab(spectrum, points, out=work.get(("slab",), (b * c, *shape), dtype, x.device))
        with phase("pointwise+gelu"):
            if x.dtype == dtype:
                xs = target.reshape(b, c, -1)  # a view
            else:
                xs = work.get(("slab_input",), (b, c, *shape), dtype, x.device).copy_(target).view(b, c, -1)
            z = y.view(b, c, -1).baddbmm_(weight, xs)
            if skip.bias is not None and not fold:
                z.add_(skip.bias[None, :, None])
            if block.channel_mlp is not None:
                z = mlp_tail(block, z, xs)  # the block's output, act applied
            elif act is not None and x.dtype != dtype:
                activate_(act, z)
            # Field by field: each is one run of memory in the slab, where a write into the whole strided
            # slab would go through a contiguous temporary.
            for i in range(b):
                for j in range(c):
                    if act is None or x.dtype != dtype or block.channel_mlp is not None:
                        target[i, j].copy_(z[i, j].view(shape))
                    else:
                        _activate_into(act, z[i, j].view(shape), target[i, j])
    return x


def mlp_tail(block: FNOBlock, z: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """A block's output after its fused part, on points of ``(b, width, n)`` slabs: ``act(channel_mlp(act(z))
    + channel_mlp_skip(x))`` (no ``act`` after a model's last block) for ``z = K x + W x + b``; ``z`` is
    overwritten, ``x`` only read."""
    act = block.non_linearity if block.activation else None
    if act is not None:
        activate_(act, z)
    out = block.channel_mlp(z).add_(block.channel_mlp_skip(x))
    if act is not None:
        activate_(act, out)
    return out


def _shares(plan: TruncatedFFT, x: torch.Tensor, work: Workspace) -> torch.Tensor:
    """This rank's share of the retained spectrum of ``x`` ``(b, c, *local)`` (``plan(x, sharded=True)``);
    a field held in lower precision goes through the transform a few channels at a time in the plan's."""
    if x.dtype == plan.dtype:
        return plan(x, sharded=True)
    b, c = x.shape[:2]
    fields = x.reshape(b * c, *x.shape[2:])
    per_field = math.prod(x.shape[2:]) * plan.dtype.itemsize
    step = max(1, _chunk_bytes(x.device) // per_field)
    partial = torch.empty(b * c, *plan.mode_shape, dtype=plan.complex_dtype, device=x.device)
    for s in range(0, b * c, step):
        rows = fields[s : s + step]
        chunk = work.get(("fields",), tuple(rows.shape), plan.dtype, x.device).copy_(rows)
        partial[s : s + step] = plan.partial_spectrum(chunk)
    return plan.layout.reduce_scatter_shares(partial).view(b, c, *plan.share_shape)


def _whole_spectral_output(block: FNOBlock, x: torch.Tensor, layout: Layout, act) -> torch.Tensor:
    """The dfno methods: K's whole output, the tail accumulated into it, the result written over ``x``."""
    skip, dtype = block.skip, block.skip.weight.dtype
    whole = x if x.dtype == dtype else x.to(dtype)
    y = block.spectral.forward_local(whole, layout).contiguous()
    with phase("pointwise+gelu"):
        b, c = x.shape[:2]
        step = max(1, _chunk_bytes(x.device) // (b * 2 * c * dtype.itemsize))
        if block.channel_mlp is not None:
            # z = y + W x + b into y, then the channel MLP's tail a chunk of points at a time over x.
            _tail_into(None, step, whole, y, skip.weight, skip.bias, y)
            flat_y, flat_x, flat = y.view(b, c, -1), whole.view(b, c, -1), x.view(b, c, -1)
            for start in range(0, flat.shape[2], step):
                points = slice(start, start + step)
                flat[..., points] = mlp_tail(block, flat_y[..., points].contiguous(), flat_x[..., points])
            return x
        # z = y + W x + b into y; the activation over x itself where it has the output's dtype.
        over_x = act is not None and whole is x
        _tail_into(act, step, whole, y, skip.weight, skip.bias, x if over_x else y)
        if not over_x:
            x.copy_(y)
    return x
