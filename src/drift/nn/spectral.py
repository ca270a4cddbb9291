"""FNO spectral convolutions, single-device or distributed: DRIFT, DFNO and pruned DFNO.

All three compute, on every rank's block, the single-device FNO spectral convolution

    y = irfftn(zero_fill(einsum("bi...,io...->bo...", rfftn(x)[modes], W)), s=x.shape[2:])

(fftn / ifftn for complex fields) with the weight ``W`` of shape ``(in, out, K1, ..., Kd)`` over the
retained modes, per dim ``0..k-1`` then ``-k..-1`` (``0..k-1`` on the last dim of a real layer). With
``domain_padding`` ``x`` is zero-padded first, the modes are those of the padded extents, and ``y`` is
cropped back to ``x``'s points (``drift.nn.padding``). The resolution comes from the input: a plan is
built for each global shape the layer meets and kept in a small cache. Built on one device the layer
is an ordinary module; ``drift.nn.parallelize`` makes it distributed (``SpectralConv.distribute_``), and
the methods (``drift.nn.methods``: "drift", "dfno-pruned", "dfno") differ in how the spectrum is reached
and which share of ``W`` a rank stores (its ``weight`` is then a DTensor).

With ``factorization`` ("tucker" or "cp", neuraloperator's TFNO / CP-FNO) ``W`` is held as small
factors (``drift.nn.factorized``), replicated on every rank, their gradients summed over the mesh; each
rank rebuilds only the part of ``W`` it multiplies (its K1 share, spectral block or modes), never all
of ``W``.
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence

import torch
from torch import nn
from torch.distributed.tensor import DTensor, Replicate, distribute_tensor

from drift import comm
from drift._plan import ComplexModule, complex_dtype, real_dtype
from drift.cost import Machine, MethodChoice, choose_method
from drift.errors import PlanError
from drift.layout import Layout, dtensor_layout, input_roles, to_dtensor
from drift.modes import ModeSpec, mode_counts, mode_lists
from drift.nn.factorized import FactorizedWeight
from drift.nn.methods import METHODS, SpectralMethod, candidates, method_named
from drift.nn.mixing import mix_channels
from drift.nn.padding import check_padding_mode, padding_at, padding_fractions
from drift.nn.replicated import first_rank_value, replicate_over
from drift.profiling import phase
from drift.recording import autocasting

__all__ = [
    "AUTO",
    "METHODS",
    "SpectralConv",
    "layout_of",
    "mix_channels",
    "mode_counts",
    "resolve_methods",
    "spectral_weight",
]

AUTO = "auto"  # a method chosen by drift.cost's model (resolve_methods)
MAX_PLANS = 4  # plans kept per layer (resolutions and layouts met most recently)


def spectral_weight(
    in_channels: int, out_channels: int, mode_shape: Sequence[int], dtype: torch.dtype = torch.float32
) -> torch.Tensor:
    """Li et al.'s initial spectral weight: ``1 / (in * out)`` times uniform [0, 1) real and imaginary
    parts, ``(in, out, *mode_shape)`` complex, drawn on the CPU from torch's default generator."""
    w = torch.rand((in_channels, out_channels, *mode_shape), dtype=complex_dtype(dtype))
    return w / (in_channels * out_channels)


def _plan_key(layout: Layout) -> str:
    shape = "x".join(map(str, layout.global_shape))
    return shape + "_" + "".join("r" if a is None else f"m{a}" for a in layout.axes)


