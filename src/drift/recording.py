"""What every fast path asks before it chooses between its autograd node and its in-place,
workspace-backed path, and between its own precision and autocast's: whether autograd records an
operation (``recorded``) and whether ``torch.autocast`` is on (``autocasting``). Each is asked here only,
so the rule is the same everywhere."""

from __future__ import annotations

import torch


def recorded(*tensors: torch.Tensor | None) -> bool:
    """Whether autograd records an operation on ``tensors`` now: grad mode is on and one of them (Nones
    ignored) requires grad. An unrecorded operation may write into resident buffers or its own inputs,
    since nothing will read them for a backward pass."""
    return torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in tensors)


def autocasting(x: torch.Tensor) -> bool:
    """Whether ``torch.autocast`` is on now for ``x``'s device type: the fast paths then take their
    whole-tensor forms, whose operations autocast casts."""
    return torch.is_autocast_enabled(x.device.type)
