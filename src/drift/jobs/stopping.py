"""Stopping on a signal at the next step boundary, with a checkpoint.

Schedulers warn before they kill: SLURM and Kubernetes send SIGTERM (then SIGKILL after a grace period,
SLURM's ``KillWait``, about 30 s by default), and ``sbatch --signal=B:USR1@N`` sends SIGUSR1 up to N
seconds before a job's time limit. ``StopSignals`` turns SIGTERM and SIGUSR1 into a request that the
training loop reads at each step boundary; the ranks agree on it there (with the step's other flags),
write a checkpoint and stop with ``Stopped``: ``drift train`` then exits with ``EXIT_STOPPED`` and
rank 0 leaves ``<out>/stopped.json`` (what stopped it, and the checkpoint) for a job script to requeue
itself by.
"""

from __future__ import annotations

import signal
from types import FrameType, TracebackType

SIGNALS = (signal.SIGTERM, signal.SIGUSR1)
EXIT_STOPPED = 75  # EX_TEMPFAIL (sysexits.h): stopped, with a checkpoint; run again to continue
STOPPED = "stopped.json"


class Stopped(Exception):
    """Training stopped on a signal after writing a checkpoint; the message says which signal, where and
    the checkpoint."""


class StopSignals:
    """Inside the ``with`` block SIGTERM and SIGUSR1 set ``received`` (the first one's name) instead of
    ending the process; the earlier handlers come back at the end. Install from the main thread."""

    def __init__(self) -> None:
        self.received: str | None = None
        self._before: dict[int, object] = {}

    def _handle(self, number: int, _: FrameType | None) -> None:
        if self.received is None:
            self.received = signal.Signals(number).name

    def __enter__(self) -> StopSignals:
        for number in SIGNALS:
            self._before[number] = signal.signal(number, self._handle)
        return self

    def __exit__(self, kind: type | None, value: BaseException | None, tb: TracebackType | None) -> None:
        for number, handler in self._before.items():
            signal.signal(number, handler)
