"""The memory an FNO's forward or training step needs on a rank, before the ranks allocate it.

``fno_memory`` estimates the peak bytes a rank holds (``MemoryEstimate``): the fields (the caller's input,
the output, the activations a pass keeps, in multiples of one ``width``-channel field fitted per method and
pass), the parameters (with their gradients and Adam's two moments for a step), the chunk-sized work
buffers, and the process's start-up. ``floor`` is the forward's least: input, output and one activation.
``refuse_if_short`` raises before anything is allocated when the estimate exceeds what a rank has.

The field multiples were fitted to ``drift.memory.LiveBytes`` peaks of width-20 FNOs (2 and 4 layers;
1024 x 512 and 32 x 32 x 16 x 30 on one rank; ``tests/test_memory.py`` checks them) and rounded up: the
estimate errs above, by the start-up's share on small grids and by a few percent on the benchmark's.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from enum import Enum

# Chunk-sized buffers a rank keeps whatever the grid: drift's plan workspace (its WORK_BYTES, shared by the
# blocks) and the streaming slabs and projection chunks (two CHUNK_BYTES).
WORK_BYTES = 64 * 2**20 + 2 * 16 * 2**20
# A rank's private memory before its first tensor: torch, its libraries' data and a Gloo group (measured by
# ``drift bench capacity``: 0.15 GB of torch, about 0.1 GB of the group and allocator).
STARTUP_BYTES = 256 * 2**20
ADAM_COPIES = 4  # a parameter, its gradient and Adam's two moments


class Pass(Enum):
    """What runs: a forward without autograd (streaming where the blocks are plain), a training step that
    keeps every block's activations (``STEP``), one that recomputes them (``RECOMPUTE_STEP``), or one that
    recomputes the channel MLPs' hidden layers (``RECOMPUTE_MLP_STEP``, ``FNO.recompute_mlp``)."""

    FORWARD = "forward"
    STEP = "step"
    RECOMPUTE_STEP = "recompute step"
    RECOMPUTE_MLP_STEP = "recompute mlp step"


# Width-channel fields a pass holds at its peak beyond input and output: (fixed, per layer), for drift and
# for the dfno methods, on 2-D grids and on grids of 3 or more dims.
_FIELDS = {
    ("drift", Pass.FORWARD, False): (1.0, 0.0),
    ("drift", Pass.FORWARD, True): (1.1, 0.0),  # the private memory of 4 ranks at 160 x 160 x 80 x 30
    ("drift", Pass.STEP, False): (2.0, 2.0),
    ("drift", Pass.STEP, True): (2.0, 2.3),
    ("drift", Pass.RECOMPUTE_STEP, False): (3.1, 1.0),
    ("drift", Pass.RECOMPUTE_STEP, True): (4.0, 1.0),  # 4 ranks' private memory at 80 x 80 x 40 x 30
    ("dfno", Pass.FORWARD, False): (3.8, 0.0),
    ("dfno", Pass.FORWARD, True): (7.0, 0.0),
    ("dfno", Pass.STEP, False): (6.0, 2.0),
    ("dfno", Pass.STEP, True): (16.5, 1.0),
    ("dfno", Pass.RECOMPUTE_STEP, False): (7.0, 1.0),
    ("dfno", Pass.RECOMPUTE_STEP, True): (16.5, 1.0),
}
# What neuraloperator's options (``drift.nn.NEURALOP_DEFAULTS``: the grid embedding, a lifting and a
# projection twice the width, a channel MLP and a soft-gating skip in every block) add to those fields: a
# step keeps the channel MLP's fields, or with their hidden layers recomputed (``RECOMPUTE_MLP_STEP``) each
# block's output before its channel MLP (``drift.nn.executor.channel_mlp_tail``) and of the lift its input
# alone; the forward streams them a slab at a time.
_NEURALOP_EXTRA = {
    Pass.FORWARD: (0.0, 0.0),
    Pass.STEP: (3.5, 3.0),
    Pass.RECOMPUTE_STEP: (8.1, 0.0),
    Pass.RECOMPUTE_MLP_STEP: (2.6, 1.0),
}
# Fields an unrolled step keeps beyond its blocks' inputs when the blocks recompute (the lift's output,
# the projection's input): plain, and with neuraloperator's options.
_UNROLL_KEPT = {False: 2.0, True: 5.8}
# Fields each further call of an unrolled step keeps when the channel MLPs recompute: (fixed, per layer),
# a block's input and its channel MLP's, the lift's output and the projection's input (the first call's
# peak holds the backward pass's transients besides: ``_NEURALOP_EXTRA``).
_UNROLL_MLP_KEPT = (2.9, 2.0)
# Pages a rank's private memory holds beyond its live tensors (``MemoryEstimate.slack``): values of
# dtype_bytes a point when the streaming forward keeps its fields in a lower precision (``drift bench
# capacity --activations bfloat16`` at 8,192^2-13,312^2 on 4 ranks: 84.8 bytes a point against the tensors'
# 80), and the share of a step's fields that a training loop's later steps hold besides (the storages
# drift.memory's pool and glibc's heap keep from step to step; ``benchmarks/memory_model.py``), on 2-D grids
# and on grids of 3 or more dims: 1.16-1.18x the live peak from the second step on in 2-D at 1280^2 and
# 2560^2; 2% more than the first step at 80 x 80 x 40 x 30 on 4 ranks, within the fitted multiples of the
# fields. On the CPU neuraloperator's blocks recomputed hold more where their half-width channel-MLP fields
# are below glibc's largest mmap threshold (32 MiB) and so come from its heap, which the recomputation
# fragments (benchmarks/memory_model.py: 1.59-1.91x the live peak at 640^2, 1.67x at 24 x 24 x 12 x 30,
# 1.16x at 1280^2): a share of the fields that falls from _HEAP_SLACK's below a width-channel field of
# _HEAP_BYTES[0] to the loop's at _HEAP_BYTES[1], linearly between.
_CONVERSION_SLACK = 1.25
_LOOP_SLACK = {False: 0.2, True: 0.0}
_HEAP_SLACK = {False: 0.8, True: 0.5}
_HEAP_BYTES = (32 * 2**20, 128 * 2**20)


