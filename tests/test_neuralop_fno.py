"""neuraloperator 2.0's FNO options on drift's FNO: against neuraloperator itself, against an independent
float64 reference on 1 and 4 ranks (slab with an empty shard, 2 x 2 pencil), gradients against one
process, whole-model interop both ways, and the options drift refuses."""

from __future__ import annotations

import math

import pytest
import torch
import torch.distributed as dist
from harness import device_for
from reference import random_tensor, rel_err, truncated_spectrum, zero_filled_inverse
from torch.distributed.tensor import DTensor, Shard, distribute_tensor
from torch.nn import functional as F

import drift
from drift.nn import (
    FNO,
    FNOBlock,
    GlobalNorm,
    PointwiseLinear,
    SoftGating,
    from_neuralop,
    parallelize,
    to_neuralop,
)

neuralop_models = pytest.importorskip("neuralop.models", reason="neuraloperator is not installed")
SHAPE = (9, 8, 6)  # 9 over 4 ranks is 3, 3, 3, 0: an empty shard
# neuraloperator 2.0 undoes its fftshift with fftshift, one index off on odd leading extents: compare
# with it on even ones (10 over 4 ranks is 3, 3, 3, 1).
EVEN_SHAPE = (10, 8, 6)

# Every option at least once; each runs single-device, on a 4-rank slab and on a 2 x 2 pencil.
CONFIGS = {
    "neuralop-defaults": dict(neuralop=True),
    "neuralop-defaults-recompute-mlp": dict(neuralop=True, recompute_mlp=True),
    "instance-norm-soft-gating-tanh": dict(
        neuralop=True, norm="instance_norm", fno_skip="soft-gating", channel_mlp_skip="linear", non_linearity=torch.tanh
    ),
    "group-norm-identity": dict(
        neuralop=True, norm="group_norm", fno_skip="identity", channel_mlp_skip="identity", lifting_channel_ratio=0
    ),
    "group-norm-no-mlp-dfno-pruned": dict(
        norm="group_norm", projection_channel_ratio=1.5, positional_embedding="grid", method="dfno-pruned"
    ),
    "complex": dict(neuralop=True, complex_data=True, fno_skip="soft-gating", projection_channel_ratio=1),
}


def build(name: str, seed: int = 0, **factory) -> FNO:
    """The float64 drift FNO of configuration ``name``, parameters from ``seed``, perturbed so that gains,
    norm weights and biases initialised to 0 or 1 are generic."""
    options = dict(CONFIGS[name])
    constructor = FNO.neuralop_defaults if options.pop("neuralop", False) else FNO
    torch.manual_seed(seed)
    model = constructor(2, 3, 6, (2, 2, 3), n_layers=2, dtype=torch.float64, **options, **factory)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.1 * torch.randn(p.shape, dtype=p.dtype).to(p.device))
    return model


def dense_weight(conv) -> torch.Tensor:
    """``conv``'s spectral weight, rebuilt by tensorly from its factors when it is factorized."""
    if conv.factorization is None:
        return conv.weight
    import tensorly as tl

    tl.set_backend("pytorch")
    w = conv.weight
    if conv.factorization == "tucker":
        return tl.tucker_to_tensor((w.core, list(w.factors)))
    return tl.cp_to_tensor((w.weights, list(w.factors)))


