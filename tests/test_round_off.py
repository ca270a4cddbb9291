"""A run on another kind of host agrees with this host's to round-off, not to the bit.

Other CPUs take other kernels for matrix products and FFTs and other thread counts add partial sums in
another order. This host imitates one: MKL restricted to SSE4.2, ATen's portable kernels, one thread
(the CI step that runs the ``other_host`` tests under the same variables does the same to the fixtures).
"""

import os
import subprocess
import sys

import pytest
from runs import HANG_S, assert_same_metrics, metric_rows, tiny_data, train_argv

from drift.cli import main

pytestmark = pytest.mark.other_host

# What another x86-64 host may differ in, as far as one host can imitate it.
OTHER_HOST = dict(OMP_NUM_THREADS="1", ATEN_CPU_CAPABILITY="default", MKL_ENABLE_INSTRUCTIONS="SSE4_2")


def test_a_run_on_other_kernels_and_threads_trains_as_this_one(tmp_path):
    data = tiny_data(tmp_path / "cfd.hdf5")
    here, there = tmp_path / "here", tmp_path / "there"
    assert main(train_argv(data, here, "--epochs", "3")) == 0
    argv = [sys.executable, "-m", "drift", *train_argv(data, there, "--epochs", "3")]
    done = subprocess.run(argv, env={**os.environ, **OTHER_HOST}, capture_output=True, text=True, timeout=HANG_S)
    assert done.returncode == 0, done.stderr
    assert_same_metrics(metric_rows(there), metric_rows(here))
