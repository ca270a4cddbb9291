"""Every private API of torch or Python drift uses, each behind a feature check with a public fallback.

- ``storage_use_count``: how many tensors share a storage (``torch._C._storage_Use_Count``), which lets
  ``drift.memory``'s pool hand a storage out again; without it (None) the pool hands out fresh tensors.
- ``fused_adam``: torch's fused Adam / AdamW kernel (``torch._fused_adam_``, ``torch._fused_adamw_``,
  with ``torch._foreach_add_`` counting the steps); without them, ``torch.optim.adam.adam``'s for-each
  implementation of the same step (``torch.optim.adam.adam``).
- ``exit_now``: end a process after running its exit handlers (``atexit._run_exitfuncs``) without the
  interpreter's teardown; without it, a normal ``sys.exit``.
- ``ConversionHooks``: a module's conversions (``.to``, ``.cuda``, ``.double``, ``to_empty``, ...) seen by
  the module, through ``Module._apply``, the one path torch converts every module by. No public API sees
  a conversion, so there is no fallback: drift overrides ``_apply`` here only, and its conversion tests
  (``.double()`` of a plan, a model's ``.to``) fail on a torch that converts otherwise.
"""

from __future__ import annotations

import atexit
import os
import sys
from collections.abc import Callable

import torch
from torch import nn
from torch.optim.adam import adam as _adam_for_each

_use_count = getattr(getattr(torch, "_C", None), "_storage_Use_Count", None)


def counts_storage_uses() -> bool:
    """Whether ``storage_use_count`` can say (torch has the private counter)."""
    return _use_count is not None


def storage_use_count(storage: torch.UntypedStorage) -> int | None:
    """The number of tensors (and storage handles) on ``storage``, or None where torch cannot say."""
    if _use_count is None:
        return None
    return _use_count(storage._cdata)


def fused_adam(decoupled: bool) -> Callable:
    """A function ``(params, grads, exp_avgs, exp_avg_sqs, max_exp_avg_sqs, steps, *, amsgrad, lr, beta1,
    beta2, weight_decay, eps, maximize)`` that counts ``steps`` and takes one Adam step (AdamW's when
    ``decoupled``) of lists of real tensors in place: torch's fused kernel, or its for-each step."""
    kernel = getattr(torch, "_fused_adamw_" if decoupled else "_fused_adam_", None)
    count = getattr(torch, "_foreach_add_", None)
    if kernel is None or count is None:

        def step(params, grads, exp_avgs, exp_avg_sqs, max_exp_avg_sqs, steps, **options):
            _adam_for_each(
                params,
                grads,
                exp_avgs,
                exp_avg_sqs,
                max_exp_avg_sqs,
                steps,
                foreach=True,
                decoupled_weight_decay=decoupled,
                **options,
            )

        return step

    def fused(params, grads, exp_avgs, exp_avg_sqs, max_exp_avg_sqs, steps, **options):
        count(steps, 1)
        kernel(params, grads, exp_avgs, exp_avg_sqs, max_exp_avg_sqs, steps, **options)

    return fused


def exit_now(code: int = 0) -> None:
    """End this process with ``code`` after its exit handlers and a flush of the standard streams."""
    run_handlers = getattr(atexit, "_run_exitfuncs", None)
    if run_handlers is None:
        sys.exit(code)
    run_handlers()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


class ConversionHooks(nn.Module):
    """A module told of its conversions. A conversion runs ``_before_conversion()`` (release what it makes
    stale), then applies ``_conversion(fn)`` in place of torch's ``fn`` to the module's tensors and its
    children's (each child running its own hooks), then ``_after_conversion()`` (rebuild from the converted
    tensors); it returns the module. The hooks do nothing unless overridden."""

    def _conversion(self, fn: Callable[[torch.Tensor], torch.Tensor]) -> Callable[[torch.Tensor], torch.Tensor]:
        return fn

    def _before_conversion(self) -> None:
        pass

    def _after_conversion(self) -> None:
        pass

    def _apply(self, fn, recurse=True):
        self._before_conversion()
        super()._apply(self._conversion(fn), recurse)
        self._after_conversion()
        return self