class _Reference:
    """neuraloperator 2.0's FNO formula on torch primitives (torch.fft, F.instance_norm, F.group_norm,
    torch.linspace) in double precision, with a drift model's single-device parameters."""

    def __init__(self, non_linearity, complex_data: bool) -> None:
        self.non_linearity, self.complex_data = non_linearity, complex_data

    def param(self, p):
        return p.detach().to(torch.complex128 if p.is_complex() or self.complex_data else torch.float64)

    def act(self, t):
        f = self.non_linearity
        return torch.complex(f(t.real), f(t.imag)) if t.is_complex() else f(t)

    def linear(self, layer, t):
        y = torch.einsum("oi,bi...->bo...", self.param(layer.weight), t)
        return y if layer.bias is None else y + self.param(layer.bias).view(-1, *[1] * (t.dim() - 2))

    def skip(self, layer, t):
        if isinstance(layer, SoftGating):
            return t * self.param(layer.weight).view(-1, *[1] * (t.dim() - 2))
        return self.linear(layer, t) if isinstance(layer, PointwiseLinear) else t

    def norm(self, layer: GlobalNorm, t):
        if layer.kind == "instance_norm":
            return F.instance_norm(t, eps=1e-5)
        return F.group_norm(t, 1, self.param(layer.weight), self.param(layer.bias), eps=1e-5)

    def block(self, block: FNOBlock, x):
        """One FNOBlock: ``act(norm(K x) + skip(x))``, then ``act(mlp_norm(mlp(y) + mlp_skip(x)))``."""
        conv, shape = block.spectral, x.shape[2:]
        modes = conv.modes_at(shape)
        spec = truncated_spectrum(x, modes, conv.real, "backward")
        mixed = torch.einsum("bi...,io...->bo...", spec, self.param(dense_weight(conv)))
        y = zero_filled_inverse(mixed, modes, shape, conv.real, "backward")
        if conv.bias is not None:
            y = y + self.param(conv.bias).view(-1, *[1] * len(shape))
        if block.norm is not None:
            y = self.norm(block.norm, y)
        y = y + self.skip(block.skip, x)
        y = self.act(y) if block.activation else y
        if block.channel_mlp is None and block.mlp_norm is None:
            return y
        if block.channel_mlp is not None:
            fc0, fc1 = block.channel_mlp.fcs
            h = self.linear(fc0, y)
            h = torch.complex(F.gelu(h.real), F.gelu(h.imag)) if h.is_complex() else F.gelu(h)
            y = self.linear(fc1, h) + self.skip(block.channel_mlp_skip, x)
        if block.mlp_norm is not None:
            y = self.norm(block.mlp_norm, y)
        return self.act(y) if block.activation else y


def reference(model: FNO, x: torch.Tensor) -> torch.Tensor:
    """``model``'s function by neuraloperator 2.0's formula (``_Reference``)."""
    ref = _Reference(model.non_linearity, model.complex_data)
    x = x.to(torch.complex128 if model.complex_data else torch.float64)
    if model.positional_embedding == "grid":
        axes = [torch.linspace(0, 1, n + 1, dtype=torch.float64)[:-1] for n in x.shape[2:]]
        grid = torch.stack(torch.meshgrid(*axes, indexing="ij")).expand(x.shape[0], -1, *x.shape[2:])
        x = torch.cat((x, grid.to(x.dtype)), 1)
    x = ref.linear(model.lift, x)
    if model.lift_out is not None:
        x = ref.linear(model.lift_out, ref.act(x))
    for block in model.blocks:
        x = ref.block(block, x)
    return ref.linear(model.project_out, ref.act(ref.linear(model.project_hidden, x)))


@pytest.mark.parametrize("activation", [True, False], ids=["inner", "last"])
@pytest.mark.parametrize("parts", ["norm-mlp", "soft-gating", "linear"])
def test_a_block_alone_equals_the_reference(parts, activation):
    """An FNOBlock as a module of its own, on a whole tensor, forward and x's gradient, against the
    reference block and autograd through it."""
    options = {
        "norm-mlp": dict(norm="group_norm", channel_mlp_hidden=3, channel_mlp_skip="linear"),
        "soft-gating": dict(fno_skip="soft-gating", channel_mlp_hidden=4),
        "linear": dict(),
    }[parts]
    torch.manual_seed(3)
    block = FNOBlock(5, (2, 2, 3), activation=activation, non_linearity=torch.tanh, dtype=torch.float64, **options)
    with torch.no_grad():
        for p in block.parameters():
            p.add_(0.1 * torch.randn(p.shape, dtype=p.dtype))
    assert block.fused == (parts == "linear")
    x = random_tensor((2, 5, *SHAPE), torch.float64, 2).requires_grad_(True)
    y = block(x)
    want = _Reference(torch.tanh, False).block(block, x)
    assert rel_err(y, want) <= 1e-12
    g = random_tensor(y.shape, torch.float64, 4)
    (grad,) = torch.autograd.grad(y, x, g)
    (want_grad,) = torch.autograd.grad(want, x, g)
    assert rel_err(grad, want_grad) <= 1e-12
    with torch.no_grad():
        assert rel_err(block(x), want) <= 1e-12


