"""Fourier neural operators: Li et al.'s FNO and neuraloperator 2.0's options, single-device or over
spatially sharded fields."""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from functools import partial

import torch
from torch import nn
from torch.distributed.tensor import DTensor
from torch.nn import functional as F
from torch.utils.checkpoint import checkpoint

from drift._compat import ConversionHooks
from drift._moved import deprecated as _deprecated
from drift.errors import PlanError
from drift.layout import Layout, to_dtensor
from drift.modes import ModeSpec
from drift.nn.block import FNOBlock
from drift.nn.chunked import activate
from drift.nn.embedding import EMBEDDINGS, grid_coordinates, grid_embedding
from drift.nn.executor import Executor
from drift.nn.norm import NORMS
from drift.nn.pointwise import SKIPS, PointwiseLinear
from drift.nn.spectral import layout_of
from drift.nn.streaming import block_in_place, lift_into
from drift.profiling import phase
from drift.recording import autocasting, recorded

PROJECTION_WIDTH = 128  # Li et al.'s hidden width of the projection
# The streaming forward's fields between blocks by name (``--activations``): None keeps the parameters' dtype.
ACTIVATION_DTYPES = {"float32": None, "bfloat16": torch.bfloat16}

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


def _channels(option: str, ratio: float, width: int, allow_zero: bool) -> int:
    """``int(ratio * width)`` (neuraloperator's rounding), ValueError naming ``option`` if unusable."""
    if isinstance(ratio, bool) or not isinstance(ratio, int | float) or ratio < 0:
        raise ValueError(f"{option} must be a non-negative number, got {ratio!r}")
    channels = int(ratio * width)
    if channels < 1 and not (allow_zero and ratio == 0):
        raise ValueError(f"{option}={ratio!r} gives {channels} channels at width {width}: it must give at least one")
    return channels


