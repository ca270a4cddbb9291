"""A recorded FNO block's own autograd nodes against autograd on the un-fused expressions: the tail
``act(y + W x + b)`` (``pointwise_activation``, in chunks), the spectral multiply (``mix_channels``), and
the projection's two layers (``chunked_mlp``); and the unrecorded tail and lift (``accumulate_in_place``,
``linear_into``) against the same expressions."""

from __future__ import annotations

import pytest
import torch
from reference import TOL, random_tensor, rel_err, unfused, unfused_fno
from torch.nn import functional as F

from drift.nn import FNO, set_recompute
from drift.nn.chunked import _activate_into, accumulate_in_place, chunked_mlp, linear_into, pointwise_activation
from drift.nn.spectral import mix_channels

ACTIVATIONS = {
    "gelu": F.gelu,  # closed-form derivative
    "GELU-module": torch.nn.GELU(),
    "tanh": torch.tanh,  # autograd on each chunk
    "gelu-tanh-approx": torch.nn.GELU(approximate="tanh"),
    "none": None,
}


def _inputs(dtype, bias=True, batch=3, c_in=4, c_out=5, spatial=(6, 5)):
    x = random_tensor((batch, c_in, *spatial), dtype, 1).requires_grad_(True)
    y = random_tensor((batch, c_out, *spatial), dtype, 2).requires_grad_(True)
    w = random_tensor((c_out, c_in), dtype, 3).requires_grad_(True)
    b = random_tensor((c_out,), dtype, 4).requires_grad_(True) if bias else None
    return x, y, w, b


def _leaves(*tensors):
    return [t.detach().double().requires_grad_(True) for t in tensors if t is not None]


@pytest.mark.parametrize("act", ACTIVATIONS.values(), ids=ACTIVATIONS.keys())
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("points", [None, 1, 7], ids=["one-chunk", "1-point-chunks", "7-point-chunks"])
def test_value_and_gradients_equal_autograd(act, dtype, points):
    """Batch 3, 30 points: one chunk, 30 chunks, or 5 chunks of 7 and a ragged one of 2."""
    x, y, w, b = _inputs(dtype)
    per_point = 2 * 3 * (4 + 5) * dtype.itemsize  # pointwise_activation's bytes per point
    out = pointwise_activation(w, b, x, y.clone(), act, chunk_bytes=points and per_point * points)
    grad = random_tensor(out.shape, dtype, 5)
    out.backward(grad)
    refs = _leaves(x, y, w, b)
    want = unfused(*refs, act)
    want.backward(grad.double())
    assert out.dtype == dtype and rel_err(out, want) <= TOL[dtype]
    for name, got, ref in zip("xywb", (x, y, w, b), refs, strict=True):
        assert rel_err(got.grad, ref.grad) <= TOL[dtype], name


@pytest.mark.parametrize("act", [F.gelu, None], ids=["gelu", "none"])
def test_without_bias_and_partial_gradients(act):
    """No bias; only W needs a gradient (x and y constants)."""
    x, y, w, _ = _inputs(torch.float64, bias=False, batch=2)
    out = pointwise_activation(w, None, x.detach(), y.detach().clone(), act, chunk_bytes=1)
    out.backward(random_tensor(out.shape, torch.float64, 6))
    ref_w = w.detach().clone().requires_grad_(True)
    unfused(x.detach(), y.detach(), ref_w, None, act).backward(random_tensor(out.shape, torch.float64, 6))
    assert rel_err(w.grad, ref_w.grad) <= 1e-12


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("bias", [True, False], ids=["bias", "no-bias"])
def test_without_y_is_the_pointwise_layer(dtype, bias):
    """``y=None``: ``W x + b`` alone (PointwiseLinear's recorded path), in 7-point chunks."""
    x, _, w, b = _inputs(dtype, bias=bias)
    out = pointwise_activation(w, b, x, None, None, chunk_bytes=2 * 3 * (4 + 5) * dtype.itemsize * 7)
    grad = random_tensor(out.shape, dtype, 7)
    out.backward(grad)
    refs = _leaves(x, w, b)
    want = unfused(refs[0], 0, *refs[1:], None) if bias else unfused(refs[0], 0, refs[1], None, None)
    want.backward(grad.double())
    assert rel_err(out, want) <= TOL[dtype]
    for got, ref in zip((x, w, b), refs, strict=False):
        assert rel_err(got.grad, ref.grad) <= TOL[dtype]
    with pytest.raises(ValueError, match="no non_linearity"):
        pointwise_activation(w, b, x, None, F.gelu)


