"""What each rank keeps of an epoch: seconds per phase (``PhaseClock``), the flags the ranks agree on
after each step (``step_flags``), and the running sums of the loss and the batches (``EpochSums``), which
a mid-epoch checkpoint records and a resumed run continues."""

from __future__ import annotations

import contextlib
import math
import time
from collections.abc import Iterator
from dataclasses import dataclass

import torch

from drift import comm
from drift.layout import local_block
from drift.nn import FNO


class PhaseClock:
    """Rank-local seconds per phase of an epoch (``with clock("forward"): ...``), summed over its steps;
    on CUDA each phase ends with a synchronisation, so that its kernels count in it."""

    def __init__(self, device: torch.device) -> None:
        self.device, self.seconds = device, {}

    @contextlib.contextmanager
    def __call__(self, name: str) -> Iterator[None]:
        began = time.perf_counter()
        yield
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        self.seconds[name] = self.seconds.get(name, 0.0) + time.perf_counter() - began


# The flags the ranks agree on after each step's backward, in one all-reduce.
_FLAGS = ("loss", "gradient norm", "stop", "checkpoint")


def step_flags(loss: torch.Tensor, model: FNO, stop: bool, checkpoint: bool) -> dict[str, bool]:
    """What holds on any rank after a step's backward: a non-finite loss or gradient norm (of its share of
    the loss, the norm of its blocks of the gradients), a stop requested (a signal) or a checkpoint due;
    one all-reduce."""
    norms = [torch.linalg.vector_norm(local_block(p.grad)).double() for p in model.parameters() if p.grad is not None]
    local = [~torch.isfinite(loss.detach()), ~torch.isfinite(torch.stack(norms).sum())]
    flags = torch.stack([*local, *(torch.tensor(f, device=loss.device) for f in (stop, checkpoint))]).double()
    return {name: bool(flag) for name, flag in zip(_FLAGS, comm.all_reduce(flags).tolist(), strict=True)}


@dataclass
class EpochSums:
    """An epoch's running sums on this rank: its share of the loss summed over the trained trajectories,
    and the batches trained and skipped; ``step`` is the last step done."""

    total: float = 0.0
    trained: int = 0
    skipped: int = 0
    step: int = 0

    def saved(self) -> dict:
        """What a mid-epoch checkpoint records of it: every rank's loss sum (all-gathered), the counts."""
        totals = comm.all_gather_object(self.total)
        return dict(totals=totals, trained=self.trained, skipped=self.skipped, step=self.step)

    @classmethod
    def resumed(cls, saved: dict | None) -> EpochSums:
        """The sums of a mid-epoch checkpoint's ``saved()``: each rank's own at the same rank count (the
        same sums in the same order as the uninterrupted run), else their sum on rank 0."""
        if saved is None:
            return cls()
        totals = saved["totals"]
        if len(totals) == comm.world_size():
            total = totals[comm.rank()]
        else:
            total = math.fsum(totals) if comm.rank() == 0 else 0.0
        return cls(total, saved["trained"], saved["skipped"], saved["step"])
