"""The model and optimizer of a run: the FNO drawn from the run's seed and parallelized over its mesh, and
Adam(W) with drift's fused step."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from drift import optim
from drift._moved import moved_names
from drift.data import FIELDS
from drift.jobs.launch import GROUP_TIMEOUT_S
from drift.layout import reduction_mesh
from drift.nn import FNO, NEURALOP_DEFAULTS, parallelize, resolve_methods, set_recompute
from drift.train.checks import reduction_shape
from drift.train.config import TrainConfig
from drift.train.problem import problem_modes, problem_recipe
from drift.train.sharding import Sharding


def fno_options(config: TrainConfig, inputs: Sequence[str] = FIELDS, fields: Sequence[str] = FIELDS) -> dict:
    """The ``drift.nn.FNO`` arguments of ``config``'s model but its ``method``, ``dtype`` and ``device``:
    the channels its recipe makes of the data's ``inputs`` and ``fields`` (``Recipe.channels``), ``--width``,
    ``--modes``, ``--layers``, ``--factorization``, ``--rank``, and for ``--model neuralop``
    neuraloperator's defaults (``NEURALOP_DEFAULTS``). ``config`` as ``resolve_problem`` made it; one not
    resolved for data is the default problem's (3-D fields, one-shot). Plain values:
    ``FNO(**fno_options(config))`` builds it."""
    recipe = problem_recipe(config)
    in_channels, out_channels = recipe.channels(len(inputs), len(fields), config.t_in)
    options = dict(
        in_channels=in_channels,
        out_channels=out_channels,
        width=config.width,
        modes=problem_modes(config),
        n_layers=config.layers,
        factorization=config.factorization,
        rank=config.rank,
    )
    if config.domain_padding is not None:
        options["domain_padding"] = config.domain_padding
    return options | (dict(NEURALOP_DEFAULTS) if config.model == "neuralop" else {})


def build_model(
    config: TrainConfig,
    device,
    sharding: Sharding | None = None,
    global_shape: Sequence[int] | None = None,
    channels: tuple[Sequence[str], Sequence[str]] = (FIELDS, FIELDS),
) -> FNO:
    """The FNO for ``config`` and the data's ``channels`` (inputs, fields: ``fno_options``), its parameters
    drawn from ``torch.manual_seed(config.seed)`` (without touching the caller's random state),
    parallelized over ``sharding``'s mesh when it has one, its blocks (or their channel MLPs' hidden layers)
    recomputed in the backward pass with ``--recompute blocks`` (``mlp``). ``global_shape``: the model's input extents
    (the spatial ones, then ``t_out`` for a one-shot model), which ``--method auto`` chooses by."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(config.seed)
        model = FNO(**fno_options(config, *channels), method=config.method, device=device)
    set_recompute(model, config.recompute)
    if sharding is not None and sharding.mesh is not None:
        reduction = reduction_shape(config, sharding.mesh.size())
        if reduction is not None:
            spatial = [a for a, p in enumerate(sharding.placements) if p.dim >= 2]
            reduction = reduction_mesh(sharding.mesh, spatial, reduction, timeout_s=GROUP_TIMEOUT_S)
        options = dict(reduction=reduction, overlap=config.overlap, global_shape=global_shape)
        parallelize(model, sharding.mesh, sharding.placements, **options)
    elif global_shape is not None:
        resolve_methods(model, global_shape)  # on one device, before the first batch, so the run can say what it chose
    return model


def make_optimizer(config: TrainConfig, model: FNO) -> torch.optim.Optimizer:
    """Adam at ``--lr``, or AdamW (decoupled weight decay, as neuraloperator's trainer) when
    ``--weight-decay`` is above 0: torch's, stepped by its fused kernel on the complex spectral weights
    too (``drift.optim``)."""
    if config.weight_decay > 0:
        return optim.AdamW(model.parameters(), lr=config.lr, weight_decay=config.weight_decay)
    return optim.Adam(model.parameters(), lr=config.lr)


__getattr__ = moved_names(__name__, {"drift.nn": ("AUTO",)})  # imported here at bab9d58
