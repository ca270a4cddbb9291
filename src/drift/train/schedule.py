"""The learning rate over a run's optimizer steps (``--schedule``): a function of the step, set before
each step."""

from __future__ import annotations

import math

import torch

from drift.train.config import TrainConfig


def learning_rate(config: TrainConfig, step: int, total: int) -> float:
    """The learning rate of optimizer step ``step`` (from 0) of a run of ``total`` steps: ``--lr``, or
    with ``--schedule cosine`` ``lr (1 + cos(pi step / total)) / 2`` (torch's ``CosineAnnealingLR`` with
    ``T_max = total``, stepped per batch)."""
    if config.schedule == "constant":
        return config.lr
    return config.lr * (1 + math.cos(math.pi * step / total)) / 2


def set_learning_rate(optimizer: torch.optim.Optimizer, config: TrainConfig, step: int, total: int) -> None:
    """Set ``optimizer``'s rate for step ``step`` of ``total`` (``learning_rate``)."""
    # A function of the step, not a scheduler's state: a resumed run needs none saved.
    for group in optimizer.param_groups:
        group["lr"] = learning_rate(config, step, total)