def _loop_slack(field_bytes: int, spatial_3d: bool, heap: bool) -> float:
    """The share of a step's fields a training loop holds beyond them (``_LOOP_SLACK``, ``_HEAP_SLACK``)."""
    low, high = _HEAP_BYTES
    below = min(1.0, max(0.0, (high - field_bytes) / (high - low))) if heap else 0.0
    return _LOOP_SLACK[spatial_3d] + below * (_HEAP_SLACK[spatial_3d] - _LOOP_SLACK[spatial_3d])


@dataclass(frozen=True)
class MemoryEstimate:
    """Bytes a rank holds at its peak, by part; ``total`` their sum, ``floor`` the forward's least (input,
    output, one activation, the parameters and the start-up). ``slack``: pages the process holds beyond
    its live tensors (the allocator's, and in a training loop the storages ``drift.memory``'s pool keeps
    from step to step)."""

    fields: int
    parameters: int
    work: int
    startup: int
    floor: int
    slack: int = 0

    @property
    def total(self) -> int:
        return self.fields + self.parameters + self.work + self.startup + self.slack


def fno_memory(
    global_shape: tuple[int, ...],
    parts: tuple[int, ...],
    *,
    in_channels: int,
    out_channels: int,
    width: int,
    modes: tuple[int, ...],
    n_layers: int = 4,
    batch: int = 1,
    method: str = "drift",
    projection_width: int = 128,
    dtype_bytes: int = 4,
    activation_bytes: int | None = None,
    pass_: Pass = Pass.FORWARD,
    neuralop: bool = False,
    steps: int = 1,
    padding: float | Sequence[float] = 0.0,
    startup_bytes: int = STARTUP_BYTES,
    device: str = "cpu",
) -> MemoryEstimate:
    """The peak bytes of the most loaded rank (``torch.chunk``'s first blocks) for a Li et al. FNO (plain
    blocks, or neuraloperator's with ``neuralop``: ``drift.nn.NEURALOP_DEFAULTS``) on ``batch`` samples of
    ``global_shape`` split ``parts`` ways per dim, ``modes`` Li et al.'s k per dim (the last of a real
    transform keeps k, the others 2k). ``activation_bytes``: the streaming forward's activations (2 for
    bfloat16; default ``dtype_bytes``). ``steps``: the model calls whose activations a step keeps for its
    backward pass (an autoregressive unroll's counted frames). ``padding``: the domain padding's fraction
    of every dim, or of each (the blocks' fields grow by it). ``device``: the ranks' kind ("cpu" or "cuda"; the
    CPU's heap holds more in some steps)."""
    if len(parts) != len(global_shape) or len(modes) != len(global_shape):
        raise ValueError(f"parts {parts} and modes {modes} need one entry per dim of {global_shape}")
    ranks = math.prod(parts)
    points = batch * math.prod(math.ceil(n / p) for n, p in zip(global_shape, parts, strict=True))
    family = "drift" if method == "drift" else "dfno"
    # Without a channel MLP, recomputing its hidden layer changes nothing: the step's fields.
    stored = Pass.STEP if pass_ is Pass.RECOMPUTE_MLP_STEP else pass_
    fixed, per_layer = _FIELDS[(family, stored, len(global_shape) > 2)]
    if neuralop:
        fixed, per_layer = fixed + _NEURALOP_EXTRA[pass_][0], per_layer + _NEURALOP_EXTRA[pass_][1]
    kept = fixed + per_layer * n_layers  # width-channel fields at the peak of one model call
    if pass_ is Pass.RECOMPUTE_MLP_STEP and neuralop:
        kept += (steps - 1) * (_UNROLL_MLP_KEPT[0] + _UNROLL_MLP_KEPT[1] * n_layers)
    elif stored is Pass.STEP:
        kept *= steps
    elif pass_ is Pass.RECOMPUTE_STEP:
        kept += (steps - 1) * (_UNROLL_KEPT[neuralop] + n_layers)
    activation = activation_bytes if pass_ is Pass.FORWARD and activation_bytes else dtype_bytes
    pads = (padding,) * len(global_shape) if isinstance(padding, int | float) else tuple(padding)
    field = width * math.ceil(points * math.prod(1 + p for p in pads))
    io = (in_channels + out_channels * steps) * points * dtype_bytes
    retained = math.prod(2 * k for k in modes[:-1]) * modes[-1]
    spectral = width * width * retained * 2 * dtype_bytes  # one layer's complex weight, whole
    if method != "dfno":
        spectral = math.ceil(spectral / ranks)  # sharded over the spatial ranks
    pointwise = (in_channels + 1) * width + n_layers * (width + 1) * width
    pointwise += (width + 1) * projection_width + (projection_width + 1) * out_channels
    if neuralop:  # a lifting and a projection through 2 x width channels, a channel MLP and a skip a block
        lift = (in_channels + len(global_shape) + 1) * 2 * width + (2 * width + 1) * (width + out_channels)
        pointwise = lift + n_layers * 2 * (width + 1) * width + 2 * width * width
    weights = n_layers * spectral + pointwise * dtype_bytes
    slack = 0
    if pass_ is Pass.FORWARD:
        fields = io + field * activation + round((kept - 1.0) * field * dtype_bytes)
        if activation < dtype_bytes:
            slack = round(_CONVERSION_SLACK * points * dtype_bytes)
        parameters = weights
    else:
        fields = io + round(kept * field * dtype_bytes)
        heap = device == "cpu" and neuralop and pass_ is Pass.RECOMPUTE_STEP
        slack = round(_loop_slack(field * dtype_bytes, len(global_shape) > 2, heap) * fields)
        parameters = ADAM_COPIES * weights + 2 * spectral  # a layer's weight gradient built, then summed
    floor = io + field * activation + weights + startup_bytes
    return MemoryEstimate(fields, parameters, WORK_BYTES, startup_bytes, floor, slack)


class MemoryShortError(MemoryError):
    """A pass whose estimated peak exceeds the memory a rank has."""


def refuse_if_short(estimate: MemoryEstimate, available_bytes: int, what: str = "this pass", source: str = "") -> None:
    """MemoryShortError naming the bytes a rank needs and has (from ``source``, as ``drift.budget.RankBudget``
    names it) when ``estimate.total`` exceeds ``available_bytes``: called before the ranks allocate
    (``drift train``, ``drift predict``)."""
    if estimate.total > available_bytes:
        raise MemoryShortError(
            f"{what} needs about {estimate.total / 2**30:.2f} GiB a rank (fields {estimate.fields / 2**30:.2f}, "
            f"parameters {estimate.parameters / 2**30:.2f}, work {estimate.work / 2**30:.2f}, allocator "
            f"{estimate.slack / 2**30:.2f}, start-up {estimate.startup / 2**30:.2f}) and "
            f"{available_bytes / 2**30:.2f} GiB is available"
            + (f" ({source})" if source else "")
            + ": use more ranks, a smaller grid or batch, recompute (training) or bfloat16 activations (inference)"
        )
