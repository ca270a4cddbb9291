"""Pointwise maps over points in cache-sized chunks, forward and backward, with no full-size intermediate.

A pointwise map ``y[:, :, j] = f(x[:, :, j])`` (a 1x1-convolution MLP: the FNO's projection) run on a
whole block makes each intermediate, e.g. the projection's 128-channel hidden layer, a tensor of the
block's size: hundreds of MB that glibc maps afresh (and page-faults) on every call, and that autograd
keeps until the backward pass. ``chunked_pointwise`` runs ``f`` on a chunk of points at a time into one
output, keeps only its input for the backward pass, and there recomputes each chunk's intermediates
(activation checkpointing, a chunk at a time) to accumulate the parameters' gradients and write the
input's gradient into one preallocated tensor. ``chunked_mlp`` does so for the real two-layer MLP with
its own backward (GeLU's closed-form derivative, chunk buffers made once per call) instead of autograd
on each chunk.

An FNO block's tail ``act(y + W x + b)`` runs the same way: without autograd it overwrites the spectral
output ``y`` in place (``accumulate_in_place``); recorded, it is one autograd node
(``pointwise_activation``) whose forward and backward each make one full-size tensor.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator, Sequence

import torch
from torch import nn
from torch.autograd.function import once_differentiable
from torch.nn import functional as F

from drift import memory
from drift._plan import Workspace, chunk_bound

# Intermediates per chunk of the pointwise layers. On the CPU below glibc's largest mmap threshold (32 MiB), so
# that chunks reuse the heap instead of page-faulting fresh maps; elsewhere large, each chunk costing kernel
# launches.
CHUNK_BYTES = {"cpu": 16 * 2**20}
OTHER_DEVICES_CHUNK_BYTES = 256 * 2**20
# The projection on the CPU: intermediates per thread, each thread's piece of a chunk one gemm of a batched
# gemm (``_parts``), small enough to run from its core's cache (benchmarks/projection.py: MKL shares a thin
# gemm poorly between threads; see docs/benchmarks/models.md for the sizes tried).
PIECE_BYTES = 2 * 2**20

PointwiseFn = Callable[..., torch.Tensor]
Activation = Callable[[torch.Tensor], torch.Tensor]


def activate(non_linearity: Callable[[torch.Tensor], torch.Tensor], x: torch.Tensor) -> torch.Tensor:
    """``non_linearity(x)``; for complex ``x``, applied to the real and imaginary parts separately."""
    if x.is_complex():
        return torch.complex(non_linearity(x.real), non_linearity(x.imag))
    return non_linearity(x)


def _is_exact_gelu(non_linearity: Activation | None) -> bool:
    return non_linearity is F.gelu or (isinstance(non_linearity, nn.GELU) and non_linearity.approximate == "none")


def _flat(t: torch.Tensor) -> torch.Tensor:
    """``(b, c, *spatial)`` as ``(b, c, points)``."""
    return t.reshape(t.shape[0], t.shape[1], math.prod(t.shape[2:]))


def _chunk_view(buffer: torch.Tensor, *shape: int) -> torch.Tensor:
    """A contiguous ``shape`` view of the start of the flat ``buffer``."""
    return buffer[: math.prod(shape)].view(shape)


def _points_per_chunk(device: torch.device, bytes_per_point: int, chunk_bytes: int | None = None) -> int:
    """Points per chunk: ``chunk_bytes`` (default ``CHUNK_BYTES`` for the device) of intermediates."""
    chunk_bytes = chunk_bytes or chunk_bound(CHUNK_BYTES, OTHER_DEVICES_CHUNK_BYTES, device)
    return max(1, chunk_bytes // max(1, bytes_per_point))


def _per_thread(device: torch.device) -> bool:
    """Whether thin gemms go in a piece per thread: on the CPU, but not under ``torch.compile``."""
    return device.type == "cpu" and not torch.compiler.is_compiling()


def _parts(device: torch.device) -> int:
    """Pieces a chunk is cut into for one batched gemm, one piece per thread on the CPU: MKL shares a thin
    gemm (an inner or outer dimension of 5-21) poorly between threads, a batch of them well. One under
    ``torch.compile``."""
    return torch.get_num_threads() if _per_thread(device) else 1


def _pieces(points: int, step: int, parts: int) -> Iterator[tuple[int, int, int]]:
    """``(start, m, q)`` per chunk of ``step`` points, rounded down to a multiple of ``parts`` (at least
    ``parts``): ``m`` points cut into ``q`` pieces, ``parts`` but for a ragged last chunk they do not divide
    (one). Unrounded, a step ``parts`` does not divide made every chunk one thin gemm shared by the threads,
    as the projection's backward had by default at 3, 4 or 8 threads (steps of 4096, 5461 and 10922 points),
    and on two threads with 4 MiB pieces, where it took 1.2-1.3x as long (``benchmarks/projection.py``)."""
    step = max(parts, step - step % parts)
    for start in range(0, points, step):
        m = min(step, points - start)
        yield start, m, parts if m % parts == 0 else 1


def _split(t: torch.Tensor, parts: int) -> torch.Tensor:
    """``(c, m)`` as ``(parts, c, m / parts)``: consecutive runs of points, a view."""
    return t.unflatten(-1, (parts, t.shape[-1] // parts)).transpose(0, 1)


def activate_(non_linearity: Activation, x: torch.Tensor) -> torch.Tensor:
    """``x`` overwritten by ``activate(non_linearity, x)``; in place without a temporary for real ``x``
    and exact GeLU (``F.gelu``, ``nn.GELU()``), ``F.relu`` or ``torch.relu``."""
    if not x.is_complex():
        if _is_exact_gelu(non_linearity):
            return torch.ops.aten.gelu_(x)
        if non_linearity in (F.relu, torch.relu):
            return x.relu_()
    return x.copy_(activate(non_linearity, x))


def activates_whole(non_linearity: Activation, x: torch.Tensor) -> bool:
    """Whether to apply ``non_linearity`` to a whole block ``x`` at once, after its chunks' gemms, rather
    than to each chunk while it is in cache: for exact GeLU on real values. A chunk of a block's points is
    a strided view across its channels, on which torch's exact GeLU runs slower per element than on a
    contiguous tensor, by more than the extra pass over the block costs (``benchmarks/activation_layout.py``)."""
    return not x.is_complex() and _is_exact_gelu(non_linearity)


def mlp_unrecorded(
    x: torch.Tensor,
    w1: torch.Tensor,
    b1: torch.Tensor | None,
    w2: torch.Tensor,
    b2: torch.Tensor | None,
    non_linearity: Activation,
    work: Workspace,
    *,
    skip: torch.Tensor | None = None,
    gate: torch.Tensor | None = None,
    out_non_linearity: Activation | None = None,
) -> torch.Tensor:
    """``W2 act(W1 x + b1) + b2`` on ``x`` ``(b, c_in, *spatial)``, plus ``gate * skip`` when ``skip``
    (``(b, c_out, *spatial)``; ``gate`` ``(c_out,)``, or None for ``skip`` itself) is given, then
    ``out_non_linearity`` when given: neuraloperator's channel MLP with its soft-gating or identity skip and
    the block's activation. Outside autograd, a chunk of points at a
    time (``PIECE_BYTES`` of hidden layer per thread on the CPU, each thread's piece one gemm of a batched
    gemm) through resident buffers of ``work``: the hidden layer never exists for the whole block and
    nothing is allocated per chunk. ``b1`` rides in its gemm as a column of ``W1`` against a row of ones
    below the chunk of ``x`` (``addmm`` would first copy it over the whole hidden chunk); ``b2`` is copied
    into the few output rows first (with the chunk of ``gate * skip``), which keeps the hidden chunk
    contiguous for the activation (``activates_whole``). ``x`` may be held in a lower precision than the
    weights' (``drift.nn.streaming``'s activations): each chunk is computed in the weights'. Returns a
    fresh ``(b, c_out, *spatial)`` in the weights' dtype (``drift.memory``)."""
    flat, dtype = _flat(x), w1.dtype
    flat_skip = None if skip is None else _flat(skip)
    out = memory.empty((x.shape[0], w2.shape[0], flat.shape[2]), dtype, x.device)
    (hidden, width), out_channels = w1.shape, w2.shape[0]
    parts = _parts(x.device)
    step = _points_per_chunk(x.device, hidden * w1.element_size(), _thread_chunk_bytes(x.device))
    size = -(-min(step, flat.shape[2]) // parts) * parts  # buffers no larger than the block's points
    w1_b1 = (w1 if b1 is None else torch.cat((w1, b1[:, None]), 1)).expand(parts, -1, -1)
    w2 = w2.expand(parts, -1, -1)
    inputs = work.get(("mlp_input",), (w1_b1.shape[2] * size,), dtype, x.device)
    buffer = work.get(("mlp_hidden",), (hidden * size,), dtype, x.device)
    results = work.get(("mlp_output",), (out_channels * size,), dtype, x.device)
    for i in range(flat.shape[0]):
        for s, m, q in _pieces(flat.shape[2], step, parts):
            part = _split(flat[i, :, s : s + m], q)
            if b1 is None:
                part = _chunk_view(inputs, q, width, m // q).copy_(part)
            else:
                part = _with_ones(_chunk_view(inputs, q, width + 1, m // q), part)
            h = torch.bmm(w1_b1[:q], part, out=_chunk_view(buffer, q, hidden, m // q))
            activate_(non_linearity, h)
            target = _split(out[i, :, s : s + m], q)
            # q > 1 or an activation to follow: through a contiguous buffer (bmm into the strided pieces of
            # out runs several times slower, and so does GeLU on them)
            direct = q == 1 and out_non_linearity is None
            result = target if direct else _chunk_view(results, q, out_channels, m // q)
            if skip is not None:
                _gated_into(result, _split(flat_skip[i, :, s : s + m], q), gate, b2)
                result.baddbmm_(w2[:q], h)
            elif b2 is None:
                torch.bmm(w2[:q], h, out=result)
            else:
                torch.baddbmm(b2[None, :, None], w2[:q], h, out=result)
            if out_non_linearity is not None:
                activate_(out_non_linearity, result)
            if not direct:
                target.copy_(result)
    return out.view(x.shape[0], out_channels, *x.shape[2:])


def _gated_into(result: torch.Tensor, skip: torch.Tensor, gate: torch.Tensor | None, bias: torch.Tensor | None) -> None:
    """``result`` (``(q, c, m)``) overwritten by ``gate * skip + bias`` (``gate``, ``bias`` ``(c,)`` or None)."""
    if gate is not None and bias is not None:
        torch.addcmul(bias[:, None], skip, gate[:, None], out=result)
    elif gate is not None:
        torch.mul(skip, gate[:, None], out=result)
    elif bias is not None:
        torch.add(skip, bias[:, None], out=result)
    else:
        result.copy_(skip)


def _thread_chunk_bytes(device: torch.device) -> int | None:
    """Bytes per chunk of a thin pointwise gemm (the projection's, a lift's): ``PIECE_BYTES`` a thread on
    the CPU; elsewhere (and under ``torch.compile``) None, ``_points_per_chunk``'s default."""
    return _parts(device) * PIECE_BYTES if _per_thread(device) else None


def linear_into(
    weight: torch.Tensor, bias: torch.Tensor | None, x: torch.Tensor, out: torch.Tensor, step: int | None = None
) -> torch.Tensor:
    """``out`` (``(b, out, *spatial)``, contiguous) overwritten by ``W x + b`` for ``x`` ``(b, in, *spatial)``,
    ``W`` ``(out, in)``, ``b`` ``(out,)`` or None, ``step`` points at a time (default ``PIECE_BYTES`` of input
    and output a thread on the CPU): a whole block's gemm with a short inner dimension, a lift from five
    channels, runs slower on one thread (``benchmarks/activation_layout.py``)."""
    flat_x, flat = _flat(x), _flat(out)
    w = weight.expand(x.shape[0], -1, -1)
    if step is None:
        per_point = (x.shape[1] + out.shape[1]) * x.element_size()
        step = _points_per_chunk(x.device, per_point, _thread_chunk_bytes(x.device))
    for s in range(0, flat.shape[2], step):
        if bias is None:
            torch.bmm(w, flat_x[..., s : s + step], out=flat[..., s : s + step])
        else:
            torch.baddbmm(bias[None, :, None], w, flat_x[..., s : s + step], out=flat[..., s : s + step])
    return out


def _with_ones(buffer: torch.Tensor, part: torch.Tensor) -> torch.Tensor:
    """``buffer`` (``(..., c + 1, m)``) holding ``part`` (``(..., c, m)``) over a row of ones."""
    buffer[..., :-1, :].copy_(part)
    buffer[..., -1, :].fill_(1)
    return buffer


class _Chunked(torch.autograd.Function):
    @staticmethod
    def forward(ctx, fn: PointwiseFn, step: int, out_channels: int, x: torch.Tensor, *params: torch.Tensor):
        ctx.fn, ctx.step = fn, step
        ctx.save_for_backward(x, *params)
        out = memory.empty((x.shape[0], out_channels, x.shape[2]), x.dtype, x.device)
        for s in range(0, x.shape[2], step):
            out[..., s : s + step] = fn(x[..., s : s + step], *params)
        return out

    @staticmethod
    def backward(ctx, grad_out: torch.Tensor):
        x, *params = ctx.saved_tensors
        leaves = [p.detach().requires_grad_(p.requires_grad) for p in params]
        wanted = [p for p in leaves if p.requires_grad]
        grads = [torch.zeros_like(p) for p in wanted]
        grad_x = memory.empty_like(x) if ctx.needs_input_grad[3] else None
        for s in range(0, x.shape[2], ctx.step):
            part = x[..., s : s + ctx.step].detach().requires_grad_(grad_x is not None)
            with torch.enable_grad():
                y = ctx.fn(part, *leaves)
            inputs = ([part] if grad_x is not None else []) + wanted
            found = torch.autograd.grad(y, inputs, grad_out[..., s : s + ctx.step], allow_unused=True)
            if grad_x is not None:
                grad_x[..., s : s + ctx.step] = found[0]
                found = found[1:]
            for total, g in zip(grads, found, strict=True):
                if g is not None:
                    total += g
        it = iter(grads)
        return None, None, None, grad_x, *(next(it) if p.requires_grad else None for p in leaves)


def chunked_pointwise(
    fn: PointwiseFn,
    x: torch.Tensor,
    params: Sequence[torch.Tensor],
    out_channels: int,
    bytes_per_point: int,
    chunk_bytes: int | None = None,
) -> torch.Tensor:
    """``fn(x, *params)`` for a pointwise ``fn`` mapping ``(b, c_in, n)`` to ``(b, out_channels, n)``, run
    on chunks of ``chunk_bytes // bytes_per_point`` points of ``x`` ``(b, c_in, *spatial)``
    (``bytes_per_point``: ``fn``'s intermediates per point; ``chunk_bytes`` defaults to ``CHUNK_BYTES`` for the device).
    Differentiable in ``x`` and ``params``: the backward pass recomputes each chunk (``fn`` must be
    deterministic). Returns ``(b, out_channels, *spatial)``."""
    flat = _flat(x)
    if torch.compiler.is_compiling():  # the compiler decides what to keep for the backward
        return fn(flat, *params).view(x.shape[0], out_channels, *x.shape[2:])
    step = _points_per_chunk(x.device, bytes_per_point, chunk_bytes)
    out = _Chunked.apply(fn, step, out_channels, flat, *params)
    return out.view(x.shape[0], out_channels, *x.shape[2:])


def accumulate_in_place(
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    x: torch.Tensor,
    y: torch.Tensor,
    non_linearity: Activation | None,
) -> torch.Tensor:
    """``y`` (``(b, out, *spatial)``, contiguous, not recorded by autograd) overwritten by
    ``non_linearity(y + W x + b)`` for ``x`` ``(b, in, *spatial)``, ``W`` ``(out, in)``, ``b`` ``(out,)`` or
    None, and no activation for None: the gemm a chunk of points at a time, the activation on each chunk
    or, for exact GeLU, in one pass over the whole of ``y`` after them (``_tail_into``)."""
    if not y.is_contiguous():  # its flat view would be a copy, and the result lost
        raise ValueError(f"accumulate_in_place needs a contiguous y, got strides {y.stride()}")
    step = _points_per_chunk(y.device, y.shape[0] * (x.shape[1] + y.shape[1]) * y.element_size())
    _tail_into(non_linearity, step, x, y, weight, bias, y)
    return y


def _activate_into(act: Activation, h: torch.Tensor, out: torch.Tensor) -> None:
    """``out`` overwritten by ``act(h)``. aten's ``gelu.out`` only into a contiguous ``out``: given a strided
    view of the right shape it writes wrong values (torch 2.13)."""
    if _is_exact_gelu(act) and out.is_contiguous():
        torch.ops.aten.gelu.out(h, approximate="none", out=out)
    else:
        out.copy_(act(h))


def _tail_into(
    act: Activation | None,
    step: int,
    x: torch.Tensor,
    y: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    out: torch.Tensor,
) -> None:
    """``out = act(z)``, ``z = y + W x + b``, ``step`` points at a time: with ``act``, ``z`` overwrites ``y``
    (exact GeLU over the whole block after the chunks, ``activates_whole``), and ``out`` may be ``y``
    itself; without, ``out`` is ``z`` and ``y`` is left alone unless it is ``out``."""
    flat_x, flat_y, flat_out = _flat(x), _flat(y), _flat(out)
    w = weight.expand(x.shape[0], -1, -1)
    whole = act is not None and activates_whole(act, x)

    def activation(z: torch.Tensor, target: torch.Tensor) -> None:
        if out is y:
            activate_(act, z)
        else:
            _activate_into(act, z, target)

    for s in range(0, flat_out.shape[2], step):
        target = flat_out[..., s : s + step]
        z = target if act is None else flat_y[..., s : s + step]
        torch.baddbmm(flat_y[..., s : s + step], w, flat_x[..., s : s + step], out=z)
        if bias is not None:
            z.add_(bias[None, :, None])
        if act is not None and not whole:
            activation(z, target)
    if whole:
        activation(flat_y, flat_out)


class _PointwiseActivation(torch.autograd.Function):
    """``out = act(z)``, ``z = y + W x + b``, on ``(b, c, *spatial)`` blocks, a chunk of ``step`` points at a
    time (exact GeLU over the whole block after the chunks: ``activates_whole``). ``z`` overwrites ``y``
    (which its caller hands over) and is saved with ``x``; the backward pass writes ``g * act'(z)``, the
    gradient of ``y``, over ``z``, so it runs once. Without ``act``, ``out`` is ``z`` and ``y`` is left
    alone, or absent (None: ``out = W x + b``). Outputs and the gradient of
    ``x`` are whole tensors from ``drift.memory``, not views."""

    @staticmethod
    def forward(ctx, act: Activation | None, step: int, x: torch.Tensor, y: torch.Tensor | None, weight, bias):
        out = memory.empty((x.shape[0], weight.shape[0], *x.shape[2:]), x.dtype, x.device)
        if y is None:
            linear_into(weight, bias, x, out, step)
        else:
            _tail_into(act, step, x, y, weight, bias, out)
        ctx.act, ctx.step = act, step
        ctx.save_for_backward(x, weight, None if act is None else y)
        return out

    @staticmethod
    @once_differentiable
    def backward(ctx, grad: torch.Tensor):
        try:
            x, weight, z = ctx.saved_tensors
        except RuntimeError as error:  # freed, or z overwritten (a version mismatch) by the first backward
            raise RuntimeError(
                "pointwise_activation: a second backward pass through the FNO block's pointwise + activation "
                "node (retain_graph): the first overwrote its saved pre-activation with its gradient"
            ) from error
        act, step = ctx.act, ctx.step
        need_x, need_y, need_w, need_b = ctx.needs_input_grad[2:]
        grad_x = memory.empty_like(x) if need_x else None
        grad_wb = x.new_zeros(x.shape[0], weight.shape[0], weight.shape[1]) if need_w else None
        grad_b = x.new_zeros(weight.shape[0]) if need_b else None
        flat_x, flat_grad = _flat(x), _flat(grad)
        flat_z = None if z is None else _flat(z)
        flat_grad_x = None if grad_x is None else _flat(grad_x)
        w_t = weight.mT.expand(x.shape[0], -1, -1)
        for s in range(0, flat_x.shape[2], step):
            g = flat_grad[..., s : s + step]
            if act is not None:
                # g * act'(z) over z: the gradient of y, and of z for W, b and x.
                z_part = flat_z[..., s : s + step]
                g = _through_activation(act, z_part, g, out=z_part)
            if grad_x is not None:
                torch.bmm(w_t, g, out=flat_grad_x[..., s : s + step])
            if grad_wb is not None:
                grad_wb.baddbmm_(g, flat_x[..., s : s + step].mT)
            if grad_b is not None:
                grad_b += g.sum((0, 2))
        grad_y = (grad if act is None else z) if need_y else None
        grad_w = None if grad_wb is None else grad_wb.sum(0)
        return None, None, grad_x, grad_y, grad_w, grad_b


class _Branch(torch.autograd.Function):
    """``x`` handed to two consumers, their gradients summed into a pooled tensor (``drift.memory``):
    autograd's own sum is in place only into a tensor whose storage nothing else holds, so it would make
    a fresh block-sized tensor whenever the first gradient came from the pool."""

    @staticmethod
    def forward(ctx, x: torch.Tensor):
        return x.view_as(x), x.view_as(x)

    @staticmethod
    @once_differentiable
    def backward(ctx, first: torch.Tensor | None, second: torch.Tensor | None):
        if first is None or second is None:
            return second if first is None else first
        return torch.add(first, second, out=memory.empty_like(first))


def branch(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Two aliases of ``x`` for two consumers; the backward pass sums their gradients into one tensor
    from ``drift.memory``'s pool."""
    return _Branch.apply(x)


def pointwise_activation(
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    x: torch.Tensor,
    y: torch.Tensor | None,
    non_linearity: Activation | None,
    chunk_bytes: int | None = None,
) -> torch.Tensor:
    """``non_linearity(y + W x + b)`` (no activation for None) for real ``x`` ``(b, in, *spatial)``, ``y``
    ``(b, out, *spatial)`` (or None without an activation: ``W x + b``), ``W`` ``(out, in)``, ``b``
    ``(out,)`` or None, recorded by autograd as one node that runs forward and backward a chunk of points
    at a time (``chunk_bytes`` of them per chunk: by default ``CHUNK_BYTES``, or without ``y`` a thread's
    piece as ``linear_into``'s) and allocates one full-size tensor each way from ``drift.memory``: the
    output, and ``x``'s gradient.

    ``y`` must be referenced by nothing else (a fresh spectral output): with an activation it is
    overwritten by ``z = y + W x + b``, which the node saves with ``x``, and its backward writes
    ``g * act'(z)`` over ``z``, so it runs once: a second backward (retain_graph) raises, unless
    ``torch.autograd.graph.saved_tensors_hooks`` hand it copies of the saved tensors. ``act'`` is
    closed-form for exact GeLU (``F.gelu``, ``nn.GELU()``); any other callable is differentiated by
    autograd a chunk at a time in the backward pass, recomputing ``act`` on that chunk (the general path,
    not an approximation). Pass ``W`` and ``b`` through ``Replicated.replicated`` first to have their
    gradients summed over the mesh."""
    if y is None and non_linearity is not None:
        raise ValueError("pointwise_activation: y=None (W x + b alone) takes no non_linearity")
    x, y = x.contiguous(), None if y is None else y.contiguous()
    per_point = 2 * x.shape[0] * (x.shape[1] + weight.shape[0]) * x.element_size()  # x, y, out; g, z, x, grad x
    if y is None and chunk_bytes is None:  # W x + b alone: a thin gemm, in a thread's piece (linear_into)
        chunk_bytes = _thread_chunk_bytes(x.device)
    step = _points_per_chunk(x.device, per_point, chunk_bytes)
    return _PointwiseActivation.apply(non_linearity, step, x, y, weight, bias)


class _ChunkedMLP(torch.autograd.Function):
    """``out_act(W2 act(W1 x + b1) + b2 + gate * skip)`` on ``(b, c, *spatial)`` blocks (the skip term
    without ``skip``, ``gate`` None for ``skip`` itself, no ``out_act`` for None). The forward pass is the
    unrecorded one's (``mlp_unrecorded``: resident hidden buffers, the activations in place) and saves
    ``x`` and ``skip`` alone. The backward pass recomputes the hidden layer (and with ``out_act`` the
    pre-activation) ``step`` points of one batch item at a time, cut into one piece per thread
    (``_parts``), through chunk-sized buffers made once per call, each gemm a batched one over the pieces.
    The bias ``b1`` rides in the first gemm as a column of ``W1`` against a row of ones below the chunk of
    ``x`` (a copy of ``c`` rows, where adding it would touch every hidden row), which also makes ``b1``'s
    gradient a column of that gemm's."""

    @staticmethod
    def forward(ctx, act: Activation, out_act: Activation | None, step: int, x, w1, b1, w2, b2, skip, gate):
        ctx.act, ctx.out_act, ctx.step = act, out_act, step
        ctx.save_for_backward(x, w1, b1, w2, b2, skip, gate)
        work = Workspace(memory.empty)  # its buffers back to the pool after the call: no faults the next step
        return mlp_unrecorded(x, w1, b1, w2, b2, act, work, skip=skip, gate=gate, out_non_linearity=out_act)

    @staticmethod
    @once_differentiable
    def backward(ctx, grad: torch.Tensor):
        x, w1, b1, w2, b2, skip, gate = ctx.saved_tensors
        act, out_act, step = ctx.act, ctx.out_act, ctx.step
        need_x, need_w1, need_b1, need_w2, need_b2, need_skip, need_gate = ctx.needs_input_grad[3:]
        batch, width, hidden, out_channels = x.shape[0], w1.shape[1], w1.shape[0], w2.shape[0]
        flat_x, flat_grad = _flat(x), _flat(grad)
        flat_skip = None if skip is None else _flat(skip)
        grad_x = memory.empty_like(x) if need_x else None
        grad_skip = memory.empty_like(skip) if need_skip else None
        flat_grad_x = None if grad_x is None else _flat(grad_x)
        flat_grad_skip = None if grad_skip is None else _flat(grad_skip)
        parts = _parts(x.device)
        # (W1 b1)'s gradient transposed: MKL runs xs g_h^T faster than g_h xs^T at these shapes (K = points).
        grad_w1_b1_t = x.new_zeros(parts, width + 1, hidden) if need_w1 or need_b1 else None
        grad_w2 = x.new_zeros(parts, *w2.shape) if need_w2 else None
        grad_b2 = x.new_zeros(out_channels) if need_b2 else None
        grad_gate = x.new_zeros(out_channels) if need_gate else None
        w1_b1 = torch.cat((w1, b1[:, None]), 1).expand(parts, -1, -1)
        w1_t, w2_t, w2_p = (w.expand(parts, -1, -1) for w in (w1.mT, w2.mT, w2))
        size = -(-min(step, flat_x.shape[2]) // parts) * parts  # buffers no larger than the block's points
        gated = out_channels if grad_gate is not None else 0
        ones_x, g_buf, z_buf, gx_buf, h, a, ga, gs_buf = (
            memory.empty((rows * size,), x.dtype, x.device)
            for rows in (width + 1, out_channels, out_channels if out_act else 0, width, hidden, hidden, hidden, gated)
        )
        for i in range(batch):
            for s, m, q in _pieces(flat_x.shape[2], step, parts):
                xs = _with_ones(_chunk_view(ones_x, q, width + 1, m // q), _split(flat_x[i, :, s : s + m], q))
                g = _chunk_view(g_buf, q, out_channels, m // q).copy_(_split(flat_grad[i, :, s : s + m], q))
                hs, acts, g_h = (_chunk_view(t, q, hidden, m // q) for t in (h, a, ga))
                torch.bmm(w1_b1[:q], xs, out=hs)
                _activate_into(act, hs, acts)
                if out_act is not None:  # the pre-activation again, and the gradient of it over g
                    zs = _chunk_view(z_buf, q, out_channels, m // q)
                    _gated_into(zs, _split(flat_skip[i, :, s : s + m], q), gate, b2)
                    zs.baddbmm_(w2_p[:q], acts)
                    _through_activation(out_act, zs, g, out=g)
                torch.bmm(w2_t[:q], g, out=g_h)  # the gradient of act(h), then of h in place
                _through_activation(act, hs, g_h, out=g_h)
                if grad_w2 is not None:
                    grad_w2[:q].baddbmm_(g, acts.mT)
                if grad_b2 is not None:
                    grad_b2 += g.sum((0, 2))
                if grad_w1_b1_t is not None:
                    grad_w1_b1_t[:q].baddbmm_(xs, g_h.mT)
                if grad_x is not None:
                    # through a buffer: bmm into the strided pieces of grad_x runs several times slower
                    gx = torch.bmm(w1_t[:q], g_h, out=_chunk_view(gx_buf, q, width, m // q))
                    _split(flat_grad_x[i, :, s : s + m], q).copy_(gx)
                if grad_skip is not None:
                    _gated_into(_split(flat_grad_skip[i, :, s : s + m], q), g, gate, None)
                if grad_gate is not None:
                    gs = _chunk_view(gs_buf, q, out_channels, m // q)
                    grad_gate += torch.mul(g, _split(flat_skip[i, :, s : s + m], q), out=gs).sum((0, 2))
        grad_w1 = grad_b1 = None
        if grad_w1_b1_t is not None:
            total = grad_w1_b1_t.sum(0).T.contiguous()
            grad_w1, grad_b1 = (total[:, :width] if need_w1 else None), (total[:, width] if need_b1 else None)
        grad_w2 = None if grad_w2 is None else grad_w2.sum(0)
        return None, None, None, grad_x, grad_w1, grad_b1, grad_w2, grad_b2, grad_skip, grad_gate


def _through_activation(act: Activation, pre: torch.Tensor, grad: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
    """``out`` (``grad`` or ``pre`` itself, or a tensor of their shape) overwritten by ``grad * act'(pre)``;
    returns ``out``. Closed-form for exact GeLU, autograd on ``pre`` for any other callable (the general
    path)."""
    if _is_exact_gelu(act):
        return torch.ops.aten.gelu_backward.grad_input(grad, pre, approximate="none", grad_input=out)
    with torch.enable_grad():
        leaf = pre.detach().requires_grad_(True)
        (found,) = torch.autograd.grad(act(leaf), leaf, grad)
    return out.copy_(found)


def chunked_mlp(
    x: torch.Tensor,
    w1: torch.Tensor,
    b1: torch.Tensor,
    w2: torch.Tensor,
    b2: torch.Tensor,
    non_linearity: Activation,
    chunk_bytes: int | None = None,
    *,
    skip: torch.Tensor | None = None,
    gate: torch.Tensor | None = None,
    out_non_linearity: Activation | None = None,
) -> torch.Tensor:
    """The two-layer pointwise MLP ``W2 non_linearity(W1 x + b1) + b2`` on real ``x`` ``(b, c, *spatial)``
    (``W1`` ``(hidden, c)``, ``W2`` ``(out, hidden)``), a chunk of points at a time forward and backward,
    recorded as one autograd node that saves ``x`` and recomputes each chunk's hidden layer in the
    backward pass: the hidden layer never exists whole. The backward's chunks hold ``chunk_bytes`` of
    intermediates (default, as the forward's: ``PIECE_BYTES`` per thread on the CPU, each thread's piece
    one gemm of a batched gemm).

    neuraloperator's block tail in the same node: ``skip`` ``(b, out, *spatial)`` adds ``gate * skip``
    (``gate`` ``(out,)``, its soft-gating, or None for the identity skip) inside the second gemm's chunks,
    and ``out_non_linearity`` (None: none) is applied to the sum, its pre-activation recomputed in the backward
    pass with the hidden layer.
    ``act'`` is closed-form for exact GeLU, autograd on the chunk for any other callable (the general
    path). Returns ``(b, out, *spatial)``, a whole tensor from ``drift.memory``."""
    x = x.contiguous()
    skip = None if skip is None else skip.contiguous()
    if skip is None and gate is not None:
        raise ValueError("chunked_mlp: gate= goes with skip=")
    per_point = 3 * w1.shape[0] * x.element_size()  # h, act(h) and their gradient, one batch item at a time
    step = _points_per_chunk(x.device, per_point, chunk_bytes or _thread_chunk_bytes(x.device))
    return _ChunkedMLP.apply(non_linearity, out_non_linearity, step, x, w1, b1, w2, b2, skip, gate)
