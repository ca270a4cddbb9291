"""Deprecated: ``method="auto"``'s cost model moved to ``drift.cost``, with the rest of drift's cost model.

Its names are still importable from here (each access warns, DeprecationWarning): import them from
``drift.cost``.
"""

from drift._moved import moved_names

__getattr__ = moved_names(
    __name__,
    {
        "drift.cost": (
            "COSTS",
            "Hosts",
            "Machine",
            "MethodChoice",
            "MethodCost",
            "Problem",
            "choose_method",
            "choose_reduction",
            "drift_cost",
            "factorisations",
            "method_costs",
            "pruned_dfno_cost",
            "reduction_levels",
        ),
        "drift.modes": ("ModeSpec",),
    },
)
