"""Whole models to and from neuraloperator 2.0's ``FNO``: the same function, the weights copied.

``from_neuralop(model)`` reads the options ``model`` was built with (neuraloperator records them), checks
that drift computes the same function with them, builds the drift ``FNO`` and copies every weight; the
spectral weights are permuted from neuraloperator's fftshift order (``from_neuralop_weight``).
``to_neuralop`` is the inverse. Both refuse, with a ValueError naming the option, what the other library
computes differently; no rank has started then. One table of parameter pairs serves both directions, so
a round trip returns every tensor unchanged. Factorized spectral weights (neuraloperator's
``factorization="tucker"`` or ``"cp"``) keep their factors: drift's ``FactorizedWeight`` takes the
model's exact rank, and the mode factors' rows are permuted (``from_neuralop_factors``).
"""

from __future__ import annotations

import inspect
import math
from collections.abc import Callable

import torch
from torch import nn
from torch.distributed.tensor import DTensor

from drift.nn.factorized import FACTORIZATIONS
from drift.nn.fno import FNO
from drift.nn.interop import (
    from_neuralop_factors,
    from_neuralop_weight,
    neuralop_n_modes,
    to_neuralop_factors,
    to_neuralop_weight,
)
from drift.nn.pointwise import SKIPS, PointwiseLinear, SoftGating

# neuraloperator options drift does not reproduce, with the value that drift's function needs.
_REFUSED = {
    "domain_padding": (
        None,
        "neuraloperator pads once after the lift and crops before the projection; drift pads each spectral "
        "convolution (FNO(domain_padding=...)), a different function",
    ),
    "resolution_scaling_factor": (None, "drift's blocks keep the input resolution"),
    "fno_block_precision": ("full", "use torch.autocast for mixed precision in drift"),
    "stabilizer": (None, "drift has no tanh stabilizer"),
    "max_n_modes": (None, "drift's modes are fixed at construction"),
    "separable": (False, "drift's spectral weights mix channels"),
    "preactivation": (False, "drift's blocks are post-activation"),
    "complex_data": (
        False,
        "neuraloperator 2.0's complex SpectralConv un-shifts only the leading dims of its spectrum and its "
        "ComplexValued wrappers are no complex-affine layers; drift's complex_data=True computes a different "
        "function",
    ),
}


def _neuralop():
    try:
        from neuralop.layers.embeddings import GridEmbeddingND
        from neuralop.layers.spectral_convolution import SpectralConv
        from neuralop.models import FNO as NeuralopFNO
    except ImportError as exc:
        raise ImportError("neuraloperator interop needs the neuraloperator package") from exc
    return NeuralopFNO, SpectralConv, GridEmbeddingND


def _options(model: nn.Module, cls: type) -> dict:
    """The arguments ``model`` was built with, positional ones included (neuraloperator records both)."""
    recorded = dict(model._init_kwargs)
    options = {k: v for k, v in recorded.items() if k not in ("args", "_name", "_version")}
    options.update(inspect.signature(cls).bind_partial(*recorded.get("args", ())).arguments)
    return options


