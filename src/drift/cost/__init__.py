"""drift's cost model: the seconds a spectral convolution's kernels and collectives take on a machine.

One model serves every choice drift makes by it and every projection it reports: ``method="auto"``
(``choose_method``), ``parallelize(reduction="auto")`` (``choose_reduction``), ``drift bench comm``'s fit
and projection (``Fit``, ``fit_alpha_beta``, ``drift_reduction``) and ``benchmarks/two_level.py`` (a
``Machine`` with ``Hosts``, fitted). Its modules, one idea each:

- ``drift.cost.collectives``: a collective's latency steps and bytes (``terms``) on a link (``Fit``);
- ``drift.cost.machine``: the machine (``Machine``: kernel rates, a host's link, ``Hosts`` and the links
  between them) and its presets, the DRIFT paper's platform (``PAPER``) among them;
- ``drift.cost.fit``: a link's coefficients from measured times;
- ``drift.cost.reduction``: drift's reduce-scatter and all-gather over a reduction mesh, and the mesh;
- ``drift.cost.methods``: each method's cost, and the cheapest (``method="auto"``);
- ``drift.cost.memory``: the bytes an FNO's forward or training step needs a rank, and the refusal.
"""

from drift.cost.collectives import Fit, terms
from drift.cost.fit import fit_alpha_beta, non_negative_lstsq
from drift.cost.machine import PAPER, Hosts, Machine
from drift.cost.memory import MemoryEstimate, MemoryShortError, Pass, fno_memory, refuse_if_short
from drift.cost.methods import (
    COSTS,
    MethodChoice,
    MethodCost,
    Problem,
    choose_method,
    drift_cost,
    method_costs,
    pruned_dfno_cost,
)
from drift.cost.reduction import (
    best_reduction,
    choose_reduction,
    drift_reduction,
    factorisations,
    reduction_levels,
    reduction_seconds,
)

__all__ = [
    "COSTS",
    "PAPER",
    "Fit",
    "Hosts",
    "Machine",
    "MemoryEstimate",
    "MemoryShortError",
    "MethodChoice",
    "MethodCost",
    "Pass",
    "Problem",
    "best_reduction",
    "choose_method",
    "choose_reduction",
    "drift_cost",
    "drift_reduction",
    "factorisations",
    "fit_alpha_beta",
    "fno_memory",
    "method_costs",
    "non_negative_lstsq",
    "pruned_dfno_cost",
    "reduction_levels",
    "reduction_seconds",
    "refuse_if_short",
    "terms",
]
