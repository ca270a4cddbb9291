"""drift._compat's exit: the exit handlers run and the code is kept, with Python's private handler runner
and with the public ``sys.exit`` it falls back to; its conversion hooks: what each runs, in which order,
for a module and its children, and a plan converted in an inference pass serving training. (Its storage
count and fused Adam are tested with the pool, tests/test_memory.py, and the optimizer,
tests/test_optim.py, on both paths; conversions of plans and models with tests/test_truncated.py,
test_fft.py and test_nn.py.)"""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch
from torch import nn

import drift
from drift._compat import ConversionHooks

SCRIPT = """
import atexit, sys
from pathlib import Path
from drift import _compat
if {remove}:
    del atexit._run_exitfuncs
atexit.register(lambda: Path({path!r}).write_text("handlers ran"))
print("flushed", end="")
_compat.exit_now(3)
print("not reached")
"""


@pytest.mark.parametrize("remove", [False, True], ids=["private", "public"])
def test_exit_now_runs_the_exit_handlers_and_keeps_the_code(tmp_path, remove):
    path = tmp_path / "ran"
    done = subprocess.run(
        [sys.executable, "-c", SCRIPT.format(remove=remove, path=str(path))],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 3, done.stderr
    assert done.stdout == "flushed" and path.read_text() == "handlers ran"


class _Logged(ConversionHooks):
    def __init__(self, name: str, log: list, child: nn.Module | None = None) -> None:
        super().__init__()
        self.name, self.log, self.child = name, log, child
        self.register_buffer("x", torch.zeros(2))

    def _conversion(self, fn):
        def logged(t):
            self.log.append(f"{self.name} converts")
            return fn(t)

        return logged

    def _before_conversion(self) -> None:
        self.log.append(f"{self.name} before")

    def _after_conversion(self) -> None:
        self.log.append(f"{self.name} after")


def test_conversion_hooks_run_around_each_modules_conversion():
    log = []
    outer = _Logged("outer", log, _Logged("inner", log))
    assert outer.double() is outer and outer.x.dtype == outer.child.x.dtype == torch.float64
    # torch converts the children first; the outer function wraps what each child applies.
    assert log == [
        "outer before",
        "inner before",
        "inner converts",
        "outer converts",
        "inner after",
        "outer converts",
        "outer after",
    ]


def test_a_plan_converted_in_inference_mode_serves_training():
    plan = drift.TruncatedFFT((8, 6), (2, 2), dtype=torch.float32)
    with torch.inference_mode():
        plan.double()
    x = torch.randn(2, 8, 6, dtype=torch.float64, requires_grad=True)
    plan(x).abs().sum().backward()
    assert x.grad is not None and plan.dtype == torch.float64