def _input(name: str) -> torch.Tensor:
    return random_tensor((2, 2, *SHAPE), torch.float64, 1, complex_=CONFIGS[name].get("complex_data", False))


def _loss(out: torch.Tensor, seed: int) -> torch.Tensor:
    real = torch.view_as_real(out) if out.is_complex() else out
    return (real * random_tensor(real.shape, torch.float64, seed).to(real.device)).sum()


_MESHES: dict = {}


def _mesh(grid, data: int):
    """This worker's mesh (made once) and input placements: spatial dim i over ``grid[i]`` ranks, after a
    data-parallel mesh dim of ``data`` ranks when ``data`` > 1."""
    key = (grid, data)
    if key not in _MESHES:
        device = device_for(dist.get_rank()).type
        if data > 1:
            from torch.distributed.device_mesh import init_device_mesh

            (dim, parts), *_ = [(i, p) for i, p in enumerate(grid) if p > 1]
            _MESHES[key] = init_device_mesh(device, (data, parts)), (Shard(0), Shard(2 + dim))
        else:
            mesh, placements = drift.grid_mesh(grid, device)
            _MESHES[key] = mesh, tuple(Shard(p.dim + 2) if isinstance(p, Shard) else p for p in placements)
    return _MESHES[key]


def _run_configs(grid, data):
    """Every configuration parallelized over ``grid`` (and ``data`` data-parallel ranks): the full output
    and every parameter's gradient (whole) of the sum over ranks of each rank's loss of its block."""
    rank, device = dist.get_rank(), device_for(dist.get_rank())
    mesh, placements = _mesh(grid, data)
    results = {}
    for name in CONFIGS:
        model = parallelize(build(name, device=device), mesh, placements)
        x = distribute_tensor(_input(name).to(device), mesh, placements, src_data_rank=None)
        with drift.comm_log() as log:
            y = model(x)
        _loss(y.to_local(), 10 + rank).backward()
        grads = {
            n: (p.grad.full_tensor() if isinstance(p.grad, DTensor) else p.grad).cpu()
            for n, p in model.named_parameters()
        }
        block = drift.Layout(y.shape, mesh, placements).local_slices
        results[name] = (y.full_tensor().detach().cpu(), grads, block, log.kinds())
    for i in DISTRIBUTED_NEURALOP:
        ours = parallelize(from_neuralop(_neuralop_model(NEURALOP_CONFIGS[i], 3), device=device), mesh, placements)
        x = distribute_tensor(_neuralop_input().to(device), mesh, placements, src_data_rank=None)
        with torch.no_grad():
            results[f"from-neuralop-{i}"] = ours(x).full_tensor().cpu()
    return rank, results