class SpectralConv(ComplexModule):
    """An FNO spectral convolution on ``(batch, in_channels, *spatial)`` fields of any resolution.

    Args:
        in_channels, out_channels: channel counts.
        modes: retained modes per spatial dim (1 to 4 dims): Li et al.'s k, or explicit frequency lists
            (see ``drift.modes.mode_indices``); every extent must hold them.
        method: "drift", "dfno" or "dfno-pruned" (``drift.nn.methods``), which compute the same function,
            or "auto" (the one ``drift.cost``'s cost model predicts fastest, chosen once by
            ``resolve_methods`` where the grid and mesh are known: at ``parallelize``, or at the first
            input on one device).
        real: real fields (rfftn / irfftn), else complex (fftn / ifftn).
        bias: add a real per-channel bias ``(out,)`` to the output (neuraloperator's ``bias=True``),
            drawn after the weight as neuraloperator's, ``sqrt(2 / (in + out))`` times a normal;
            replicated once parallelized.
        factorization: None (a dense weight), "tucker" or "cp": the weight held as factors of that
            ``rank`` (a float: the fraction of the dense parameter count; an int or a Tucker tuple: the
            rank itself), as neuraloperator's ``factorization`` / ``rank`` (``drift.nn.factorized``).
        dtype, device: the weight's real precision (float32 or float64; default torch's default dtype)
            and device.
        domain_padding: zero padding of the input as a fraction of each spatial extent (one number,
            or one per dim, in [0, 1]): ``round(fraction * N)`` zeros, recomputed at every resolution,
            as neuraloperator 2.0's ``domain_padding``. "drift" pads implicitly (its bases; no padded
            tensor, the same communication); the dfno methods pad the tensor, which on a mesh they
            support only on dims whole on every rank (``parallelize`` refuses the others).
        domain_padding_mode: "symmetric" (both sides, neuraloperator 2.0) or "one-sided" (after).

    ``weight``: ``(in, out, K1, ..., Kd)`` complex, initialised as Li et al. from torch's default
    generator; factorized, a ``FactorizedWeight`` of that shape (initialised as neuraloperator). Input
    and output are plain tensors on one device, or DTensors once the layer (or its model) is
    parallelized by ``drift.nn.parallelize``. Under ``torch.autocast`` the transform and the
    channel mixing run in the weight's precision (float32 / complex64) and return it.

    ``method`` reads the method's name ("auto" until it is resolved), ``spectral_method`` the
    ``drift.nn.methods`` object the layer holds, ``choice`` what "auto" chose and why.

    Example, on one device (``drift.nn.parallelize`` distributes it):

    >>> import torch
    >>> from drift.nn import SpectralConv
    >>> conv = SpectralConv(3, 2, modes=(4, 3))
    >>> conv.weight.shape  # (in, out, 2 x 4 kept frequencies of x, 3 of y's half spectrum)
    torch.Size([3, 2, 8, 3])
    >>> conv(torch.randn(5, 3, 16, 12)).shape
    torch.Size([5, 2, 16, 12])
    """

    def __init__(
        self,
        in_channels: int,
        out_channels: int,
        modes: Sequence[ModeSpec],
        *,
        method: str = "drift",
        real: bool = True,
        bias: bool = False,
        factorization: str | None = None,
        rank: float | int | Sequence[int] = 1.0,
        dtype: torch.dtype | None = None,
        device: torch.device | str | None = None,
        domain_padding: float | Sequence[float] | None = None,
        domain_padding_mode: str = "symmetric",
    ) -> None:
        super().__init__()
        dtype = dtype or torch.get_default_dtype()
        self._method = None if method == AUTO else method_named(method)  # ValueError naming the choices
        if in_channels < 1 or out_channels < 1:
            raise ValueError(f"channel counts must be positive, got {in_channels} and {out_channels}")
        self.in_channels, self.out_channels, self.real = in_channels, out_channels, real
        self.mode_shape = mode_counts(modes, real)
        self.mode_spec = tuple(m if isinstance(m, int) else tuple(m) for m in modes)
        self.domain_padding = padding_fractions(domain_padding, len(self.mode_shape))
        self.domain_padding_mode = check_padding_mode(domain_padding_mode)
        self.factorization = factorization
        if factorization is None:
            self.weight = nn.Parameter(spectral_weight(in_channels, out_channels, self.mode_shape, dtype).to(device))
        else:
            shape = (in_channels, out_channels, *self.mode_shape)
            self.weight = FactorizedWeight(shape, factorization, rank, dtype=dtype, device=device)
        if bias:
            std = (2 / (in_channels + out_channels)) ** 0.5
            bias_draw = std * torch.randn(out_channels, dtype=torch.float64)
            self.bias = nn.Parameter(bias_draw.to(dtype=dtype, device=device))
        else:
            self.bias = None
        self.mesh = None
        self.input_placements: tuple | None = None  # set by distribute_: the placements inputs must have
        self.reduction = None  # set by distribute_: drift's reduction mesh, or None (one step per mesh dim)
        self.overlap = 1  # set by distribute_: drift's pieces of the spectrum's collectives (drift.truncated._overlap)
        self.data_axes: tuple[int, ...] = ()
        self.plans = nn.ModuleDict()
        self.choice: MethodChoice | None = None  # what method="auto" chose, and why

    def extra_repr(self) -> str:
        where = "" if self.mesh is None else f", mesh={tuple(self.mesh.shape)}, placements={self.input_placements}"
        if self.factorization is not None:
            where = f", factorization={self.factorization!r}{where}"
        if any(self.domain_padding):
            where = f", domain_padding={self.domain_padding} ({self.domain_padding_mode}){where}"
        if self.bias is not None:
            where = f", bias=True{where}"
        if self.reduction is not None:
            where += f", reduction={tuple(self.reduction.shape)}"
        if self.overlap != 1:
            where += f", overlap={self.overlap}"
        if self.choice is not None:
            where += f" ({self.choice})"
        return f"{self.in_channels}, {self.out_channels}, mode_shape={self.mode_shape}, method={self.method!r}{where}"

    def _load_from_state_dict(self, state_dict, prefix, *args, **kwargs):
        """A whole weight loads into a parallelized layer (each rank keeps its share, no communication)
        and a DTensor weight into a single-device one (gathered whole): state dicts move freely between
        one device and any mesh."""
        key = prefix + "weight"
        value = state_dict.get(key)
        if isinstance(value, torch.Tensor) and value.shape == self.weight.shape:
            if isinstance(self.weight, DTensor) and not isinstance(value, DTensor):
                w = self.weight
                state_dict[key] = distribute_tensor(value.to(w.device), w.device_mesh, w.placements, src_data_rank=None)
            elif isinstance(value, DTensor) and not isinstance(self.weight, DTensor):
                state_dict[key] = value.full_tensor()
        super()._load_from_state_dict(state_dict, prefix, *args, **kwargs)

    @property
    def method(self) -> str:
        """The method's name: "drift", "dfno" or "dfno-pruned", or "auto" until ``resolve_methods``."""
        return AUTO if self._method is None else self._method.name

    @method.setter
    def method(self, name: str) -> None:
        """Deprecated: the method is chosen at construction, "auto" resolved by ``resolve_methods``. On one
        device the layer then computes with ``name`` (its plans are rebuilt); a parallelized layer
        refuses (its weight is stored as its method places it)."""
        warnings.warn(
            "setting SpectralConv.method is deprecated: choose it at construction (method=...), and resolve "
            "'auto' with drift.nn.resolve_methods",
            DeprecationWarning,
            stacklevel=3,  # past torch's Module.__setattr__, to the assignment
        )
        if self.mesh is not None:
            raise ValueError(f"{type(self).__name__} is parallelized for method {self.method!r}: build another layer")
        self._method = None if name == AUTO else method_named(name)
        self.choice = None
        self.plans.clear()

    @property
    def spectral_method(self) -> SpectralMethod:
        """The ``drift.nn.methods`` object the layer computes with (PlanError while ``method`` is "auto")."""
        if self._method is None:
            raise PlanError(f"{type(self).__name__}: method='auto' is chosen at parallelize or at the first input")
        return self._method

    @property
    def ndim(self) -> int:
        """The number of spatial dims."""
        return len(self.mode_shape)

    def modes_at(self, global_shape: Sequence[int]) -> tuple[tuple[int, ...], ...]:
        """The retained frequency indices per dim of a transform of these extents (the padded ones when
        the layer pads; ValueError if they do not fit)."""
        return mode_lists(self.mode_spec, tuple(global_shape), self.real)

    def padding_at(self, global_shape: Sequence[int]) -> tuple[tuple[int, int], ...]:
        """``(before, after)`` zeros per dim the layer pads an input of this resolution with."""
        return padding_at(self.domain_padding, self.domain_padding_mode, global_shape)

    def check_padding_split(self, split: Sequence[bool]) -> None:
        """PlanError when a dfno method would pad a dim split over ranks (``split[i]``): padding changes
        the dim's ``torch.chunk`` blocks, which its transposes would have to redistribute."""
        dims = [i for i, (f, s) in enumerate(zip(self.domain_padding, split, strict=True)) if f and s]
        if dims and self.spectral_method.pads_tensor:
            raise PlanError(
                f"{self.method} with domain_padding={self.domain_padding} pads the tensor, which is not supported "
                f"on spatial dims split over ranks (dims {dims}): use method='drift' (implicit padding) or pad "
                "only the dims the mesh leaves whole"
            )

    # Distributed over a mesh.

    def weight_placements(self, mesh, placements: Sequence) -> tuple:
        """How the layer stores its weight over ``mesh`` for inputs placed as ``placements`` (one per mesh
        dim, as ``drift.layout.input_roles`` takes them): its method's share on each rank. ValueError for
        placements drift cannot take or a layout the method cannot (dfno-pruned with every dim split)."""
        roles = input_roles(mesh, placements, self.ndim)
        return self.spectral_method.weight_placements(self, mesh, roles.placements, roles.spatial_axes)

    @torch.no_grad()
    def distribute_(self, mesh, placements: Sequence, *, reduction=None, overlap: int = 1) -> SpectralConv:
        """Make the layer distributed over ``mesh``, in place, for inputs placed as ``placements``; returns
        it. ``drift.nn.parallelize`` calls it for each layer of a model once the whole model is checked.

        The weight takes the values of the mesh's first rank and becomes a DTensor stored as the method
        places it (``weight_placements``), replicated over the data-parallel dims; the bias and a
        factorized weight's factors become plain tensors, the first rank's on every rank. ``reduction``
        (a ``drift.reduction_mesh`` or None) and ``overlap`` (pieces) shape drift's collectives
        (``drift.TruncatedFFT``). Plans built before are dropped. Before any change or collective:
        PlanError while ``method`` is "auto" (``resolve_methods``) or for a dfno method padding a split
        dim; ValueError when the layer is already distributed, for placements or a layout the method
        cannot take, or a reduction or overlap given to another method than drift."""
        if self.mesh is not None:
            raise ValueError(f"{type(self).__name__} is already parallelized over {self.mesh}")
        roles = input_roles(mesh, placements, self.ndim)
        self.check_padding_split([p > 1 for p in roles.parts])
        if (reduction is not None or overlap != 1) and not self.spectral_method.takes_reduction:
            raise ValueError(f"reduction and overlap apply to method 'drift' only, not {self.method!r}")
        weight_placements = self.weight_placements(mesh, roles.placements)
        self.mesh, self.input_placements, self.data_axes = mesh, roles.placements, roles.data_axes
        for name, param in list(self.named_parameters(recurse=False)):
            value = param.detach()
            if name == "weight":  # a dense one (a factorized weight is a module: its factors follow)
                stored = distribute_tensor(value, mesh, weight_placements)
            else:
                stored = first_rank_value(mesh, value)
            setattr(self, name, nn.Parameter(stored, requires_grad=param.requires_grad))
        if isinstance(self.weight, FactorizedWeight):
            self.weight.distribute_(mesh)
        self.reduction, self.overlap = reduction, overlap
        self.plans.clear()
        return self

    # Plans, one per layout met.

    def plan(self, layout: Layout) -> nn.Module:
        """The plan for ``layout`` (built on first use, resident after; at most ``MAX_PLANS`` kept)."""
        key = _plan_key(layout)
        if key in self.plans:
            plan = self.plans.pop(key)  # back in as the most recently used
        else:
            plan = self._build_plan(layout)
            if len(self.plans) >= MAX_PLANS:
                del self.plans[next(iter(self.plans.keys()))]
        self.plans[key] = plan
        return plan

    def choose_method(
        self,
        global_shape: Sequence[int],
        parts: Sequence[int],
        machine: Machine,
        choices: Sequence[SpectralMethod] | None = None,
        reduction: Sequence[int] | None = None,
    ) -> None:
        """Resolve ``method="auto"`` for inputs of ``global_shape`` split ``parts`` ways per dim (drift with
        ``reduction``, a reduction mesh shape): of ``choices`` (default ``drift.nn.methods.candidates()``)
        the one ``drift.cost.choose_method`` models fastest becomes ``method``, its reasons ``choice``.
        ``resolve_methods`` calls it with the choices that can run there."""
        if self._method is not None:
            raise ValueError(f"choose_method resolves method='auto'; this layer's method is {self.method!r}")
        padding = self.padding_at(global_shape)
        padded = tuple(n + b + a for n, (b, a) in zip(global_shape, padding, strict=True))
        self.choice = choose_method(
            padded,
            self.mode_spec,
            parts,
            in_channels=self.in_channels,
            out_channels=self.out_channels,
            real=self.real,
            complex_bytes=2 * torch.finfo(self.precision()).bits // 8,
            machine=machine,
            costs=[m.cost for m in (candidates() if choices is None else choices)],
            reduction=reduction,
        )
        self._method = method_named(self.choice.method)

    @torch.inference_mode(False)  # a plan first built in an inference pass must serve training later
    def _build_plan(self, layout: Layout) -> nn.Module:
        if self._method is None:  # on one device (parallelize resolves): the grid is known now, no weight moves
            resolve_methods(self, layout.global_shape, layout.parts)
        padding = self.padding_at(layout.global_shape)
        padded = tuple(n + b + a for n, (b, a) in zip(layout.global_shape, padding, strict=True))
        try:
            modes = self.modes_at(padded)
        except ValueError as exc:
            note = f" (padded to {padded})" if padded != layout.global_shape else ""
            raise PlanError(f"{type(self).__name__} at resolution {layout.global_shape}{note}: {exc}") from None
        self.check_padding_split([p > 1 for p in layout.parts])
        return self._method.plan(self, layout, modes, padding)

    def precision(self) -> torch.dtype:
        """The real precision the layer computes in: its weight's (PlanError unless float32 or float64)."""
        dtype = real_dtype(self.weight.dtype)
        if dtype not in (torch.float32, torch.float64):
            raise PlanError(
                f"{type(self).__name__}: a {self.weight.dtype} weight is not supported (torch has no complex "
                "half-precision FFT or matmul on every backend): keep the parameters in float32 and use "
                "torch.autocast for mixed precision"
            )
        return dtype

    # Forward.

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``x``: ``(batch, in_channels, *spatial)``, a plain tensor on one device or a DTensor laid out
        as the layer was parallelized for; returns ``(batch, out_channels, *spatial)`` alike."""
        layout, local = self.input_layout(x)
        y = self.forward_local(local, layout)
        if isinstance(x, DTensor):
            return to_dtensor(y, x.device_mesh, x.placements, (x.shape[0], self.out_channels, *x.shape[2:]))
        return y

    def input_layout(self, x: torch.Tensor) -> tuple[Layout, torch.Tensor]:
        """The layout of ``x``'s spatial dims and this rank's block (checked against the layer)."""
        d = self.ndim
        if x.dim() != 2 + d or x.shape[1] != self.in_channels:
            raise ValueError(
                f"{type(self).__name__} expects (batch, {self.in_channels}, {d} spatial dims), "
                f"got shape {tuple(x.shape)}"
            )
        return layout_of(x, d, self.mesh, self.input_placements)

    def forward_local(
        self, x: torch.Tensor, layout: Layout, *, out: torch.Tensor | None = None, constant: torch.Tensor | None = None
    ) -> torch.Tensor:
        """The convolution of this rank's block ``x`` ``(b, in, *layout.local_shape)`` of a field laid out
        as ``layout``; returns ``(b, out, *layout.local_shape)``, written into ``out`` when given (a
        preallocated contiguous tensor of that shape, outside autograd: "drift" writes its inverse there,
        the dfno methods copy). With ``out``, ``constant`` ``(out,)`` (e.g. the bias of a pointwise layer
        whose output is added to this one) is added to every point too; "drift" adds it and its own bias
        to the constant mode before the inverse (``folds_constants``), sparing a pass over the output.
        Under autocast it runs, and returns, in the weight's precision."""
        if x.shape[2:] != layout.local_shape:
            raise PlanError(f"expected a block ending in {layout.local_shape}, got shape {tuple(x.shape)}")
        self.precision()
        if constant is not None and out is None:
            raise PlanError("SpectralConv.forward_local: constant= is for outputs written into out=")
        if out is not None:
            if autocasting(x):
                raise PlanError("SpectralConv: out= is not supported under torch.autocast")
            if self.bias is not None:
                bias = replicate_over(self.mesh, self.bias)
                constant = bias if constant is None else bias + constant
            if constant is not None and self.folds_constants(layout):
                return self._convolve(x, layout, out, constant)
            y = self._convolve(x, layout, out)
            if constant is not None:
                y.add_(constant.view(-1, *[1] * self.ndim))
            return y
        if autocasting(x):
            with torch.autocast(x.device.type, enabled=False):
                x = x.to(self.precision() if self.real else complex_dtype(self.precision()))
                return self._add_bias(self._convolve(x, layout))
        if real_dtype(x.dtype) in (torch.float16, torch.bfloat16):
            raise PlanError(
                f"{type(self).__name__}: a {x.dtype} input outside torch.autocast (the weight is {self.weight.dtype}): "
                "half-precision parameters are not supported; keep them in float32 and use torch.autocast"
            )
        return self._add_bias(self._convolve(x, layout))

    def folds_constants(self, layout: Layout) -> bool:
        """Whether ``forward_local(out=...)`` adds constants in the spectrum: "drift" on a real or complex
        field whose kept modes hold frequency 0 on every dim."""
        plan = self.plan(layout)  # resolves method="auto" first
        return self._method.folds_constants(plan)

    def _add_bias(self, y: torch.Tensor) -> torch.Tensor:
        if self.bias is None:
            return y
        return y + replicate_over(self.mesh, self.bias).view(-1, *[1] * self.ndim)

    def _local_weight(self, plan: nn.Module) -> torch.Tensor:
        """The part of the weight this rank multiplies for ``plan``, ``(in, out, *its modes)``, its gradient
        summed over the ranks that share it (``SpectralMethod.weight_index``)."""
        w, method = self.weight, self._method  # resolved by the plan
        if isinstance(w, FactorizedWeight):
            return w.block(method.weight_index(plan))
        if isinstance(w, DTensor):
            local = w.to_local()
            for axis, p in enumerate(w.placements):
                if isinstance(p, Replicate) and self.mesh.size(axis) > 1:
                    local = comm.replicate(local, group=self.mesh.get_group(axis))
            w = local
        return method.select(w, plan)

    def _convolve(
        self, x: torch.Tensor, layout: Layout, out: torch.Tensor | None = None, constant: torch.Tensor | None = None
    ) -> torch.Tensor:
        """The convolution's output (into ``out`` when given); a method that folds constants adds
        ``constant`` ``(out,)`` to every point through the constant mode."""
        plan = self.plan(layout)  # resolves method="auto" first
        method = self._method
        with phase("multiply"):
            w = self._local_weight(plan)
        return method.convolve(self, plan, x, w, self.padding_at(layout.global_shape), out, constant)