@pytest.mark.parametrize("act", ACTIVATIONS.values(), ids=ACTIVATIONS.keys())
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("bias", [True, False], ids=["bias", "no-bias"])
def test_unrecorded_tail_overwrites_y(monkeypatch, act, dtype, bias):
    """``accumulate_in_place`` in 7-point chunks (batch 3, 30 points): exact GeLU once over the whole of
    ``y`` after the chunks, any other activation on each chunk."""
    import drift.nn.chunked as chunked

    x, y, w, b = (t.detach() if t is not None else None for t in _inputs(dtype, bias=bias))
    monkeypatch.setitem(chunked.CHUNK_BYTES, x.device.type, 3 * (4 + 5) * dtype.itemsize * 7)
    want = unfused(*_leaves(x, y, w), b if b is None else b.double(), act)
    target = y.clone()
    with torch.no_grad():
        assert accumulate_in_place(w, b, x, target, act) is target
    assert rel_err(target, want) <= TOL[dtype]


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("bias", [True, False], ids=["bias", "no-bias"])
def test_linear_into_is_the_pointwise_layer(monkeypatch, dtype, bias):
    """``linear_into`` in pieces of 7 points a thread (batch 3, 30 points: a ragged last piece)."""
    import drift.nn.chunked as chunked

    x, _, w, b = (t.detach() if t is not None else None for t in _inputs(dtype, bias=bias))
    monkeypatch.setattr(chunked, "PIECE_BYTES", (4 + 5) * dtype.itemsize * 7)
    out = torch.full((3, 5, 6, 5), float("nan"), dtype=dtype)
    assert linear_into(w, b, x, out) is out
    want = unfused(*_leaves(x), 0, w.double(), b if b is None else b.double(), None)
    assert rel_err(out, want) <= TOL[dtype]


def test_second_backward_raises_unless_saved_tensors_are_copied():
    x, y, w, b = _inputs(torch.float64)
    out = pointwise_activation(w, b, x, y.clone(), F.gelu, chunk_bytes=1)
    out.sum().backward(retain_graph=True)
    with pytest.raises(RuntimeError, match="second backward"):
        out.sum().backward()

    def tail(x, y, w, b):
        return pointwise_activation(w, b, x, y.clone(), F.gelu, chunk_bytes=2 * 2 * 5 * 8 * 4)

    small = [t.detach()[:2, :, :3].contiguous().requires_grad_(True) for t in (x, y)]
    with torch.autograd.graph.saved_tensors_hooks(lambda t: t, lambda t: t.clone()):
        assert torch.autograd.gradcheck(tail, (*small, w, b))


