"""drift.cost picks what the two models it merged (drift.nn.auto and drift.bench.comm, at bab9d58) picked.

Every case of the models in the tests (tests/test_cost_model.py, and the cases of test_nn, test_reduction,
test_train, test_bench and benchmarks/two_level.py that choose by them): the choice of the merged model
against the choice bab9d58's code made, recorded by running it (``EXPECTED``). A choice is a reduction mesh
shape (None: one level per split dim), the methods cheapest first, or a projection's grid, reduction and
faster method. The old module paths still give the models, with a DeprecationWarning.
"""

from __future__ import annotations

import importlib
import math

import pytest

from drift.bench import comm
from drift.cost import Fit, Hosts, Machine, best_reduction, choose_method, choose_reduction, drift_reduction
from drift.modes import mode_lists

ALPHA, BETA = 1e-4, 1e-9  # tests/test_cost_model.py's host
LINK = Hosts(2, 1e-3, 8e-9)
ONE_A_HOST = Hosts(1, 1e-4, 8e-9)
MACHINES = {
    "one host": Machine(1e10, 1e10, ALPHA, BETA),
    "two levels": Machine(1e10, 1e10, ALPHA, BETA, LINK),
    "no latency": Machine(1, 1, 0.0, BETA),
    "one a host": Machine(1e10, 1e10, ALPHA, BETA, ONE_A_HOST, True),
    "one a host, copies": Machine(1e10, 1e10, ALPHA, BETA, ONE_A_HOST, True, copy_s_per_byte=4e-10),
    "two a host, copies": Machine(1e10, 1e10, ALPHA, BETA, LINK, True, copy_s_per_byte=4e-10),
    "cpu": Machine.default("cpu"),
    "cuda": Machine.default("cuda"),
    "fast ffts": Machine(1e9, 1e12, 0.0, 0.0),
    "reduction two a host": Machine(1e10, 1e10, 1e-4, 1e-9, Hosts(2, 1e-3, 8e-9)),
    "reduction flat": Machine(1e10, 1e10, 0.0, 1e-9),
    # benchmarks/two_level.py's fitted machine (``_machine``), 2 hosts of 2 ranks and 4 of 1.
    "fitted 2x2": Machine(5e10, 5e9, 1e-4, 1e-9, Hosts(2, 1e-3, 8e-9), True, copy_s_per_byte=4e-10),
    "fitted 4x1": Machine(5e10, 5e9, 1e-4, 1e-9, Hosts(1, 1e-3, 8e-9), True, copy_s_per_byte=4e-10),
}
SPECTRUM = 16 * 16 * 16 * 16 * 8
FNO4D = ((64, 64, 32, 30), (8, 8, 8, 16))


def _reduction(machine: str, parts=(4, 1), spectrum=SPECTRUM, channels=(20, 20)):
    return choose_reduction(
        parts, spectrum, in_channels=channels[0], out_channels=channels[1], machine=MACHINES[machine]
    )


def _ranking(machine: str, shape, modes, parts, channels=(20, 20), **problem) -> tuple[str, ...]:
    choice = choose_method(
        shape, modes, parts, in_channels=channels[0], out_channels=channels[1], machine=MACHINES[machine], **problem
    )
    return tuple(c.method for c in choice.costs)


def _projection(size: int) -> tuple:
    row = comm.project_block(comm.PAPER, (128, 128, 128, 30), (8, 8, 8, 16), 20, size)
    return row["grid"], row["reduction"], "drift" if row["ratio"] > 1 else "dfno"


# test_reduction: a slab of 4 ranks over (16, 6), modes (3, 2), float64 (16-byte spectral values), width 4.
SLAB_SPECTRUM = math.prod(len(m) for m in mode_lists((3, 2), (16, 6), True)) * 16

