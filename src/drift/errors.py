"""Exceptions raised by drift."""


class PlanError(ValueError):
    """An input does not match the plan it was given to (local shape, dtype or device).

    Raised before any collective starts, so a mismatch on one rank never leaves the others waiting
    longer than the process group's timeout.
    """
