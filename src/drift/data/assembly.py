"""How a trajectory's frames become the FNO's input and its output becomes frames: the one convention that
training, evaluation, ``drift predict`` and an exported model share."""

from __future__ import annotations

import torch


def model_input(x: torch.Tensor, t_out: int) -> torch.Tensor:
    """``(batch, fields, t_in, *block)`` input frames -> the FNO's ``(batch, fields * t_in + 1, *block, t_out)``:
    every input frame repeated along a new last dim of ``t_out`` steps, then one channel holding each step's
    time ``(j + 1) / t_out``."""
    b, f, t_in, *block = x.shape
    frames = x.reshape(b, f * t_in, *block, 1).expand(-1, -1, *block, t_out)
    t = torch.arange(1, t_out + 1, dtype=x.dtype, device=x.device) / t_out
    return torch.cat([frames, t.expand(b, 1, *block, t_out)], dim=1)


def model_target(y: torch.Tensor) -> torch.Tensor:
    """``(batch, fields, t_out, *block)`` target frames -> the FNO's ``(batch, fields, *block, t_out)``."""
    return y.movedim(2, -1)