CASES = {
    # tests/test_cost_model.py
    "reduction one host": lambda: _reduction("one host"),
    "reduction no latency": lambda: _reduction("no latency"),
    "reduction two levels": lambda: _reduction("two levels"),
    "reduction one a host": lambda: _reduction("one a host"),
    "reduction one a host, copies": lambda: _reduction("one a host, copies"),
    "reduction two a host, copies": lambda: _reduction("two a host, copies"),
    "methods two levels": lambda: _ranking("two levels", *FNO4D, (4, 1, 1, 1)),
    "methods two levels 2x2": lambda: _ranking("two levels", *FNO4D, (4, 1, 1, 1), reduction=(2, 2)),
    "methods one a host": lambda: _ranking("one a host", *FNO4D, (4, 1, 1, 1)),
    "methods one a host, copies": lambda: _ranking("one a host, copies", *FNO4D, (4, 1, 1, 1)),
    "methods one a host, copies 2x2": lambda: _ranking("one a host, copies", *FNO4D, (4, 1, 1, 1), reduction=(2, 2)),
    # tests/test_nn.py
    **{
        f"methods {machine} {parts} few modes": (lambda machine=machine, parts=parts: _ranking(machine, *FNO4D, parts))
        for machine in ("cpu", "cuda")
        for parts in ((1, 1, 1, 1), (4, 1, 1, 1), (2, 2, 1, 1))
    },
    **{
        f"methods {machine} {parts} every mode": (
            lambda machine=machine, parts=parts: _ranking(machine, (64, 64, 64), (32, 32, 33), parts)
        )
        for machine in ("cpu", "cuda")
        for parts in ((1, 1, 1), (4, 1, 1), (2, 2, 1))
    },
    "methods cpu (32, 16, 12)": lambda: _ranking("cpu", (32, 16, 12), (4, 3, 5), (4, 1, 1), (3, 2)),
    "methods one device few modes": lambda: _ranking("cpu", (16, 16, 16), (2, 2, 2), (1, 1, 1), (3, 2)),
    "methods one device every mode": lambda: _ranking("fast ffts", (16, 16, 16), (8, 8, 9), (1, 1, 1), (3, 2)),
    "methods parallel few modes": lambda: _ranking("cpu", (16, 12, 10), (2, 2, 2), (2, 2, 1), (6, 6)),
    "methods parallel every mode": lambda: _ranking("cpu", (32, 32, 16), (16, 16, 9), (2, 2, 1), (6, 6)),
    # tests/test_reduction.py: reduction="auto", then method="auto" with the chosen reduction
    "slab reduction two a host": lambda: _reduction("reduction two a host", (4, 1), SLAB_SPECTRUM, (4, 4)),
    "slab reduction flat": lambda: _reduction("reduction flat", (4, 1), SLAB_SPECTRUM, (4, 4)),
    "slab methods two a host": lambda: _ranking(
        "reduction two a host", (16, 6), (3, 2), (4, 1), (4, 4), complex_bytes=16, reduction=(2, 2)
    ),
    # tests/test_train.py: --method auto on the data grid (tests/runs.py: width 4, modes 2), one device
    "methods train": lambda: _ranking("cpu", (8, 8, 8, 4), (2, 2, 2, 2), (1, 1, 1, 1), (4, 4)),
    # benchmarks/two_level.py: method="auto", reduction="auto" on the fitted machine
    **{
        f"two_level {machine}": (
            lambda machine=machine: (
                _reduction(machine, (4, 1, 1, 1)),
                _ranking(machine, *FNO4D, (4, 1, 1, 1), reduction=_reduction(machine, (4, 1, 1, 1))),
            )
        )
        for machine in ("fitted 2x2", "fitted 4x1")
    },
    # tests/test_bench.py
    "best reduction latency": lambda: best_reduction(Fit(1e-4, 2e-10), 32, 10 * 2**20)[0],
    "best reduction bytes": lambda: best_reduction(Fit(0.0, 2e-10), 32, 10 * 2**20)[0],
    "best reduction one rank": lambda: best_reduction(Fit(1e-4, 2e-10), 1, 10 * 2**20)[0],
    "drift reduction bytes": lambda: drift_reduction(Fit(0.0, 1e-9), [16, 2], 16, 1000.0)[0],
    "drift reduction latency": lambda: drift_reduction(Fit(1.0, 0.0), [16, 2], 16, 1000.0)[0],
    **{f"projection {size}": (lambda size=size: _projection(size)) for size in (4, 8, 16, 32, 64, 128, 256, 512, 1024)},
}