@pytest.mark.parametrize("non_linearity", [F.gelu, torch.tanh], ids=["gelu", "tanh"])
def test_fno_gradients_equal_the_unfused_model(monkeypatch, non_linearity):
    """The FNO's recorded blocks run through ``pointwise_activation`` (small chunks forced)."""
    import drift.nn.chunked as chunked

    torch.manual_seed(5)
    model = FNO(2, 3, 6, (2, 2, 3), n_layers=3, dtype=torch.float64, non_linearity=non_linearity)
    x = random_tensor((2, 2, 9, 8, 6), torch.float64, 10).requires_grad_(True)
    monkeypatch.setitem(chunked.CHUNK_BYTES, x.device.type, 2 * 2 * (6 + 6) * 8 * 50)
    grad = random_tensor((2, 3, 9, 8, 6), torch.float64, 11)
    model(x).backward(grad)
    grads = {name: p.grad.clone() for name, p in model.named_parameters()}
    grad_x = x.grad.clone()
    model.zero_grad()
    x.grad = None
    unfused_fno(model, x).backward(grad)
    assert rel_err(grad_x, x.grad) <= 1e-12
    for name, p in model.named_parameters():
        assert rel_err(grads[name], p.grad) <= 1e-12, name


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("batch", [1, 3])
def test_mix_channels_gradients_equal_einsum(dtype, batch):
    """The spectral multiply's own backward against autograd through einsum; twice differentiable."""
    cdtype = torch.complex128 if dtype == torch.float64 else torch.complex64
    x = random_tensor((batch, 4, 3, 5), dtype, 7, complex_=True).to(cdtype).requires_grad_(True)
    w = random_tensor((4, 6, 3, 5), dtype, 8, complex_=True).to(cdtype).requires_grad_(True)
    grad = random_tensor((batch, 6, 3, 5), dtype, 9, complex_=True).to(cdtype)
    y = mix_channels(x, w)
    y.backward(grad)
    refs = [t.detach().to(torch.complex128).requires_grad_(True) for t in (x, w)]
    want = torch.einsum("bi...,io...->bo...", *refs)
    want.backward(grad.to(torch.complex128))
    assert rel_err(y, want) <= TOL[dtype]
    assert rel_err(x.grad, refs[0].grad) <= TOL[dtype] and rel_err(w.grad, refs[1].grad) <= TOL[dtype]
    if dtype == torch.float64:
        small = [t.detach()[:2, :2, :2, :2].clone().requires_grad_(True) for t in (x, w)]
        assert torch.autograd.gradgradcheck(mix_channels, small)


@pytest.mark.parametrize("act", [F.gelu, torch.tanh], ids=["gelu", "tanh"])
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("points", [None, 7], ids=["one-chunk", "7-point-chunks"])
@pytest.mark.parametrize("threads", [1, 3])
def test_chunked_mlp_equals_autograd(act, dtype, points, threads):
    """The projection's two layers: value and every gradient, batch 2, 30 points (ragged chunks of 7), its
    backward's chunks cut into one piece per thread where they divide (30 points into 3, not 7)."""
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        _check_chunked_mlp(act, dtype, points)
    finally:
        torch.set_num_threads(before)


def _check_chunked_mlp(act, dtype, points):
    x = random_tensor((2, 4, 6, 5), dtype, 1).requires_grad_(True)
    params = [
        random_tensor(shape, dtype, 2 + i).requires_grad_(True) for i, shape in enumerate([(9, 4), (9,), (3, 9), (3,)])
    ]
    per_point = 3 * 9 * dtype.itemsize  # chunked_mlp's bytes per point
    out = chunked_mlp(x, *params, act, chunk_bytes=points and per_point * points)
    grad = random_tensor(out.shape, dtype, 6)
    out.backward(grad)
    refs = _leaves(x, *params)
    hidden = unfused(refs[0], 0, refs[1], refs[2], act)
    want = unfused(hidden, 0, refs[3], refs[4], None)
    want.backward(grad.double())
    assert out.dtype == dtype and rel_err(out, want) <= TOL[dtype]
    for name, got, ref in zip(("x", "w1", "b1", "w2", "b2"), (x, *params), refs, strict=True):
        assert rel_err(got.grad, ref.grad) <= TOL[dtype], name


