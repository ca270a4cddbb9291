"""Fourier neural operators: Li et al.'s FNO and neuraloperator 2.0's options, single-device or over
spatially sharded fields."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
from torch import nn
from torch.distributed.tensor import DTensor
from torch.nn import functional as F

from drift._plan import Workspace
from drift.errors import PlanError
from drift.layout import Layout, to_dtensor
from drift.modes import ModeSpec
from drift.nn.chunked import (
    accumulate_in_place,
    activate,
    branch,
    chunked_mlp,
    chunked_pointwise,
    mlp_unrecorded,
    pointwise_activation,
)
from drift.nn.embedding import EMBEDDINGS, grid_embedding
from drift.nn.norm import NORMS, GlobalNorm
from drift.nn.pointwise import SKIPS, ChannelMLP, PointwiseLinear, skip_connection
from drift.nn.spectral import SpectralConv, layout_of
from drift.profiling import phase

PROJECTION_WIDTH = 128  # Li et al.'s hidden width of the projection

# neuraloperator 2.0's FNO defaults for the options drift shares (FNO.neuralop_defaults).
NEURALOP_DEFAULTS = dict(
    positional_embedding="grid",
    use_channel_mlp=True,
    channel_mlp_expansion=0.5,
    channel_mlp_skip="soft-gating",
    fno_skip="linear",
    lifting_channel_ratio=2,
    projection_channel_ratio=2,
)


def fno_block(
    spectral: SpectralConv,
    pointwise: PointwiseLinear,
    x: torch.Tensor,
    layout: Layout,
    activation: bool = True,
    non_linearity: Callable[[torch.Tensor], torch.Tensor] = F.gelu,
    *,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """One FNO block on this rank's block ``x``, ``non_linearity(K x + W x)`` (none when ``activation``
    is False). The spectral output is a fresh tensor (or ``out``: a preallocated contiguous tensor of the
    output's shape, outside autograd), so the pointwise gemm accumulates into it a chunk of points at a
    time, with the activation: in place without autograd (``accumulate_in_place``), as one autograd node
    for real data (``pointwise_activation``); complex data and autocast take ``pointwise``'s whole-tensor
    path."""
    # Outside autograd, drift adds W's bias to K's constant mode, sparing a pass over the block.
    fold = out is not None and pointwise.bias is not None and spectral.folds_constants(layout)
    autocast = torch.is_autocast_enabled(x.device.type)
    # K's and W's gradients of x are summed into a pooled tensor (drift.nn.chunked.branch).
    split = torch.is_grad_enabled() and x.requires_grad and not x.is_complex() and not autocast
    x_spectral, x_skip = branch(x) if split else (x, x)
    y = spectral.forward_local(x_spectral, layout, out=out, constant=pointwise.bias if fold else None)
    act = non_linearity if activation else None
    with phase("pointwise+gelu"):
        trained = any(p.requires_grad for p in pointwise.parameters())
        recorded = torch.is_grad_enabled() and (x.requires_grad or y.requires_grad or trained)
        if autocast or (recorded and y.is_complex()):
            y = pointwise(x, add=y)
            return activate(non_linearity, y) if activation else y
        if recorded:
            bias = None if pointwise.bias is None else pointwise.replicated(pointwise.bias)
            return pointwise_activation(pointwise.replicated(pointwise.weight), bias, x_skip, y, act)
        # The dfno methods may return a strided block (their transposes' order), which this writes in place.
        return accumulate_in_place(pointwise.weight, None if fold else pointwise.bias, x, y.contiguous(), act)


def _channels(option: str, ratio: float, width: int, allow_zero: bool) -> int:
    """``int(ratio * width)`` (neuraloperator's rounding), ValueError naming ``option`` if unusable."""
    if isinstance(ratio, bool) or not isinstance(ratio, int | float) or ratio < 0:
        raise ValueError(f"{option} must be a non-negative number, got {ratio!r}")
    channels = int(ratio * width)
    if channels < 1 and not (allow_zero and ratio == 0):
        raise ValueError(f"{option}={ratio!r} gives {channels} channels at width {width}: it must give at least one")
    return channels


class FNO(nn.Module):
    """A Fourier neural operator on ``(batch, in_channels, *spatial)`` fields of any resolution.

    By default Li et al.'s model: a pointwise lift to ``width`` channels, ``n_layers`` blocks ``x =
    gelu(W x + K x)`` (W pointwise, K a ``SpectralConv`` keeping ``modes`` per spatial dim; no activation
    after the last block), and a pointwise projection ``width -> projection_width -> out_channels`` with
    a GeLU between. Parameters are drawn from torch's default generator as the layers are built, so the
    same seed gives the same function for every method.

    neuraloperator 2.0's ``FNO`` options, with its names and meanings (``FNO.neuralop_defaults`` builds
    with its defaults; ``modes`` stay drift's):

    - ``positional_embedding``: "grid" appends d coordinate channels ``j / N`` (each rank its block's).
    - ``lifting_channel_ratio``: 0 lifts with one pointwise layer, r > 0 with two (``int(r * width)``
      hidden channels, ``non_linearity`` between). ``projection_channel_ratio``: the projection's hidden
      width is ``int(r * width)`` (instead of ``projection_width``).
    - ``fno_skip``: the block's skip ("linear" W x, "identity", "soft-gating" per-channel gains). The
      block's bias is K's (``SpectralConv(bias=True)``), or the linear skip's when no norm comes between.
    - ``use_channel_mlp``: after the spectral part of each block, a two-layer ``ChannelMLP``
      (``round(channel_mlp_expansion * width)`` hidden channels, GeLU as neuraloperator's, dropout
      ``channel_mlp_dropout``) plus ``channel_mlp_skip`` of the block's input.
    - ``norm``: "instance_norm" or "group_norm" after K and after the channel MLP, statistics over the
      global field (``GlobalNorm``).
    - ``non_linearity``: the activation (default ``F.gelu``); with a channel MLP or a norm a block applies
      it after both parts, as neuraloperator's; with neither, once (Li et al.).
    - ``complex_data``: complex fields, complex-affine pointwise layers and gains, the activation on real
      and imaginary parts separately; not with ``norm``.

    ``domain_padding`` (a fraction of each spatial extent, one number or one per dim, in [0, 1]) and
    ``domain_padding_mode`` ("symmetric" or "one-sided") take neuraloperator 2.0's values but pad per
    layer: every spectral convolution sees its input zero-padded by ``round(fraction * N)`` points and
    returns the N real points (``SpectralConv``). neuraloperator instead pads once after the lift and
    crops before the projection: the same weights give different functions in the two libraries.
    ``factorization`` ("tucker" or "cp") and ``rank`` hold every spectral weight as factors
    (neuraloperator's TFNO / CP-FNO; see ``SpectralConv``).

    Built on one device it is an ordinary module taking plain tensors; ``drift.nn.parallelize(model,
    mesh, placements)`` makes it take and return DTensors, its spectral weights sharded over the mesh
    and every other parameter replicated.
    """

    def __init__(
        self,
        in_channels: int,
        out_channels: int,
        width: int,
        modes: Sequence[ModeSpec],
        n_layers: int = 4,
        *,
        method: str = "drift",
        factorization: str | None = None,
        rank: float | int | Sequence[int] = 1.0,
        projection_width: int = PROJECTION_WIDTH,
        dtype: torch.dtype | None = None,
        device: torch.device | str | None = None,
        domain_padding: float | Sequence[float] | None = None,
        domain_padding_mode: str = "symmetric",
        positional_embedding: str | None = None,
        lifting_channel_ratio: float = 0,
        projection_channel_ratio: float | None = None,
        fno_skip: str = "linear",
        use_channel_mlp: bool = False,
        channel_mlp_expansion: float = 0.5,
        channel_mlp_dropout: float = 0.0,
        channel_mlp_skip: str = "soft-gating",
        norm: str | None = None,
        non_linearity: Callable[[torch.Tensor], torch.Tensor] = F.gelu,
        complex_data: bool = False,
    ) -> None:
        super().__init__()
        if n_layers < 1:
            raise ValueError(f"n_layers must be at least 1, got {n_layers}")
        if positional_embedding not in EMBEDDINGS:
            raise ValueError(f"positional_embedding must be one of {EMBEDDINGS}, got {positional_embedding!r}")
        if fno_skip not in SKIPS:
            raise ValueError(f"fno_skip must be one of {SKIPS}, got {fno_skip!r}")
        if use_channel_mlp and channel_mlp_skip not in SKIPS:
            raise ValueError(f"channel_mlp_skip must be one of {SKIPS}, got {channel_mlp_skip!r}")
        if norm not in NORMS:
            raise ValueError(f"norm must be one of {NORMS}, got {norm!r}")
        if norm is not None and complex_data:
            raise ValueError(f"norm={norm!r} with complex_data=True is not supported (statistics of real fields)")
        if not callable(non_linearity):
            raise ValueError(f"non_linearity must be a callable such as F.gelu, got {non_linearity!r}")
        if projection_channel_ratio is not None:
            if projection_width != PROJECTION_WIDTH:
                raise ValueError("give projection_width or projection_channel_ratio, not both")
            projection_width = _channels("projection_channel_ratio", projection_channel_ratio, width, False)
        lifting = _channels("lifting_channel_ratio", lifting_channel_ratio, width, True)
        mlp_hidden = round(width * channel_mlp_expansion) if use_channel_mlp else 0
        if use_channel_mlp and mlp_hidden < 1:
            raise ValueError(f"channel_mlp_expansion={channel_mlp_expansion!r} gives {mlp_hidden} hidden channels")
        self.positional_embedding, self.non_linearity, self.norm = positional_embedding, non_linearity, norm
        self.use_channel_mlp, self.complex_data = use_channel_mlp, complex_data
        self.options = dict(
            positional_embedding=positional_embedding,
            lifting_channel_ratio=lifting_channel_ratio,
            projection_channel_ratio=projection_channel_ratio,
            fno_skip=fno_skip,
            use_channel_mlp=use_channel_mlp,
            channel_mlp_expansion=channel_mlp_expansion,
            channel_mlp_dropout=channel_mlp_dropout,
            channel_mlp_skip=channel_mlp_skip,
            norm=norm,
            non_linearity=non_linearity,
            complex_data=complex_data,
        )
        factory = dict(dtype=dtype, device=device)
        pointwise = dict(complex_data=complex_data, **factory)
        padding = dict(domain_padding=domain_padding, domain_padding_mode=domain_padding_mode)
        lift_in = in_channels + (len(modes) if positional_embedding == "grid" else 0)
        self.lift = PointwiseLinear(lift_in, lifting or width, **pointwise)
        self.lift_out = PointwiseLinear(lifting, width, **pointwise) if lifting else None
        self.spectral = nn.ModuleList()
        self.pointwise = nn.ModuleList()
        self.channel_mlp = nn.ModuleList() if use_channel_mlp else None
        self.channel_mlp_skips = nn.ModuleList() if use_channel_mlp else None
        self.norms = nn.ModuleList() if norm else None
        # The block's bias: K's (neuraloperator's place), unless a linear skip without a norm between can
        # carry it, which lets the skip's gemm accumulate into K's output (fno_block).
        conv_bias = fno_skip != "linear" or norm is not None
        for _ in range(n_layers):
            conv = SpectralConv(
                width,
                width,
                modes,
                method=method,
                real=not complex_data,
                bias=conv_bias,
                factorization=factorization,
                rank=rank,
                **padding,
                **factory,
            )
            self.spectral.append(conv)
            if fno_skip == "linear":
                self.pointwise.append(PointwiseLinear(width, width, bias=not conv_bias, **pointwise))
            else:
                self.pointwise.append(skip_connection(fno_skip, width, **pointwise))
            if use_channel_mlp:
                mlp = ChannelMLP(width, width, mlp_hidden, dropout=channel_mlp_dropout, **pointwise)
                self.channel_mlp.append(mlp)
                self.channel_mlp_skips.append(skip_connection(channel_mlp_skip, width, **pointwise))
            if norm:
                self.norms.extend(GlobalNorm(norm, width, **factory) for _ in range(2))
        self.project_hidden = PointwiseLinear(width, projection_width, **pointwise)
        self.project_out = PointwiseLinear(projection_width, out_channels, **pointwise)
        self._activations = Workspace()

    @classmethod
    def neuralop_defaults(
        cls, in_channels: int, out_channels: int, width: int, modes: Sequence[ModeSpec], n_layers: int = 4, **options
    ) -> FNO:
        """An FNO with neuraloperator 2.0's defaults (``NEURALOP_DEFAULTS``: grid embedding, channel MLP
        with expansion 0.5 and a soft-gating skip, linear FNO skip, lifting and projection ratios 2);
        ``options`` override them or set any other argument. ``modes`` are drift's (``k`` keeps ``2k``)."""
        return cls(in_channels, out_channels, width, modes, n_layers, **{**NEURALOP_DEFAULTS, **options})

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``x``: ``(batch, in_channels, *spatial)``, a plain tensor, or a DTensor once parallelized;
        returns ``(batch, out_channels, *spatial)`` alike."""
        first = self.spectral[0]
        if x.dim() != 2 + first.ndim:
            raise ValueError(f"FNO expects (batch, channels, {first.ndim} spatial dims), got shape {tuple(x.shape)}")
        channels = self.lift.weight.shape[1] - (first.ndim if self.positional_embedding == "grid" else 0)
        if x.shape[1] != channels:
            raise ValueError(f"FNO expects {channels} input channels, got shape {tuple(x.shape)}")
        dtype = self.lift.weight.dtype
        if x.dtype != dtype and not torch.is_autocast_enabled(x.device.type):
            raise PlanError(
                f"FNO input is {x.dtype}, the model's parameters are {dtype}: convert one (model.to(dtype)) "
                "or run under torch.autocast"
            )
        layout, local = layout_of(x, first.ndim, first.mesh, first.input_placements)
        y = self.forward_local(local, layout)
        if isinstance(x, DTensor):
            return to_dtensor(y, x.device_mesh, x.placements, (x.shape[0], y.shape[1], *x.shape[2:]))
        return y

    def forward_local(self, x: torch.Tensor, layout: Layout) -> torch.Tensor:
        """The model on this rank's block ``x`` ``(b, in, *layout.local_shape)``.

        Outside autograd the activations between Li et al.'s blocks (linear skip, no channel MLP, no norm)
        live in two resident buffers used in turn, so a forward allocates no block-sized tensor but its
        output: on the CPU a fresh one costs its page faults on every call (glibc maps it afresh). A
        recorded forward (training) releases them, so they never add to a training step's memory."""
        if self.positional_embedding == "grid":
            x = grid_embedding(x, layout)
        buffers = self._activation_buffers(x)
        if self.lift_out is not None:
            x = self.lift_out(activate(self.non_linearity, self.lift(x)), out=buffers[0] if buffers else None)
        else:
            x = self.lift(x, out=buffers[0] if buffers else None)
        for i in range(len(self.spectral)):
            x = self._block(i, x, layout, out=buffers[(i + 1) % 2] if buffers else None)
        return self._project(x)

    def _activation_buffers(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor] | None:
        """Two resident ``(b, width, *spatial)`` buffers for an unrecorded forward of plain blocks on ``x``
        (None under autograd or autocast, or with a channel MLP, a norm or a skip other than linear)."""
        plain = self.channel_mlp is None and self.norms is None
        plain = plain and all(isinstance(skip, PointwiseLinear) for skip in self.pointwise)
        recorded = torch.is_grad_enabled() and (x.requires_grad or any(p.requires_grad for p in self.parameters()))
        if not plain or recorded or torch.is_autocast_enabled(x.device.type):
            if recorded:
                self._activations.clear()
            return None
        width, dtype = self.pointwise[0].weight.shape[0], self.lift.weight.dtype
        shape = (x.shape[0], width, *x.shape[2:])
        return tuple(self._activations.get(("activation", i), shape, dtype, x.device) for i in range(2))

    def _apply(self, fn, recurse=True):
        self._activations.clear()
        return super()._apply(fn, recurse)

    def _block(self, i: int, x: torch.Tensor, layout: Layout, out: torch.Tensor | None = None) -> torch.Tensor:
        """Block ``i`` as neuraloperator's FNOBlocks (post-activation): ``y = act(norm(K x) + skip(x))``,
        then ``act(norm(mlp(y) + mlp_skip(x)))``; no activation after the last block. ``out``: where a
        plain block (``_activation_buffers``) writes its output."""
        activation = i < len(self.spectral) - 1
        spectral, skip = self.spectral[i], self.pointwise[i]
        if isinstance(skip, PointwiseLinear) and self.norms is None:
            y = fno_block(spectral, skip, x, layout, activation, self.non_linearity, out=out)
        else:
            y = spectral.forward_local(x, layout)
            if self.norms is not None:
                y = self.norms[2 * i].forward_local(y, layout)
            y = y + skip(x)
            if activation:
                y = activate(self.non_linearity, y)
        if self.channel_mlp is None and self.norms is None:
            return y
        if self.channel_mlp is not None:
            y = self.channel_mlp[i](y) + self.channel_mlp_skips[i](x)
        if self.norms is not None:
            y = self.norms[2 * i + 1].forward_local(y, layout)
        return activate(self.non_linearity, y) if activation else y

    def _project(self, x: torch.Tensor) -> torch.Tensor:
        """The projection ``out(act(hidden(x)))`` a chunk of points at a time: its hidden layer, the largest
        tensor of an FNO, never exists for the whole block, in the forward pass or for the backward one,
        which recomputes it per chunk (``chunked_mlp``; complex data ``chunked_pointwise``); outside
        autograd through resident chunk-sized buffers (``mlp_unrecorded``). Under autocast, in one
        piece."""
        hidden, out, act = self.project_hidden, self.project_out, self.non_linearity
        if torch.is_autocast_enabled(x.device.type):
            return out(activate(act, hidden(x)))
        params = [layer.replicated(p) for layer in (hidden, out) for p in (layer.weight, layer.bias)]
        if not (torch.is_grad_enabled() and (x.requires_grad or any(p.requires_grad for p in params))):
            return mlp_unrecorded(x, *params, act, self._activations)
        if not x.is_complex():
            return chunked_mlp(x, *params, act)

        def mlp(part, w1, b1, w2, b2):
            h = torch.baddbmm(b1[None, :, None], w1.expand(part.shape[0], -1, -1), part)
            return torch.baddbmm(b2[None, :, None], w2.expand(part.shape[0], -1, -1), activate(act, h))

        per_point = 2 * x.shape[0] * hidden.weight.shape[0] * hidden.weight.element_size()  # h and act(h)
        return chunked_pointwise(mlp, x, params, out.weight.shape[0], per_point)
