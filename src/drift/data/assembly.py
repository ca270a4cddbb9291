"""How a trajectory's frames become the FNO's input and its output becomes frames: defined with the recipes
(``drift.recipes``), which ``drift.data`` imports, and named here as at 0.2.0."""

from drift.recipes import model_input, model_target

__all__ = ["model_input", "model_target"]
