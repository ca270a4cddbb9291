"""drift.nn.methods: the name-to-class mapping, the auto candidates, and dfno-pruned's weight placements
computed without a plan against the plans' own output placements; the method a SpectralConv holds (its
name, its object, "auto" resolved once by drift.nn.resolve_methods, the deprecated setter) and a layer
distributing itself (SpectralConv.distribute_)."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
from harness import device_for
from meshes import mesh_for
from reference import rel_err
from torch.distributed.tensor import DTensor, Replicate, Shard, distribute_tensor

import drift
from drift import PlanError
from drift.fft import DistributedFFT, pruned_output_placements
from drift.layout import device_mesh, shift_placements, to_dtensor
from drift.nn import FNO, SpectralConv, resolve_methods
from drift.nn.methods import METHODS, Dfno, Drift, PrunedDfno, candidates, method_named


def test_names_map_to_one_class_each():
    assert [method_named(name).name for name in METHODS] == list(METHODS)
    assert isinstance(method_named("drift"), Drift) and isinstance(method_named("dfno"), Dfno)
    assert isinstance(method_named("dfno-pruned"), PrunedDfno)
    for bad in ("fft", "auto", None):
        with pytest.raises(ValueError, match=r"method must be one of \('drift', 'dfno', 'dfno-pruned'\)"):
            method_named(bad)


def test_auto_candidates_follow_what_each_method_can_do():
    names = lambda ms: [m.name for m in ms]  # noqa: E731
    assert names(candidates()) == ["drift", "dfno-pruned"]  # dfno has no cost model: never faster than pruned
    assert names(candidates(padded_split=True)) == ["drift"]
    assert names(candidates(drift_options=True)) == ["drift"]
    assert names(candidates(every_dim_split=True)) == ["drift"]


def _placements_without_a_plan():
    """dfno-pruned's output placements from the schedule alone, against built plans at several resolutions
    (r2c and c2c; a slab, a pencil, a mesh with a data dim)."""
    device = device_for(dist.get_rank())
    checked = 0
    for grid, modes in [((4, 1, 1), (3, 2, 2)), ((2, 2, 1), (2, 3, 2)), ((1, 4), (3, 2)), ((2, 1, 2), (2, 2, 2))]:
        mesh, placements = mesh_for(grid)
        for real in (True, False):
            kept = tuple(m if real and i == len(modes) - 1 else 2 * m for i, m in enumerate(modes))
            expected = pruned_output_placements(mesh, placements, kept, real)
            for extents in [(9, 8, 7)[: len(modes)], (16, 12, 10)[: len(modes)]]:
                kind = "r2c" if real else "c2c"
                plan = DistributedFFT(extents, mesh, placements, kind=kind, modes=modes, device=device)
                assert plan.output_placements == expected, (grid, real, extents)
                checked += 1
    # A data mesh dim: its placement is Replicate in the transform's terms.
    mesh = device_mesh((2, 2), ("data", "x"), device.type)
    plan = DistributedFFT((8, 6), mesh, (Replicate(), Shard(0)), kind="r2c", modes=(2, 2), device=device)
    assert pruned_output_placements(mesh, (Replicate(), Shard(0)), (4, 2), True) == plan.output_placements
    with pytest.raises(ValueError, match="split every dim"):
        pruned_output_placements(*mesh_for((2, 2)), (4, 2), True)
    return checked


def test_pruned_weight_placements_need_no_plan(ranks):
    assert ranks.run(4, _placements_without_a_plan) == [16] * 4


def test_a_layer_holds_its_method_and_reads_its_name():
    for name in METHODS:
        layer = SpectralConv(2, 3, (2, 2), method=name)
        assert layer.method == name and layer.spectral_method is method_named(name)
    auto = SpectralConv(2, 3, (2, 2), method="auto")
    assert auto.method == "auto" and auto.choice is None
    with pytest.raises(PlanError, match="method='auto' is chosen at parallelize or at the first input"):
        _ = auto.spectral_method


def test_resolve_methods_resolves_auto_once_and_leaves_set_methods():
    model = FNO(2, 1, 4, (2, 2, 2), n_layers=2, method="auto")
    model.blocks[1].spectral = SpectralConv(4, 4, (2, 2, 2), method="dfno")
    resolve_methods(model, (16, 16, 16))
    first = model.blocks[0].spectral
    assert first.method == "drift" and first.choice.method == "drift" and model.blocks[1].spectral.method == "dfno"
    choice = first.choice
    resolve_methods(model, (64, 64, 64))  # resolved: nothing changes
    assert first.choice is choice and first.spectral_method is method_named("drift")


def test_setting_the_method_is_deprecated_and_rebuilds_the_plans():
    torch.manual_seed(2)
    layer = SpectralConv(2, 3, (2, 2), method="drift", dtype=torch.float64)
    x = torch.randn(2, 2, 8, 6, dtype=torch.float64)
    layer(x)
    with pytest.warns(DeprecationWarning, match="setting SpectralConv.method is deprecated"):
        layer.method = "dfno"
    explicit = SpectralConv(2, 3, (2, 2), method="dfno", dtype=torch.float64)
    explicit.load_state_dict(layer.state_dict())
    assert layer.method == "dfno" and rel_err(layer(x), explicit(x)) <= 1e-12
    with pytest.warns(DeprecationWarning), pytest.raises(ValueError, match="method must be one of"):
        layer.method = "fft"


def _distributed_layer():
    """A lone layer distributes itself as parallelize would: refusals before any collective, then the
    first rank's weight stored as its method places it, and the single-device function."""
    device = device_for(dist.get_rank())
    mesh, field = mesh_for((2, 1))
    placements = shift_placements(field, 2)
    torch.manual_seed(5 + dist.get_rank())  # each rank draws its own: the first rank's values win
    layer = SpectralConv(2, 3, (2, 2), method="dfno-pruned", bias=True, dtype=torch.float64, device=device)
    auto = SpectralConv(2, 3, (2, 2), method="auto", device=device)
    errors = []
    with drift.comm_log() as log:
        for bad, options in [(auto, {}), (layer, {"overlap": 2}), (layer, {"reduction": mesh})]:
            try:
                bad.distribute_(mesh, placements, **options)
            except (PlanError, ValueError) as exc:
                errors.append(str(exc))
    untouched = log.calls == [] and auto.mesh is None and layer.mesh is None and not isinstance(layer.weight, DTensor)
    first = [
        distribute_tensor(t.detach(), mesh, (Replicate(),), src_data_rank=0).to_local() for t in layer.parameters()
    ]
    assert layer.distribute_(mesh, placements) is layer
    stored = isinstance(layer.weight, DTensor) and layer.weight.placements == layer.weight_placements(mesh, placements)
    same = torch.equal(layer.weight.full_tensor(), first[0]) and torch.equal(layer.bias, first[1])
    x = torch.randn(2, 2, 8, 6, dtype=torch.float64, generator=torch.Generator().manual_seed(1)).to(device)
    block = distribute_tensor(x, mesh, placements, src_data_rank=None).to_local()
    y = layer(to_dtensor(block, mesh, placements, x.shape)).full_tensor().cpu()
    single = SpectralConv(2, 3, (2, 2), method="dfno-pruned", bias=True, dtype=torch.float64)
    single.load_state_dict({"weight": first[0].cpu(), "bias": first[1].cpu()})
    with pytest.raises(ValueError, match="already parallelized"):
        layer.distribute_(mesh, placements)
    return errors, untouched and stored and same, rel_err(y, single(x.cpu()))


def test_a_layer_distributes_itself(ranks):
    for errors, kept, err in ranks.run(2, _distributed_layer):
        assert "method='auto' is chosen at parallelize" in errors[0]
        assert all("apply to method 'drift' only, not 'dfno-pruned'" in e for e in errors[1:]) and len(errors) == 3
        assert kept and err <= 1e-12
