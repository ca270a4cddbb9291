"""The memory a ``drift train`` step or a ``drift predict`` forward needs on a rank, checked against the
rank's budget before any rank starts: ``ConfigError`` naming the bytes needed and available rather than a
rank the kernel kills."""

from __future__ import annotations

import dataclasses
import math
import os
from collections.abc import Sequence

from drift.budget import RankBudget, rank_budget
from drift.cost import MemoryEstimate, MemoryShortError, Pass, fno_memory, refuse_if_short
from drift.jobs.launch import launched
from drift.recipes import AUTOREGRESSIVE
from drift.train.config import ConfigError, TrainConfig
from drift.train.problem import problem_modes, problem_recipe

BATCHES_HELD = 2  # the batch a step trains on and the one read ahead
# The training step's pass for each --recompute choice.
STEP_PASS = {None: Pass.STEP, "blocks": Pass.RECOMPUTE_STEP, "mlp": Pass.RECOMPUTE_MLP_STEP}


def step_memory(
    config: TrainConfig,
    grid: Sequence[int],
    inputs: int,
    fields: int,
    parts: Sequence[int],
    forward: bool = False,
    batch_size: int | None = None,
    activation_bytes: int | None = None,
) -> MemoryEstimate:
    """The peak bytes of a rank's training step (or with ``forward`` its prediction's forward, without
    autograd) for ``config`` (resolved: ``resolve_problem``) on data of spatial ``grid`` with ``inputs``
    input and ``fields`` output channels, the spatial dims split ``parts`` ways, ``batch_size`` samples
    (default ``--batch-size``) over the ``--data-parallel`` ranks, a forward's fields between blocks of
    ``activation_bytes`` (default: float32's): the model's (``drift.cost.fno_memory``:
    a training unroll keeps the graphs of its counted steps) and the batches' frames. ``--method auto``
    is estimated as the costlier family."""
    recipe = problem_recipe(config)
    in_channels, out_channels = recipe.channels(inputs, fields, config.t_in)
    shape = (*grid, config.t_out) if recipe.time_dim else tuple(grid)
    model_parts = (*parts, 1) if recipe.time_dim else tuple(parts)
    batch = math.ceil((batch_size or config.batch_size) / config.data_parallel)
    steps = 1
    if recipe.name == AUTOREGRESSIVE.name and not forward:
        steps = config.pushforward or config.t_out
    methods = ("drift", "dfno") if config.method == "auto" else (config.method,)
    estimates = [
        fno_memory(
            shape,
            model_parts,
            in_channels=in_channels,
            out_channels=out_channels,
            width=config.width,
            modes=problem_modes(config),
            n_layers=config.layers,
            batch=batch,
            method=method,
            pass_=Pass.FORWARD if forward else STEP_PASS[config.recompute],
            neuralop=config.model == "neuralop",
            steps=steps,
            padding=config.domain_padding or 0.0,
            activation_bytes=activation_bytes,
            device=config.device,
        )
        for method in methods
    ]
    estimate = max(estimates, key=lambda e: e.total)
    x_frames, y_frames = recipe.frame_counts(config.t_in, config.t_out)
    points = batch * math.prod(math.ceil(n / p) for n, p in zip(grid, parts, strict=True))
    frames = BATCHES_HELD * points * (inputs * x_frames + fields * y_frames) * 4
    return dataclasses.replace(estimate, fields=estimate.fields + frames)


def check_memory(
    config: TrainConfig,
    grid: Sequence[int],
    inputs: int,
    fields: int,
    parts: Sequence[int],
    world_size: int,
    forward: bool = False,
    batch_size: int | None = None,
    activation_bytes: int | None = None,
) -> RankBudget:
    """ConfigError unless ``step_memory`` (its arguments but ``world_size``) fits each rank's budget
    (``drift.budget.rank_budget`` for the ranks on this host: ``--memory-per-rank``, the GPU's or a share of
    the machine's); the budget otherwise."""
    local = int(os.environ.get("LOCAL_WORLD_SIZE", world_size)) if launched() else world_size
    budget = rank_budget(config.device, local, config.memory_per_rank)
    estimate = step_memory(config, grid, inputs, fields, parts, forward, batch_size, activation_bytes)
    ranks = f"{world_size} rank" + ("s" if world_size > 1 else "")
    what = f"{'the forward' if forward else 'a training step'} on {ranks}"
    try:
        refuse_if_short(estimate, budget.bytes, what, budget.source)
    except MemoryShortError as exc:
        raise ConfigError(str(exc)) from None
    return budget
