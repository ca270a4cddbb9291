"""Adam and AdamW whose step runs torch's fused kernel on complex parameters too.

``torch.optim.Adam(fused=True)`` refuses complex parameters, and the default loop makes two fresh
temporaries the size of each parameter on every step. An FNO's spectral weights are complex and its
largest parameters, so on the CPU that loop spends more time in those temporaries' page faults and
passes than in the update. Adam is elementwise over real and imaginary parts (torch's loop itself
updates ``view_as_real`` of a complex parameter), so these classes hand the fused kernel real views of
each complex parameter, its gradient and its state: the same update in one pass.

Their state is torch's (``step``, complex ``exp_avg`` and ``exp_avg_sq``, ``max_exp_avg_sq`` with
``amsgrad``), so state dicts, DCP's optimizer state dicts and drift's checkpoints carry over between
these classes and torch's in both directions. DTensor parameters are updated through their local
tensors, the update being elementwise.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable

import torch
from torch.distributed.tensor import DTensor

from drift._compat import fused_adam


def _real(t: torch.Tensor) -> torch.Tensor:
    """The local tensor of ``t`` (a DTensor's shard), as real values (``view_as_real`` of a complex one)."""
    local = t.to_local() if isinstance(t, DTensor) else t
    return torch.view_as_real(local) if local.is_complex() else local


class _FusedStep:
    """The step of ``torch.optim.Adam`` / ``AdamW`` through torch's fused kernel on real views
    (``drift._compat.fused_adam``)."""

    param_groups: list[dict]
    state: dict

    def __init__(self, params, *args, **kwargs) -> None:
        chosen = sorted({"foreach", "fused", "capturable", "differentiable"} & kwargs.keys())
        if chosen:
            raise TypeError(f"{type(self).__name__} always takes torch's fused step: it takes no {', '.join(chosen)}")
        super().__init__(params, *args, **kwargs)

    @torch.no_grad()
    def step(self, closure: Callable[[], float] | None = None) -> float | None:
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            if group.get("differentiable") or group.get("capturable"):
                raise ValueError(f"{type(self).__name__} supports neither differentiable=True nor capturable=True")
            lists: dict[tuple, tuple[list, ...]] = defaultdict(lambda: ([], [], [], [], [], []))
            for p in group["params"]:
                if p.grad is None:
                    continue
                if p.grad.is_sparse:
                    raise RuntimeError(f"{type(self).__name__} does not support sparse gradients")
                state = self._state(p, group["amsgrad"])
                real = _real(p)
                moments = ("exp_avg", "exp_avg_sq", "max_exp_avg_sq") if group["amsgrad"] else ("exp_avg", "exp_avg_sq")
                params, grads, *states, steps = lists[real.device, real.dtype]
                params.append(real)
                grads.append(_real(p.grad))
                for into, key in zip(states, moments, strict=False):  # max_exp_avg_sqs stays empty without amsgrad
                    into.append(_real(state[key]))
                steps.append(state["step"])
            beta1, beta2 = group["betas"]
            decoupled = group.get("decoupled_weight_decay", isinstance(self, torch.optim.AdamW))
            fused = fused_adam(decoupled)
            for params, grads, exp_avgs, exp_avg_sqs, max_exp_avg_sqs, steps in lists.values():
                fused(
                    params,
                    grads,
                    exp_avgs,
                    exp_avg_sqs,
                    max_exp_avg_sqs,
                    steps,
                    amsgrad=group["amsgrad"],
                    lr=group["lr"],
                    beta1=beta1,
                    beta2=beta2,
                    weight_decay=group["weight_decay"],
                    eps=group["eps"],
                    maximize=group["maximize"],
                )
        return loss

    def _state(self, p: torch.Tensor, amsgrad: bool) -> dict:
        """``p``'s state as torch's Adam makes it; a loaded ``step`` moved to a float32 tensor on the
        device of ``p``'s values, where the fused kernel counts it."""
        state = self.state[p]
        device = _real(p).device
        if not state:
            state["step"] = torch.zeros((), dtype=torch.float32, device=device)
            state["exp_avg"] = torch.zeros_like(p, memory_format=torch.preserve_format)
            state["exp_avg_sq"] = torch.zeros_like(p, memory_format=torch.preserve_format)
        step = state["step"]
        if not isinstance(step, torch.Tensor) or step.dtype != torch.float32 or step.device != device:
            state["step"] = torch.tensor(float(step), dtype=torch.float32, device=device)
        if amsgrad and "max_exp_avg_sq" not in state:
            state["max_exp_avg_sq"] = torch.zeros_like(p, memory_format=torch.preserve_format)
        return state


class Adam(_FusedStep, torch.optim.Adam):
    """``torch.optim.Adam`` (same arguments, defaults and state) whose step is torch's fused kernel, on
    real views of complex parameters."""


class AdamW(_FusedStep, torch.optim.AdamW):
    """``torch.optim.AdamW`` (decoupled weight decay; same arguments, defaults and state) whose step is
    torch's fused kernel, on real views of complex parameters."""