@pytest.mark.parametrize("gated", [True, False], ids=["soft-gating", "identity"])
@pytest.mark.parametrize("out_act", [F.gelu, torch.tanh, None], ids=["gelu", "tanh", "none"])
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("points", [None, 7], ids=["one-chunk", "7-point-chunks"])
@pytest.mark.parametrize("threads", [1, 3])
def test_channel_mlp_tail_equals_autograd(gated, out_act, dtype, points, threads):
    """neuraloperator's block tail ``out_act(W2 gelu(W1 y + b1) + b2 + gate * x)`` as one node: value and
    every gradient (the skip's input and gain too), ragged chunks, pieces per thread."""
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        y = random_tensor((2, 4, 6, 5), dtype, 1).requires_grad_(True)
        x = random_tensor((2, 3, 6, 5), dtype, 7).requires_grad_(True)
        shapes = [(9, 4), (9,), (3, 9), (3,)] + ([(3,)] if gated else [])
        params = [random_tensor(shape, dtype, 2 + i).requires_grad_(True) for i, shape in enumerate(shapes)]
        per_point = 3 * 9 * dtype.itemsize  # chunked_mlp's bytes per point
        out = chunked_mlp(
            y,
            *params[:4],
            F.gelu,
            chunk_bytes=points and per_point * points,
            skip=x,
            gate=params[4] if gated else None,
            out_non_linearity=out_act,
        )
        grad = random_tensor(out.shape, dtype, 6)
        out.backward(grad)
    finally:
        torch.set_num_threads(before)
    refs = _leaves(y, x, *params)
    skip = refs[1] * refs[6].view(-1, 1, 1) if gated else refs[1]
    want = unfused(unfused(refs[0], 0, refs[2], refs[3], F.gelu), skip, refs[4], refs[5], out_act)
    want.backward(grad.double())
    assert out.dtype == dtype and rel_err(out, want) <= TOL[dtype]
    for name, got, ref in zip(("y", "x", "w1", "b1", "w2", "b2", "gate"), (y, x, *params), refs, strict=False):
        assert rel_err(got.grad, ref.grad) <= TOL[dtype], name


def test_neuralop_block_tail_runs_as_one_node():
    """With ``recompute_mlp``, a neuraloperator block's channel MLP, soft-gating skip and activation are one
    autograd node in a training forward (its hidden layer recomputed, not kept), and the block equals its
    parts written out; without, its parts run as modules."""
    torch.manual_seed(0)
    model = FNO.neuralop_defaults(2, 1, 8, (3, 3), recompute_mlp=True, dtype=torch.float64)
    block = model.blocks[0]
    x = random_tensor((2, 8, 9, 7), torch.float64, 1).requires_grad_(True)
    out = block(x)
    assert type(out.grad_fn).__name__ == "_ChunkedMLPBackward"
    y = block.spectral(x) + block.skip(x)
    want = F.gelu(block.channel_mlp(F.gelu(y)) + block.channel_mlp_skip(x))
    assert rel_err(out, want) <= 1e-12
    set_recompute(model, None)
    assert type(block(x).grad_fn).__name__ == "GeluBackward0"


def test_activate_into_a_strided_view():
    """A chunk's activation written into the strided pieces of a block (``_split``'s view): aten's
    ``gelu.out`` gives wrong values there, so the view takes the activation through a copy."""
    h = random_tensor((3, 4, 10), torch.float64, 1)
    block = torch.zeros(4, 30, dtype=torch.float64)
    view = block.unflatten(-1, (3, 10)).transpose(0, 1)
    _activate_into(F.gelu, h, view)
    assert torch.equal(view, F.gelu(h))


def test_an_empty_block_gives_zero_parameter_gradients():
    """A rank holding no points of an uneven split: empty outputs, zero gradients, no error."""
    x, y, w, b = _inputs(torch.float64, spatial=(0, 5))
    out = pointwise_activation(w, b, x, y.clone(), F.gelu)
    params = [random_tensor(shape, torch.float64, 9).requires_grad_(True) for shape in [(6, 4), (6,), (3, 6), (3,)]]
    projected = chunked_mlp(x, *params, F.gelu)
    (out.sum() + projected.sum()).backward()
    assert out.shape == y.shape and projected.shape == (3, 3, 0, 5)
    for t in (x, y, w, b, *params):
        assert t.grad is not None and t.grad.shape == t.shape and not t.grad.any()