@pytest.mark.parametrize(
    ("grid", "data"),
    [((1, 1, 1), 1), ((4, 1, 1), 1), ((2, 2, 1), 1), ((2, 1, 1), 2)],
    ids=["1-rank", "slab-4", "pencil-2x2", "data-2x-slab-2"],
)
def test_options_distributed_equal_the_reference_and_one_process(ranks, grid, data):
    results = ranks.run(math.prod(grid) * data, _run_configs, grid, data)
    for i in DISTRIBUTED_NEURALOP:
        options = NEURALOP_CONFIGS[i]
        with torch.no_grad():
            want = _neuralop_model(options, 3)(_neuralop_input())
        for _, per_rank in results:  # converted from neuraloperator, parallelized: neuraloperator's output
            assert rel_err(per_rank[f"from-neuralop-{i}"], want) <= 1e-5, (options, grid)
    for name in CONFIGS:
        single = build(name)
        x = _input(name)
        want = reference(single, x)
        y_single = single(x)
        assert rel_err(y_single, want) <= 1e-12, name
        sum(_loss(y_single[per_rank[name][2]], 10 + r) for r, per_rank in results).backward()
        scale = torch.cat([p.grad.flatten().abs() for p in single.parameters()]).norm()
        for _, per_rank in results:
            y, grads, _, kinds = per_rank[name]
            assert rel_err(y, want) <= 1e-12, (name, grid)
            for param_name, p in single.named_parameters():
                if p.grad.norm() <= 1e-10 * scale:  # zero but for rounding: a bias an instance norm removes
                    assert grads[param_name].norm() <= 1e-12 * scale, (name, grid, param_name)
                else:
                    assert rel_err(grads[param_name], p.grad) <= 1e-12, (name, grid, param_name)
            # The statistics of each of the 2 x 2 norms: one all-reduce per spatial mesh dim, none over data.
            norms = 4 if CONFIGS[name].get("norm") else 0
            assert kinds.count("all_reduce") == norms * sum(p > 1 for p in grid), (name, kinds)


NEURALOP_CONFIGS = [
    dict(),  # neuraloperator's defaults: grid, channel MLP with soft-gating skip, linear skip, ratios 2
    dict(norm="group_norm", channel_mlp_skip="linear", non_linearity=torch.tanh),
    dict(norm="instance_norm", fno_skip="soft-gating", channel_mlp_expansion=1.0, channel_mlp_dropout=0.2),
    dict(fno_skip="identity", channel_mlp_skip="identity", positional_embedding=None, lifting_channel_ratio=0),
    dict(use_channel_mlp=False, norm="group_norm", projection_channel_ratio=3),
    dict(n_modes=(7, 6, 5)),  # odd counts: explicit frequency lists in drift
    dict(factorization="tucker", rank=0.5),  # TFNO
    dict(factorization="cp", rank=0.3, implementation="reconstructed"),
    dict(factorization="Tucker", rank=(3, 4, 2, 3, 2), fno_skip="soft-gating"),
]
# Converted from neuraloperator and parallelized in the distributed test: defaults, norms, factorized.
DISTRIBUTED_NEURALOP = (0, 1, 2, 6, 7)


def _neuralop_model(options: dict, seed: int):
    options = dict(options)
    n_modes = options.pop("n_modes", (4, 4, 6))
    torch.manual_seed(seed)
    model = neuralop_models.FNO(n_modes, 2, 3, 6, n_layers=2, **options)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.1 * torch.randn_like(p))
    return model.eval()


def _neuralop_input() -> torch.Tensor:
    return random_tensor((2, 2, *EVEN_SHAPE), torch.float32, 4)


@pytest.mark.parametrize("options", NEURALOP_CONFIGS, ids=lambda o: ",".join(f"{k}={v}" for k, v in o.items()))
def test_from_neuralop_matches_neuraloperator_and_round_trips(options):
    theirs = _neuralop_model(options, 3)
    x = _neuralop_input()
    ours = from_neuralop(theirs)
    with torch.no_grad():
        want = theirs(x)
        assert rel_err(ours(x), want) <= 1e-5
        # In float64 drift equals the reference formula; neuraloperator itself runs only in float32.
        wide = from_neuralop(theirs, dtype=torch.float64)
        assert rel_err(wide(x.double()), reference(wide, x.double())) <= 1e-12
        assert rel_err(wide(x.double()), want) <= 1e-5
    back = to_neuralop(ours)
    state, restored = theirs.state_dict(), back.state_dict()
    tensors = [k for k, v in state.items() if isinstance(v, torch.Tensor)]
    assert tensors == [k for k, v in restored.items() if isinstance(v, torch.Tensor)]
    for key in tensors:  # exact: the conversions move values, they compute none
        assert torch.equal(restored[key], state[key]), key


