"""The problem a run's data pose (``resolve_problem``): the recipe the data and ``--recipe`` choose, the
model's modes for the data's dims, and the options that only some problems take, checked against the
data before any rank starts (``ConfigError`` naming the option and what the data hold)."""

from __future__ import annotations

import dataclasses

from drift.data.files import DataFiles
from drift.nn import AUTO
from drift.recipes import AUTOREGRESSIVE, ONE_SHOT, STATIC, Recipe, recipe_named
from drift.train.config import ConfigError, TrainConfig

# The default problem's modes (3-D data, one-shot: x, y, z, t), as drift train always trained it.
DEFAULT_3D_MODES = (3, 3, 3, 4)
SPATIAL_MODES, TIME_MODES = 12, 4  # the most modes a dim gets by default elsewhere (PDEBench's FNO: 12)
# The options of time-dependent data, refused when a static problem is given other values than their defaults.
FRAME_OPTIONS = [f for f in dataclasses.fields(TrainConfig) if f.name in ("t_in", "t_out")]
WALL_PADDING = 0.125  # default padding along a non-periodic dim (neuraloperator's examples pad 0.125-0.25)


def run_recipe(config: TrainConfig, files: DataFiles) -> Recipe:
    """The recipe of ``config`` on ``files``: ``--recipe``, or for ``auto`` static for static data and
    one-shot otherwise; ConfigError when it does not fit the data."""
    if config.recipe == AUTO:
        return STATIC if files.static else ONE_SHOT
    recipe = recipe_named(config.recipe, config.target)
    if files.static and recipe is not STATIC:
        raise ConfigError(
            f"--recipe {recipe}: {files.describe()} is a static problem (inputs {', '.join(files.inputs)} to "
            f"{', '.join(files.fields)}, no frames): use --recipe static"
        )
    if not files.static and recipe is STATIC:
        raise ConfigError(
            f"--recipe static: {files.describe()} holds trajectories of {files.frames} frames; use one-shot or "
            "autoregressive"
        )
    return recipe


def problem_recipe(config: TrainConfig) -> Recipe:
    """``config``'s recipe: as ``resolve_problem`` resolved it, else the default problem's (one-shot)."""
    return ONE_SHOT if config.recipe == AUTO else recipe_named(config.recipe, config.target)


def problem_modes(config: TrainConfig) -> tuple[int, ...]:
    """``config``'s modes, one per model dim: as ``resolve_problem`` resolved them, else for the default
    problem (3-D data, one-shot)."""
    modes = tuple(config.modes or DEFAULT_3D_MODES)
    # Resolved (a recipe chosen), the counts are one per model dim; else one count is for every dim.
    return modes * ONE_SHOT.model_dims(3) if config.recipe == AUTO and len(modes) == 1 else modes


def default_modes(recipe: Recipe, grid: tuple[int, ...], t_out: int) -> tuple[int, ...]:
    """The modes a model gets without ``--modes``: the default problem's for 3-D one-shot data, else
    ``min(12, n // 2)`` per spatial dim (at least 1) and ``min(4, t_out // 2 + 1)`` for time."""
    if recipe is ONE_SHOT and len(grid) == 3:
        return DEFAULT_3D_MODES
    spatial = tuple(max(1, min(SPATIAL_MODES, n // 2)) for n in grid)
    return spatial + ((min(TIME_MODES, t_out // 2 + 1),) if recipe.time_dim else ())


def resolve_problem(config: TrainConfig, files: DataFiles | None = None) -> TrainConfig:
    """``config`` for its data (``files``, default: ``config.data``'s): ``--recipe`` resolved, ``--modes``
    one per model dim (the default's, or one count for all dims), ``--domain-padding`` along non-periodic
    dims by default; ConfigError naming the option when
    ``--recipe``, ``--modes``, ``--grid`` or an autoregressive option does not fit the data. Idempotent;
    reads the files' layout only."""
    files = files if files is not None else DataFiles(config.data)
    recipe = run_recipe(config, files)
    if recipe.name != AUTOREGRESSIVE.name:
        given = [
            f"--{name}"
            for name, unset in (("pushforward", None), ("noise", 0.0), ("target", "state"))
            if getattr(config, name) != unset
        ]
        if given:
            raise ConfigError(f"{given[0]} applies to --recipe autoregressive, not {recipe}")
    if recipe is STATIC:
        given = [f"--{f.name.replace('_', '-')}" for f in FRAME_OPTIONS if getattr(config, f.name) != f.default]
        if given:
            raise ConfigError(f"{given[0]} applies to time-dependent data; {files.describe()} is a static problem")
    if config.grid is not None and len(config.grid) != len(files.grid):
        raise ConfigError(
            f"--grid {'x'.join(map(str, config.grid))}: {len(config.grid)} dims, the data have {len(files.grid)} "
            f"spatial dims ({files.describe()})"
        )
    if config.pushforward is not None and config.pushforward > config.t_out:
        raise ConfigError(f"--pushforward {config.pushforward} exceeds the {config.t_out} unrolled steps of --t-out")
    dims = recipe.model_dims(len(files.grid))
    modes = config.modes or default_modes(recipe, files.grid, config.t_out)
    if len(modes) == 1:
        modes = modes * dims
    if len(modes) != dims:
        what = "spatial dims" + (" and time" if recipe.time_dim else "")
        raise ConfigError(
            f"--modes {','.join(map(str, modes))}: the {recipe} model of {len(files.grid)}-D data has {dims} dims "
            f"({what}): give one count or {dims}"
        )
    padding = config.domain_padding
    if padding is None and not all(files.periodic):
        padding = tuple(0.0 if periodic else WALL_PADDING for periodic in files.periodic) + (0.0,) * recipe.time_dim
    if padding is not None:
        padding = padding * dims if len(padding) == 1 else padding
        if len(padding) != dims:
            raise ConfigError(
                f"--domain-padding {','.join(map(str, padding))}: the {recipe} model has {dims} dims: give one "
                f"fraction or {dims}"
            )
    return dataclasses.replace(config, recipe=recipe.name, modes=tuple(modes), domain_padding=padding)