# bab9d58's picks on CASES, recorded by running its code.
EXPECTED = {
    "reduction one host": (2, 2),
    "reduction no latency": None,
    "reduction two levels": (2, 2),
    "reduction one a host": (2, 2),
    "reduction one a host, copies": None,
    "reduction two a host, copies": (2, 2),
    "methods two levels": ("dfno-pruned", "drift"),
    "methods two levels 2x2": ("dfno-pruned", "drift"),
    "methods one a host": ("dfno-pruned", "drift"),
    "methods one a host, copies": ("dfno-pruned", "drift"),
    "methods one a host, copies 2x2": ("dfno-pruned", "drift"),
    "methods cpu (1, 1, 1, 1) few modes": ("drift", "dfno-pruned"),
    "methods cpu (4, 1, 1, 1) few modes": ("drift", "dfno-pruned"),
    "methods cpu (2, 2, 1, 1) few modes": ("drift", "dfno-pruned"),
    "methods cuda (1, 1, 1, 1) few modes": ("drift", "dfno-pruned"),
    "methods cuda (4, 1, 1, 1) few modes": ("drift", "dfno-pruned"),
    "methods cuda (2, 2, 1, 1) few modes": ("drift", "dfno-pruned"),
    "methods cpu (1, 1, 1) every mode": ("dfno-pruned", "drift"),
    "methods cpu (4, 1, 1) every mode": ("dfno-pruned", "drift"),
    "methods cpu (2, 2, 1) every mode": ("dfno-pruned", "drift"),
    "methods cuda (1, 1, 1) every mode": ("dfno-pruned", "drift"),
    "methods cuda (4, 1, 1) every mode": ("dfno-pruned", "drift"),
    "methods cuda (2, 2, 1) every mode": ("dfno-pruned", "drift"),
    "methods cpu (32, 16, 12)": ("drift", "dfno-pruned"),
    "methods one device few modes": ("drift", "dfno-pruned"),
    "methods one device every mode": ("dfno-pruned", "drift"),
    "methods parallel few modes": ("drift", "dfno-pruned"),
    "methods parallel every mode": ("dfno-pruned", "drift"),
    "slab reduction two a host": (2, 2),
    "slab reduction flat": None,
    "slab methods two a host": ("drift", "dfno-pruned"),
    "methods train": ("drift", "dfno-pruned"),
    "two_level fitted 2x2": ((2, 2), ("drift", "dfno-pruned")),
    "two_level fitted 4x1": (None, ("drift", "dfno-pruned")),
    "best reduction latency": (2, 2, 2, 2, 2),
    "best reduction bytes": (32,),
    "best reduction one rank": (),
    "drift reduction bytes": (16, 2),
    "drift reduction latency": (2, 2, 2, 2, 2),
    "projection 4": ((4, 1, 1, 1), (2, 2), "drift"),
    "projection 8": ((8, 1, 1, 1), (2, 2, 2), "drift"),
    "projection 16": ((16, 1, 1, 1), (2, 2, 2, 2), "drift"),
    "projection 32": ((16, 2, 1, 1), (2, 2, 2, 2, 2), "drift"),
    "projection 64": ((16, 4, 1, 1), (2, 2, 2, 2, 2, 2), "drift"),
    "projection 128": ((16, 8, 1, 1), (2, 2, 2, 2, 2, 2, 2), "drift"),
    "projection 256": ((16, 16, 1, 1), (2, 2, 2, 2, 2, 2, 2, 2), "drift"),
    "projection 512": ((16, 16, 2, 1), (2, 2, 2, 2, 2, 2, 2, 2, 2), "drift"),
    "projection 1024": ((16, 16, 4, 1), (2, 2, 2, 2, 2, 2, 2, 2, 2, 2), "drift"),
}


def test_every_case_picks_what_bab9d58_picked():
    assert CASES.keys() == EXPECTED.keys()
    picked = {name: case() for name, case in CASES.items()}
    assert {k: v for k, v in picked.items() if v != EXPECTED[k]} == {}


@pytest.mark.parametrize(
    ("old", "names"),
    [
        ("drift.nn.auto", ("Machine", "Hosts", "choose_method", "choose_reduction", "method_costs", "COSTS")),
        ("drift.bench.comm", ("Fit", "terms", "best_reduction", "drift_reduction", "non_negative_lstsq")),
    ],
)
def test_old_paths_give_the_moved_names_with_a_warning(old, names):
    module = importlib.import_module(old)
    cost = importlib.import_module("drift.cost")
    for name in names:
        with pytest.warns(DeprecationWarning, match=rf"{old}\.{name} moved to drift\.cost\.{name}"):
            assert getattr(module, name) is getattr(cost, name)
    with pytest.raises(AttributeError, match="has no attribute 'nothing'"):
        module.nothing  # noqa: B018