def resolve_methods(
    model: nn.Module,
    global_shape: Sequence[int],
    parts: Sequence[int] | None = None,
    *,
    machine: Machine | None = None,
    reduction: Sequence[int] | None = None,
    drift_options: bool = False,
) -> None:
    """Resolve ``method="auto"`` in every ``SpectralConv`` of ``model`` (``model`` itself one included), once,
    for inputs of the spatial extents ``global_shape`` split ``parts`` ways per dim (default: one device):
    of the methods that can run so (``drift.nn.methods.candidates``: none padding the tensor on a split
    dim, none needing a whole dim when every dim is split, drift only with ``drift_options``, a reduction
    or overlap of drift's) the one ``drift.cost``'s model predicts fastest on ``machine`` (default
    ``Machine.default`` of the layer's weight's device type), drift costed with ``reduction`` (a reduction
    mesh shape), becomes the layer's method (``choose_method``). Layers whose method is set are left as
    they are. ``parallelize`` calls it with the mesh's split, and a layer on one device at its first
    input; call it to choose before either (``drift train`` does, to print the choice)."""
    for layer in model.modules():
        if not isinstance(layer, SpectralConv) or layer._method is not None:
            continue
        ranks = (1,) * layer.ndim if parts is None else tuple(parts)
        split = [p > 1 for p in ranks]
        padded_split = any(f and s for f, s in zip(layer.domain_padding, split, strict=True))
        choices = candidates(padded_split=padded_split, drift_options=drift_options, every_dim_split=all(split))
        on = machine or Machine.default(layer.weight.device.type)
        layer.choose_method(tuple(global_shape), ranks, on, choices, reduction=reduction)


