"""Collective timeouts that fit the work: one bound per phase of training.

torch's process groups wait 30 minutes for a peer by default: a host cut off by a partition, or stopped,
would hold every other host that long, silent. ``PhaseTimeouts`` gives each phase of a training run its
own bound and sets it on every group drift uses (``drift.comm.set_timeout``) as the phase begins:

- ``"step"`` (forward, backward, optimizer), ``"test"`` (the test pass) and ``"checkpoint"`` (a write):
  ``max(FLOOR_S, FACTOR x the slowest one so far)`` on this rank, with ``FIRST_S`` until one has been
  timed (the first step builds the plans; the first write creates the files);
- a fixed ``override_s`` for every phase instead (``drift train --collective-timeout SECONDS``).

Start-up (generating the default data, the statistics pass) keeps the group's own timeout
(``drift.jobs.launch.GROUP_TIMEOUT_S``).
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator

from drift import comm

FACTOR = 20.0  # a phase may take this many times its slowest so far before a peer is given up on
FIRST_S = 600.0  # a phase's bound until it has been timed once
FLOOR_S = 60.0  # the least a phase waits for a peer


_NAMES = {"step": "a training step", "test": "the test pass", "checkpoint": "a checkpoint write"}


class PhaseTimeouts:
    """Per-phase collective timeouts (``with timeouts("step", "epoch 3, step 2"): ...``); ``doing()`` says
    which phase runs, where and its bound, for an error message."""

    def __init__(self, override_s: float | None = None) -> None:
        self.override_s = override_s
        self.slowest: dict[str, float] = {}
        self.phase: str | None = None
        self.where = ""
        self.bound_s: float | None = None

    def bound(self, phase: str) -> float:
        """The timeout of the next ``phase``, in seconds."""
        if self.override_s is not None:
            return self.override_s
        if phase not in self.slowest:
            return FIRST_S
        return max(FLOOR_S, FACTOR * self.slowest[phase])

    @contextlib.contextmanager
    def __call__(self, phase: str, where: str = "") -> Iterator[None]:
        """Inside the block collectives time out after ``bound(phase)``; the block's time is recorded."""
        bound = self.bound(phase)
        if bound != self.bound_s:
            comm.set_timeout(bound)
        self.phase, self.where, self.bound_s = phase, where, bound
        began = time.monotonic()
        yield
        self.slowest[phase] = max(self.slowest.get(phase, 0.0), time.monotonic() - began)

    def doing(self) -> str:
        """``a training step (epoch 3, step 2; collective timeout 60 s)``, or ``start-up``."""
        if self.phase is None:
            return "start-up"
        where = f"{self.where}; " if self.where else ""
        return f"{_NAMES[self.phase]} ({where}collective timeout {self.bound_s:g} s)"