@pytest.mark.parametrize("factorization", [None, "tucker", "cp"])
def test_to_neuralop_of_a_drift_model_computes_the_same_function(factorization):
    ours = build("neuralop-defaults", factorization=factorization, rank=0.4).float().eval()
    x = random_tensor((2, 2, *EVEN_SHAPE), torch.float32, 5)
    with torch.no_grad():
        assert rel_err(to_neuralop(ours)(x), ours(x)) <= 1e-5


def test_neuralop_defaults_are_neuraloperators():
    """Same options, same parameter count as neuraloperator's default FNO with the same kept modes."""
    ours = FNO.neuralop_defaults(2, 3, 8, (2, 2, 3))
    theirs = neuralop_models.FNO((4, 4, 4), 2, 3, 8)
    assert sum(p.numel() for p in ours.parameters()) == sum(p.numel() for p in theirs.parameters())
    assert FNO(2, 3, 8, (2, 2, 3)).lift_out is None, "drift's default stays Li et al.'s plain FNO"


@pytest.mark.parametrize(
    ("options", "match"),
    [
        (dict(domain_padding=0.25), "domain_padding=0.25 is not supported: neuraloperator pads once"),
        (dict(fno_block_precision="mixed"), "fno_block_precision='mixed'.*torch.autocast"),
        (dict(stabilizer="tanh"), "stabilizer='tanh'"),
        (dict(factorization="tt", rank=0.5), "factorization='tt' is not supported"),
        (dict(separable=True), "separable=True"),
        (dict(preactivation=True), "preactivation=True"),
        (dict(complex_data=True), "complex_data=True.*un-shifts only the leading dims"),
        (dict(resolution_scaling_factor=2), "resolution_scaling_factor=2"),
        (dict(max_n_modes=(4, 4, 6)), "max_n_modes"),
        (dict(use_channel_mlp=False), "non_linearity twice"),
    ],
)
def test_from_neuralop_refuses_what_drift_cannot_reproduce(options, match):
    theirs = neuralop_models.FNO((4, 4, 6), 2, 3, 6, n_layers=2, **options)
    with drift.comm_log() as log, pytest.raises(ValueError, match=match):
        from_neuralop(theirs)
    assert log.calls == []


def test_bad_options_are_clear_errors():
    cases = [
        (dict(fno_skip="gated"), "fno_skip must be one of"),
        (dict(use_channel_mlp=True, channel_mlp_skip=None), "channel_mlp_skip must be one of"),
        (dict(norm="batch_norm"), "norm must be one of"),
        (dict(positional_embedding="sinusoidal"), "positional_embedding must be one of"),
        (dict(norm="group_norm", complex_data=True), "norm='group_norm' with complex_data=True"),
        (dict(lifting_channel_ratio=0.1), "lifting_channel_ratio=0.1 gives 0 channels"),
        (dict(projection_channel_ratio=2, projection_width=64), "projection_width or projection_channel_ratio"),
        (dict(use_channel_mlp=True, channel_mlp_expansion=0.05), "channel_mlp_expansion=0.05 gives 0"),
        (dict(use_channel_mlp=True, channel_mlp_dropout=1.0), "channel_mlp_dropout must be in"),
        (dict(non_linearity="gelu"), "non_linearity must be a callable"),
    ]
    for options, match in cases:
        with pytest.raises(ValueError, match=match):
            FNO(2, 1, 6, (2, 2, 3), **options)
    with pytest.raises(ValueError, match="to_neuralop: domain_padding"):
        to_neuralop(FNO.neuralop_defaults(2, 1, 6, (2, 2, 3), domain_padding=0.1))
    with pytest.raises(ValueError, match="to_neuralop: use_channel_mlp=False with norm=None"):
        to_neuralop(FNO(2, 1, 6, (2, 2, 3)))