def layout_of(x: torch.Tensor, d: int, mesh, placements) -> tuple[Layout, torch.Tensor]:
    """The ``Layout`` of the last ``d`` dims of ``x`` and this rank's block of it.

    On one device (``mesh`` None) ``x`` is a plain tensor. On a mesh ``x`` must be a DTensor on that
    mesh with ``placements`` (dim 0 may be sharded: data parallel). PlanError otherwise, before any
    collective.
    """
    if mesh is None:
        if isinstance(x, DTensor):
            raise PlanError("a DTensor input needs a parallelized module: call drift.nn.parallelize(model, mesh, ...)")
        return Layout(x.shape[x.dim() - d :]), x
    if not isinstance(x, DTensor):
        raise PlanError(
            f"this module is parallelized over a {tuple(mesh.shape)} mesh: give it a DTensor "
            f"(DTensor.from_local(block, mesh, {placements}, shape=..., stride=...))"
        )
    if x.device_mesh != mesh or tuple(x.placements) != tuple(placements):
        raise PlanError(
            f"input DTensor on {x.device_mesh} with placements {tuple(x.placements)}; this module is parallelized "
            f"for {mesh} with placements {tuple(placements)}"
        )
    layout, _ = dtensor_layout(x, d, batch_axes_ok=True)
    return layout, x.to_local()
