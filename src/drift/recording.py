"""Whether autograd records an operation: the one rule every fast path asks before it chooses between its
autograd node and its in-place, workspace-backed path."""

from __future__ import annotations

import torch


def recorded(*tensors: torch.Tensor | None) -> bool:
    """Whether autograd records an operation on ``tensors`` now: grad mode is on and one of them (Nones
    ignored) requires grad. An unrecorded operation may write into resident buffers or its own inputs,
    since nothing will read them for a backward pass."""
    return torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in tensors)
