"""``drift.optim.Adam`` / ``AdamW`` (torch's fused kernel on real views of complex parameters) against
torch's own Adam / AdamW loop, whose state they share."""

from __future__ import annotations

import pytest
import torch
from reference import TOL, random_tensor, rel_err

from drift import optim


def _params(dtype: torch.dtype) -> list[torch.nn.Parameter]:
    """Complex and real parameters of the real precision ``dtype``."""
    shapes = [((3, 4, 5), True), ((7,), False), ((2, 3), True), ((4, 2), False)]
    return [torch.nn.Parameter(random_tensor(s, dtype, i, complex_=c)) for i, (s, c) in enumerate(shapes)]


def _run(optimizer: torch.optim.Optimizer, params: list[torch.Tensor], steps: range, dtype: torch.dtype) -> None:
    """``steps`` steps on the same seeded gradients (the third parameter gets none at step 1)."""
    for step in steps:
        for i, p in enumerate(params):
            p.grad = None if (i, step) == (2, 1) else random_tensor(p.shape, dtype, 100 * step + i, p.is_complex())
        optimizer.step()


PAIRS = {"Adam": (optim.Adam, torch.optim.Adam), "AdamW": (optim.AdamW, torch.optim.AdamW)}
OPTIONS = [dict(), dict(weight_decay=0.1, amsgrad=True), dict(weight_decay=0.05, maximize=True, betas=(0.8, 0.9))]


@pytest.fixture(params=["fused", "for-each"])
def kernel(request, monkeypatch):
    """torch's fused kernel (a private API), and the public for-each step drift falls back to without it."""
    if request.param == "for-each":
        monkeypatch.delattr(torch, "_fused_adam_")
        monkeypatch.delattr(torch, "_fused_adamw_")
    return request.param


@pytest.mark.parametrize("name", PAIRS)
@pytest.mark.parametrize("options", OPTIONS, ids=["defaults", "decay-amsgrad", "decay-maximize"])
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_the_same_update_as_torch_loop(name, options, dtype, kernel):
    ours, theirs = PAIRS[name]
    assert ours([torch.nn.Parameter(torch.zeros(1))]).defaults == theirs([torch.nn.Parameter(torch.zeros(1))]).defaults
    params, reference = _params(dtype), _params(dtype)
    _run(ours(params, lr=0.01, **options), params, range(4), dtype)
    _run(theirs(reference, lr=0.01, foreach=False, **options), reference, range(4), dtype)
    for got, want in zip(params, reference, strict=True):
        assert got.dtype == want.dtype and rel_err(got.detach(), want.detach()) <= TOL[dtype]


@pytest.mark.parametrize("name", PAIRS)
def test_state_dicts_carry_over_both_ways(name):
    """Two steps with one class, the state dict loaded into the other, two more: as four with torch's."""
    ours, theirs = PAIRS[name]
    options = dict(lr=0.02, weight_decay=0.1, amsgrad=True)
    reference = _params(torch.float64)
    _run(theirs(reference, foreach=False, **options), reference, range(4), torch.float64)
    for first, second in ((theirs, ours), (ours, theirs)):
        params = _params(torch.float64)
        extra = dict(foreach=False) if first is theirs else {}
        before = first(params, **options, **extra)
        _run(before, params, range(2), torch.float64)
        after = second(params, **options, **({} if extra else dict(foreach=False)))
        after.load_state_dict(before.state_dict())
        _run(after, params, range(2, 4), torch.float64)
        for got, want in zip(params, reference, strict=True):
            assert rel_err(got.detach(), want.detach()) <= 1e-12, (first.__module__, second.__module__)


def test_refuses_what_the_fused_step_cannot_do():
    with pytest.raises(TypeError, match="takes no foreach"):
        optim.AdamW([torch.nn.Parameter(torch.zeros(3))], foreach=True)
    p = torch.nn.Parameter(torch.zeros(3))
    p.grad = torch.zeros(3).to_sparse()
    with pytest.raises(RuntimeError, match="sparse"):
        optim.Adam([p]).step()