def drift_modes(n_modes) -> tuple:
    """drift's ``modes`` keeping what a real neuraloperator layer with ``n_modes`` keeps: on leading dims
    ``k = n / 2`` for even n, else the frequencies ``-(n // 2) .. n - n // 2 - 1``; on the last dim
    ``n // 2 + 1`` frequencies from 0."""
    modes: list = []
    for n in n_modes[:-1]:
        modes.append(n // 2 if n % 2 == 0 else [*range(n - n // 2), *range(-(n // 2), 0)])
    return (*modes, n_modes[-1] // 2 + 1)


def _nominal_shape(model: FNO) -> tuple[int, ...]:
    """A resolution holding every kept mode: the permutations depend on the kept frequencies only."""
    return tuple(2 * k + 2 for k in model.blocks[0].spectral.mode_shape)


def _pairs(ours: FNO) -> list[tuple[str, str, Callable, Callable]]:
    """``(drift name, neuraloperator name, to drift, to neuraloperator)`` for every parameter."""
    d = ours.blocks[0].spectral.ndim
    pairs = []

    def conv1d(mine: str, theirs: str, bias: bool = True) -> None:
        pairs.append((f"{mine}.weight", f"{theirs}.weight", lambda t: t[..., 0], lambda t: t[..., None]))
        if bias:
            pairs.append((f"{mine}.bias", f"{theirs}.bias", lambda t: t, lambda t: t))

    def skip(module: nn.Module, mine: str, theirs: str) -> None:
        if isinstance(module, SoftGating):
            pairs.append((f"{mine}.weight", f"{theirs}.weight", torch.flatten, lambda t: t.view(1, -1, *[1] * d)))
        elif isinstance(module, PointwiseLinear):
            conv1d(mine, f"{theirs}.conv", bias=False)

    conv1d("lift", "lifting.fcs.0")
    if ours.lift_out is not None:
        conv1d("lift_out", "lifting.fcs.1")
    shape, spec = _nominal_shape(ours), ours.blocks[0].spectral.mode_spec
    for i, block in enumerate(ours.blocks):
        conv, mine = block.spectral, f"blocks.{i}"
        if conv.factorization is None:  # factors move as one state dict per layer (from_neuralop, to_neuralop)
            pairs.append(
                (
                    f"{mine}.spectral.weight",
                    f"fno_blocks.convs.{i}.weight.tensor",
                    lambda t: from_neuralop_weight(t, shape, spec),
                    lambda t: to_neuralop_weight(t, shape, spec),
                )
            )
        # neuraloperator's convolution carries the block's bias; drift's linear skip does when there is one.
        holder = f"{mine}.spectral.bias" if conv.bias is not None else f"{mine}.skip.bias"
        pairs.append((holder, f"fno_blocks.convs.{i}.bias", torch.flatten, lambda t: t.view(-1, *[1] * d)))
        skip(block.skip, f"{mine}.skip", f"fno_blocks.fno_skips.{i}")
        if block.channel_mlp is not None:
            for j in range(len(block.channel_mlp.fcs)):
                conv1d(f"{mine}.channel_mlp.fcs.{j}", f"fno_blocks.channel_mlp.{i}.fcs.{j}")
            skip(block.channel_mlp_skip, f"{mine}.channel_mlp_skip", f"fno_blocks.channel_mlp_skips.{i}")
        # neuraloperator's norms are one list, two per block.
        for j, part in enumerate(("norm", "mlp_norm")):
            norm = getattr(block, part)
            if norm is not None and norm.kind == "group_norm":
                for name in ("weight", "bias"):
                    theirs = f"fno_blocks.norm.{2 * i + j}.{name}"
                    pairs.append((f"{mine}.{part}.{name}", theirs, lambda t: t, lambda t: t))
    conv1d("project_hidden", "projection.fcs.0")
    conv1d("project_out", "projection.fcs.1")
    return pairs


def _factorization(options: dict, model: nn.Module) -> tuple[str | None, float | int | tuple[int, ...]]:
    """drift's ``factorization`` and ``rank`` holding exactly the factors of ``model``'s spectral weights
    (the rank read from their shapes: whatever rank neuraloperator's rounding gave)."""
    name = options.get("factorization")
    kind = None if name is None or str(name).lower() == "dense" else str(name).lower()
    if kind is None:
        return None, 1.0
    if kind not in FACTORIZATIONS:
        raise ValueError(f"from_neuralop: factorization={name!r} is not supported (None, {', '.join(FACTORIZATIONS)})")
    weight = model.fno_blocks.convs[0].weight
    if kind == "tucker":
        return kind, tuple(weight.core.shape)
    return kind, int(weight.weights.shape[0])


def _check_double_activation(options: dict, n_layers: int, where: str) -> None:
    if not options["use_channel_mlp"] and options["norm"] is None and n_layers > 1:
        raise ValueError(
            f"{where}: use_channel_mlp=False with norm=None: neuraloperator 2.0 then applies non_linearity twice "
            "between blocks (gelu(gelu(x))), drift once (Li et al.'s FNO); use a channel MLP or a norm"
        )


def from_neuralop(model: nn.Module, *, method: str = "drift", dtype=None, device=None) -> FNO:
    """A drift ``FNO`` computing what neuraloperator 2.0 ``FNO`` ``model`` computes on real fields, with
    ``model``'s weights (in ``dtype``, default float32, on ``device``) and drift's ``method``."""
    NeuralopFNO, NeuralopConv, GridEmbeddingND = _neuralop()
    if not isinstance(model, NeuralopFNO):
        raise ValueError(f"from_neuralop takes a neuraloperator FNO, got {type(model).__name__}")
    options = _options(model, NeuralopFNO)
    padding = options.get("domain_padding")
    if not padding or not isinstance(padding, int | float) and not sum(padding):  # neuraloperator pads nothing
        options["domain_padding"] = None
    for name, (value, why) in _REFUSED.items():
        if options.get(name, value) != value:
            raise ValueError(f"from_neuralop: {name}={options[name]!r} is not supported: {why}")
    factorization, rank = _factorization(options, model)
    if options["conv_module"] is not NeuralopConv:
        raise ValueError(f"from_neuralop: conv_module={options['conv_module'].__name__} is not supported")
    if options["norm"] not in (None, "group_norm", "instance_norm"):
        raise ValueError(f"from_neuralop: norm={options['norm']!r} is not supported (None, group_norm, instance_norm)")
    embedding = model.positional_embedding
    if embedding is not None and (
        type(embedding) is not GridEmbeddingND or [list(b) for b in embedding.grid_boundaries] != [[0, 1]] * model.n_dim
    ):
        raise ValueError(
            "from_neuralop: positional_embedding must be 'grid' (GridEmbeddingND on the unit cube) or None, "
            f"got {embedding!r}"
        )
    for name in ("fno_skip", "channel_mlp_skip") if options["use_channel_mlp"] else ("fno_skip",):
        if options[name] not in SKIPS:
            raise ValueError(f"from_neuralop: {name}={options[name]!r} is not supported (one of {SKIPS})")
    _check_double_activation(options, model.n_layers, "from_neuralop")
    if any(conv.bias is None for conv in model.fno_blocks.convs):
        raise ValueError("from_neuralop: spectral convolutions without a bias are not supported")
    with torch.random.fork_rng(devices=[]):
        ours = FNO(
            model.in_channels,
            model.out_channels,
            model.hidden_channels,
            drift_modes(tuple(options["n_modes"])),
            model.n_layers,
            method=method,
            factorization=factorization,
            rank=rank,
            dtype=dtype,
            device=device,
            positional_embedding="grid" if embedding is not None else None,
            lifting_channel_ratio=options["lifting_channel_ratio"],
            projection_channel_ratio=options["projection_channel_ratio"],
            fno_skip=options["fno_skip"],
            use_channel_mlp=options["use_channel_mlp"],
            channel_mlp_expansion=options["channel_mlp_expansion"],
            channel_mlp_dropout=options["channel_mlp_dropout"],
            channel_mlp_skip=options["channel_mlp_skip"],
            norm=options["norm"],
            non_linearity=options["non_linearity"],
        )
    theirs = model.state_dict()
    mine = ours.state_dict()
    state = {}
    for name, their_name, to_drift, _ in _pairs(ours):
        state[name] = to_drift(theirs[their_name].detach())
    if factorization is not None:
        shape, spec = _nominal_shape(ours), ours.blocks[0].spectral.mode_spec
        for i, conv in enumerate(model.fno_blocks.convs):
            factors = from_neuralop_factors(conv.weight, shape, spec)
            state.update({f"blocks.{i}.spectral.weight.{k}": v for k, v in factors.items()})
    ours.load_state_dict({k: v.to(dtype=mine[k].dtype, device=mine[k].device) for k, v in state.items()})
    ours.train(model.training)
    return ours


def to_neuralop(ours: FNO) -> nn.Module:
    """A neuraloperator 2.0 ``FNO`` (float32, on the CPU) computing what drift ``FNO`` ``ours`` computes,
    with its weights (a parallelized model's sharded weights are gathered: call it on every rank)."""
    NeuralopFNO, _, _ = _neuralop()
    options = dict(ours.options)
    spectral = ours.blocks[0].spectral
    if options["complex_data"]:
        raise ValueError(f"to_neuralop: complex_data=True is not supported: {_REFUSED['complex_data'][1]}")
    if any(spectral.domain_padding):
        raise ValueError(f"to_neuralop: domain_padding is not supported: {_REFUSED['domain_padding'][1]}")
    _check_double_activation(options, len(ours.blocks), "to_neuralop")
    width = ours.lift_out.weight.shape[0] if ours.lift_out is not None else ours.lift.weight.shape[0]
    projection = ours.project_hidden.weight.shape[0]
    ratio = projection / width
    while int(ratio * width) < projection:  # neuraloperator truncates ratio * width
        ratio = math.nextafter(ratio, math.inf)
    d = spectral.ndim
    in_channels = ours.lift.weight.shape[1] - (d if options["positional_embedding"] == "grid" else 0)
    factorization, rank = spectral.factorization, 1.0
    if factorization is not None:
        rank = spectral.weight.rank
    with torch.random.fork_rng(devices=[]):
        theirs = NeuralopFNO(
            n_modes=neuralop_n_modes(_nominal_shape(ours), spectral.mode_spec),
            in_channels=in_channels,
            out_channels=ours.project_out.weight.shape[0],
            hidden_channels=width,
            n_layers=len(ours.blocks),
            lifting_channel_ratio=options["lifting_channel_ratio"],
            projection_channel_ratio=ratio,
            positional_embedding=options["positional_embedding"],
            non_linearity=options["non_linearity"],
            norm=options["norm"],
            use_channel_mlp=options["use_channel_mlp"],
            channel_mlp_dropout=options["channel_mlp_dropout"],
            channel_mlp_expansion=options["channel_mlp_expansion"],
            channel_mlp_skip=options["channel_mlp_skip"],
            fno_skip=options["fno_skip"],
            factorization=factorization,
            rank=rank,
        )
    mine = {k: (v.full_tensor() if isinstance(v, DTensor) else v).detach().cpu() for k, v in ours.state_dict().items()}
    state = theirs.state_dict()
    for name, their_name, _, to_theirs in _pairs(ours):
        state[their_name] = to_theirs(mine[name]).to(state[their_name].dtype)
    if factorization is not None:
        shape, spec = _nominal_shape(ours), spectral.mode_spec
        for i in range(len(ours.blocks)):
            prefix = f"blocks.{i}.spectral.weight."
            own = {k.removeprefix(prefix): v for k, v in mine.items() if k.startswith(prefix)}
            for k, v in to_neuralop_factors(own, shape, spec).items():
                key = f"fno_blocks.convs.{i}.weight.{k}"
                state[key] = v.to(state[key].dtype)
    theirs.load_state_dict(state)
    theirs.train(ours.training)
    return theirs