class FNO(ConversionHooks):
    """A Fourier neural operator on ``(batch, in_channels, *spatial)`` fields of any resolution.

    By default Li et al.'s model: a pointwise lift to ``width`` channels, ``n_layers`` blocks ``x =
    gelu(W x + K x)`` (W pointwise, K a ``SpectralConv`` keeping ``modes`` per spatial dim; no activation
    after the last block), and a pointwise projection ``width -> projection_width -> out_channels`` with
    a GeLU between. Its parts: ``lift`` (and ``lift_out``), ``blocks`` (``FNOBlock`` s, each with named
    parts ``spectral``, ``skip``, ``norm``, ``channel_mlp``, ``channel_mlp_skip``, ``mlp_norm``),
    ``project_hidden`` and ``project_out``; the fast paths of its forward are ``executor``'s
    (``drift.nn.executor``). State dicts and checkpoints saved before the blocks were modules (keys such
    as ``spectral.0.weight``) load: their keys are renamed (``former_name``). Parameters are drawn from
    torch's default generator as the layers are built, so the same seed gives the same function for
    every method.

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

    ``recompute``: a recorded forward keeps each block's input alone and the backward pass recomputes the
    block's activations (``torch.utils.checkpoint``, non-reentrant), its collectives rerun in the forward's
    order on every rank: about half a training step's activation memory, for one more forward of the
    blocks. The gradients are bitwise those of the stored path. ``recompute_mlp``: each block's channel MLP,
    its skip and the activation after them run as one node that recomputes the MLP's hidden layer in the
    backward pass (``FNOBlock``), and so does the two-layer lift (as the projection always does): fewer
    fields kept and less time a step, the gradients equal up to rounding. ``set_recompute`` sets either on
    a built or parallelized model; the attributes ``recompute`` and ``recompute_mlp`` read them.

    Built on one device it is an ordinary module taking plain tensors; ``drift.nn.parallelize(model,
    mesh, placements)`` makes it take and return DTensors, its spectral weights sharded over the mesh
    and every other parameter replicated.

    Example, a 2-D FNO on one device (``drift.nn.parallelize`` distributes it):

    >>> import torch
    >>> from drift.nn import FNO
    >>> model = FNO(3, 1, width=8, modes=(4, 4), n_layers=2)
    >>> model(torch.randn(2, 3, 32, 32)).shape
    torch.Size([2, 1, 32, 32])
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
        recompute: bool = False,
        recompute_mlp: bool = False,
        activations: torch.dtype | None = None,
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
        self.blocks = nn.ModuleList(
            FNOBlock(
                width,
                modes,
                activation=i < n_layers - 1,
                non_linearity=non_linearity,
                method=method,
                factorization=factorization,
                rank=rank,
                fno_skip=fno_skip,
                channel_mlp_hidden=mlp_hidden,
                channel_mlp_dropout=channel_mlp_dropout,
                channel_mlp_skip=channel_mlp_skip,
                norm=norm,
                complex_data=complex_data,
                recompute_mlp=recompute_mlp,
                **padding,
                **factory,
            )
            for i in range(n_layers)
        )
        self.project_hidden = PointwiseLinear(width, projection_width, **pointwise)
        self.project_out = PointwiseLinear(projection_width, out_channels, **pointwise)
        self.executor = Executor()
        self.recompute = recompute
        if activations not in (None, torch.bfloat16, torch.float16, dtype or torch.get_default_dtype()):
            raise ValueError(f"activations must be None, torch.bfloat16 or torch.float16, got {activations!r}")
        self.activations = activations
        self.register_load_state_dict_pre_hook(_former_keys_renamed)

    @classmethod
    def neuralop_defaults(
        cls, in_channels: int, out_channels: int, width: int, modes: Sequence[ModeSpec], n_layers: int = 4, **options
    ) -> FNO:
        """An FNO with neuraloperator 2.0's defaults (``NEURALOP_DEFAULTS``: grid embedding, channel MLP
        with expansion 0.5 and a soft-gating skip, linear FNO skip, lifting and projection ratios 2);
        ``options`` override them or set any other argument. ``modes`` are drift's (``k`` keeps ``2k``)."""
        return cls(in_channels, out_channels, width, modes, n_layers, **{**NEURALOP_DEFAULTS, **options})

    @classmethod
    def from_neuralop(cls, model: nn.Module, **options) -> FNO:
        """Deprecated since 0.2.0, goes in 0.3.0: ``drift.nn.from_neuralop(model, **options)``."""
        _deprecated("FNO.from_neuralop", "drift.nn.from_neuralop")
        from drift.nn.neuralop import from_neuralop  # neuralop imports this module: here only on use

        return from_neuralop(model, **options)

    def to_neuralop(self) -> nn.Module:
        """Deprecated since 0.2.0, goes in 0.3.0: ``drift.nn.to_neuralop(fno)``."""
        _deprecated("FNO.to_neuralop", "drift.nn.to_neuralop")
        from drift.nn.neuralop import to_neuralop  # neuralop imports this module: here only on use

        return to_neuralop(self)

    @staticmethod
    def former_name(name: str) -> str:
        """The name of the state-dict entry ``name`` before the blocks were ``FNOBlock`` s: how
        ``drift.checkpoint`` reads a checkpoint written then."""
        return former_name(name)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``x``: ``(batch, in_channels, *spatial)``, a plain tensor, or a DTensor once parallelized;
        returns ``(batch, out_channels, *spatial)`` alike."""
        first = self.blocks[0].spectral
        if x.dim() != 2 + first.ndim:
            raise ValueError(f"FNO expects (batch, channels, {first.ndim} spatial dims), got shape {tuple(x.shape)}")
        channels = self.lift.weight.shape[1] - (first.ndim if self.positional_embedding == "grid" else 0)
        if x.shape[1] != channels:
            raise ValueError(f"FNO expects {channels} input channels, got shape {tuple(x.shape)}")
        dtype = self.lift.weight.dtype
        if x.dtype != dtype and not autocasting(x):
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
        """The model on this rank's block ``x`` ``(b, in, *layout.local_shape)``: the lift, the blocks, the
        projection; each writes where ``self.executor`` says (resident buffers outside autograd)."""
        with phase("lift+projection"):
            width, dtype = self.project_hidden.weight.shape[1], self.lift.weight.dtype
            plain = all(block.streams for block in self.blocks)
            streams, outputs = self.executor.outputs(x, width, dtype, plain, self.parameters(), self.activations)
            grid = self.positional_embedding == "grid"
            if grid and not streams:
                x = grid_embedding(x, layout)
            if streams:
                coordinates = partial(grid_coordinates, layout) if grid else None
                lift_options = dict(lift_out=self.lift_out, act=self.non_linearity, coordinates=coordinates)
                x = lift_into(self.lift, x, next(outputs), self.executor.work, **lift_options)
            elif self.lift_out is not None and self.recompute_mlp and recorded(x, *self.lift.parameters()):
                # the lift's hidden layer recomputed in the backward pass, as the projection's is
                x = self.executor.project(self.lift, self.lift_out, self.non_linearity, x)
            elif self.lift_out is not None:
                x = self.lift_out(activate(self.non_linearity, self.lift(x)), out=next(outputs))
            else:
                x = self.lift(x, out=next(outputs))
        for block in self.blocks:
            self.executor.lend(block.spectral, layout)
            if streams:
                x = block_in_place(block, x, layout, self.executor.work)
            elif self.recompute and recorded(x, *block.parameters()):
                # Keeps the block's input alone; the backward pass reruns the block, its collectives included,
                # in the same order on every rank (each rank's autograd walks the same graph).
                x = checkpoint(block.forward_local, x, layout, use_reentrant=False)
            else:
                x = block.forward_local(x, layout, out=next(outputs))
        with phase("lift+projection"):
            return self.executor.project(self.project_hidden, self.project_out, self.non_linearity, x)

    @property
    def recompute_mlp(self) -> bool:
        """Whether the blocks' channel-MLP tails (``FNOBlock.recompute_mlp``) and the two-layer lift recompute
        their hidden layers."""
        return any(block.recompute_mlp for block in self.blocks)

    @recompute_mlp.setter
    def recompute_mlp(self, enabled: bool) -> None:
        for block in self.blocks:
            block.recompute_mlp = bool(enabled)

    def _before_conversion(self) -> None:
        self.executor.clear()


RECOMPUTE = ("blocks", "mlp")


def set_recompute(model: nn.Module, enabled: bool | str | None = True) -> nn.Module:
    """Set what every ``FNO`` in ``model`` (``model`` itself one included), built or parallelized, recomputes
    in the backward pass (see ``FNO``): "blocks" (or True) its blocks (``recompute``), "mlp" its blocks'
    channel-MLP hidden layers (``recompute_mlp``), False or None nothing; returns ``model``. ValueError when
    ``model`` holds no FNO or for another choice."""
    choice = ("blocks" if enabled else None) if isinstance(enabled, bool) else enabled
    if choice not in (None, *RECOMPUTE):
        raise ValueError(f"set_recompute: enabled must be a bool, None or one of {RECOMPUTE}, got {enabled!r}")
    models = [m for m in model.modules() if isinstance(m, FNO)]
    if not models:
        raise ValueError(f"set_recompute: {type(model).__name__} holds no drift.nn.FNO")
    for fno in models:
        fno.recompute = choice == "blocks"
        fno.recompute_mlp = choice == "mlp"
    return model


# Where block i's parts were before the FNO was a stack of FNOBlocks (commit 9ebfdf8): (part, the former
# list of that part, entries of the list per block, which of them).
_FORMER = (
    ("spectral", "spectral", 1, 0),
    ("skip", "pointwise", 1, 0),
    ("channel_mlp", "channel_mlp", 1, 0),
    ("channel_mlp_skip", "channel_mlp_skips", 1, 0),
    ("norm", "norms", 2, 0),
    ("mlp_norm", "norms", 2, 1),
)
_CURRENT = re.compile(r"blocks\.(\d+)\.(\w+)\.(.+)")
_FORMER_NAME = re.compile(r"(spectral|pointwise|channel_mlp|channel_mlp_skips|norms)\.(\d+)\.(.+)")


def former_name(name: str) -> str:
    """The name an FNO's state-dict entry ``name`` had before its blocks were ``FNOBlock`` s
    (``blocks.1.norm.weight`` was ``norms.2.weight``); other names are unchanged."""
    found = _CURRENT.fullmatch(name)
    if found is None:
        return name
    i, part, rest = int(found[1]), found[2], found[3]
    for current, former, per_block, which in _FORMER:
        if part == current:
            return f"{former}.{per_block * i + which}.{rest}"
    return name


def current_name(name: str) -> str:
    """``former_name``'s inverse: the name today of an FNO state-dict entry named ``name`` before."""
    found = _FORMER_NAME.fullmatch(name)
    if found is None:
        return name
    former, k, rest = found[1], int(found[2]), found[3]
    for current, listed, per_block, which in _FORMER:
        if listed == former and k % per_block == which:
            return f"blocks.{k // per_block}.{current}.{rest}"
    return name


def _former_keys_renamed(module, state_dict, prefix, *args) -> None:
    """A state dict saved before the FNO was a stack of FNOBlocks loads: its keys are renamed in place."""
    for key in [k for k in state_dict if k.startswith(prefix)]:
        name = current_name(key[len(prefix) :])
        if prefix + name != key:
            state_dict[prefix + name] = state_dict.pop(key)
