"""Factorized spectral weights (neuraloperator's TFNO and CP-FNO): Tucker or CP factors of the dense
weight ``(in, out, K1, ..., Kd)``, of which a rank rebuilds only the block it uses.

The factors follow tensorly-torch's ``TuckerTensor`` / ``CPTensor`` as neuraloperator 2.0 builds them:

- Tucker of rank ``(r_0, ..., r_{d+1})``: ``core`` ``(r_0, ..., r_{d+1})`` and ``factors[j]`` ``(n_j, r_j)``;
  ``W[i_0, ..., i_{d+1}] = sum_r core[r] prod_j factors[j][i_j, r_j]`` (tensorly's ``tucker_to_tensor``).
- CP of rank R: ``weights`` ``(R,)`` and ``factors[j]`` ``(n_j, R)``;
  ``W[i] = sum_r weights[r] prod_j factors[j][i_j, r]`` (tensorly's ``cp_to_tensor``).

``rank`` means what tensorly's ``validate_tucker_rank`` / ``validate_cp_rank`` make of it: a float is
the fraction of the dense parameter count the factors may hold (``tucker_rank`` / ``cp_rank``), an int
a rank (Tucker: on every dim), a tuple the Tucker rank per dim. Every factor is complex, drawn as
tensorly-torch's ``normal_(0, std)`` with neuraloperator's ``std = sqrt(2 / (in + out))`` so the
rebuilt weight has entries of that standard deviation.

Once parallelized, the factors are replicated on every rank (``mesh`` set): ``block`` passes them
through ``comm.replicate``, whose backward sums their gradients over the mesh, and each rank rebuilds
only the rows of the modes it holds.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
from torch import nn

from drift import comm
from drift._plan import ComplexModule, complex_dtype
from drift.nn.replicated import first_rank_value

FACTORIZATIONS = ("tucker", "cp")

Index = slice | torch.Tensor | None  # per dim: all entries (None), a range, or 1-D positions


def _check_rank_value(rank) -> None:
    if isinstance(rank, bool) or not isinstance(rank, int | float | Sequence):
        raise ValueError(f"rank must be a float (fraction of the dense parameters), an int or a tuple, got {rank!r}")


def tucker_rank(shape: Sequence[int], rank: float | int | Sequence[int]) -> tuple[int, ...]:
    """The Tucker rank tensorly's ``validate_tucker_rank(shape, rank)`` gives: for a float, ranks
    ``max(round(c n_j), 1)`` with c solving ``c^D prod(n) + c sum(n_j^2) = rank prod(n)`` (the core and
    the factors then hold that fraction of the dense parameters); an int on every dim; a tuple as is."""
    _check_rank_value(rank)
    shape = tuple(shape)
    if isinstance(rank, float):
        if not rank > 0:
            raise ValueError(f"rank = {rank} must be positive (a fraction of the dense parameter count)")
        dense, squares, order = math.prod(shape), sum(n * n for n in shape), len(shape)

        def excess(c: float) -> float:  # increasing in c >= 0
            return dense * c**order + squares * c - rank * dense

        low, high = 0.0, max(rank, 1.0)
        for _ in range(200):  # bisection to the last bit (tensorly uses scipy's brentq, not a drift dependency)
            middle = (low + high) / 2
            if middle in (low, high):
                break
            low, high = (middle, high) if excess(middle) < 0 else (low, middle)
        return tuple(max(round(n * (low + high) / 2), 1) for n in shape)
    ranks = (rank,) * len(shape) if isinstance(rank, int) else tuple(rank)
    if len(ranks) != len(shape) or any(isinstance(r, bool) or not isinstance(r, int) or r < 1 for r in ranks):
        raise ValueError(
            f"rank {rank!r}: a Tucker rank needs one positive int per dim of the weight {shape} (or one int for all)"
        )
    return ranks


def cp_rank(shape: Sequence[int], rank: float | int) -> int:
    """The CP rank tensorly's ``validate_cp_rank(shape, rank)`` gives: ``round(rank prod(n) / sum(n))`` for
    a float (the factors then hold that fraction of the dense parameters), an int as is; ValueError when
    it is below 1."""
    _check_rank_value(rank)
    shape = tuple(shape)
    if isinstance(rank, float):
        value = round(math.prod(shape) * rank / sum(shape))
        if value < 1:
            raise ValueError(
                f"rank = {rank} rounds to a CP rank of {value} for the weight {shape} ({math.prod(shape)} entries, "
                f"{sum(shape)} per rank-1 term): use a rank above {sum(shape) / 2 / math.prod(shape):.3g}"
            )
        return value
    if not isinstance(rank, int) or rank < 1:
        raise ValueError(f"rank {rank!r}: a CP rank is one positive int (or a float fraction)")
    return rank


def _select(factor: torch.Tensor, index: Index) -> torch.Tensor:
    if index is None:
        return factor
    if isinstance(index, slice):
        return factor[index]
    return factor.index_select(0, index.to(factor.device))


def tucker_to_tensor(core: torch.Tensor, factors: Sequence[torch.Tensor]) -> torch.Tensor:
    """``core`` multiplied by ``factors[j]`` ``(n_j, r_j)`` on every dim j: ``(n_0, ..., n_{D-1})``."""
    order = core.dim()
    # The factors that shrink a dim first, then those that grow it least: each step's product is small.
    sequence = sorted(range(order), key=lambda j: factors[j].shape[0] / max(factors[j].shape[1], 1))
    operands: list = [core, list(range(order))]
    for j in sequence:
        operands += [factors[j], [order + j, j]]
    return torch.einsum(*operands, list(range(order, 2 * order)))


def cp_to_tensor(weights: torch.Tensor, factors: Sequence[torch.Tensor]) -> torch.Tensor:
    """``sum_r weights[r] prod_j factors[j][i_j, r]``: ``(n_0, ..., n_{D-1})``, as one matrix product of
    the Khatri-Rao products of the leading and trailing factors (split where the two are smallest)."""
    sizes = [f.shape[0] for f in factors]
    split = min(range(1, len(factors)), key=lambda m: math.prod(sizes[:m]) + math.prod(sizes[m:]), default=1)

    def khatri_rao(group: Sequence[torch.Tensor]) -> torch.Tensor:
        out = group[0]
        for f in group[1:]:
            out = torch.einsum("ar,br->abr", out, f).reshape(-1, f.shape[1])
        return out

    left = khatri_rao(factors[:split]) * weights
    if split == len(factors):
        return left.sum(1).reshape(sizes)
    return torch.einsum("ar,br->ab", left, khatri_rao(factors[split:])).reshape(sizes)


class FactorizedWeight(ComplexModule):
    """A spectral weight of shape ``(in, out, K1, ..., Kd)`` held as Tucker or CP factors.

    Args:
        shape: the dense weight's shape.
        factorization: "tucker" or "cp".
        rank: see the module docstring (``tucker_rank`` / ``cp_rank``).
        dtype, device: the factors' real precision (complex factors of it) and device.

    Parameters: Tucker ``core`` and ``factors``; CP ``weights`` and ``factors`` (an ``nn.ParameterList``,
    one per dim of ``shape``). Drawn on the CPU from torch's default generator (core or weights first).
    ``dtype``, ``device`` and ``shape`` describe the dense weight it stands for.
    """

    def __init__(
        self,
        shape: Sequence[int],
        factorization: str,
        rank: float | int | Sequence[int],
        *,
        dtype: torch.dtype | None = None,
        device: torch.device | str | None = None,
    ) -> None:
        super().__init__()
        if factorization not in FACTORIZATIONS:
            raise ValueError(f"factorization must be None or one of {FACTORIZATIONS}, got {factorization!r}")
        self.shape = torch.Size(shape)
        self.factorization = factorization
        cdtype = complex_dtype(dtype or torch.get_default_dtype())
        std = math.sqrt(2 / (self.shape[0] + self.shape[1]))  # neuraloperator's init_std="auto"
        order = len(self.shape)
        if factorization == "tucker":
            self.rank = tucker_rank(self.shape, rank)
            scale = (std / math.prod(math.sqrt(r) for r in self.rank)) ** (1 / (order + 1))
            self.core = nn.Parameter((torch.randn(self.rank, dtype=cdtype) * scale).to(device))
            columns = self.rank
        else:
            self.rank = cp_rank(self.shape, rank)
            scale = (std / math.sqrt(self.rank)) ** (1 / order)
            self.weights = nn.Parameter(torch.ones(self.rank, dtype=cdtype, device=device))
            columns = (self.rank,) * order
        self.factors = nn.ParameterList(
            nn.Parameter((torch.randn(n, r, dtype=cdtype) * scale).to(device))
            for n, r in zip(self.shape, columns, strict=True)
        )
        self.mesh = None

    def extra_repr(self) -> str:
        return f"{tuple(self.shape)}, {self.factorization!r}, rank={self.rank}"

    @property
    def dtype(self) -> torch.dtype:
        return self.factors[0].dtype

    @property
    def device(self) -> torch.device:
        return self.factors[0].device

    @torch.no_grad()
    def distribute_(self, mesh) -> None:
        """Replicate the factors over ``mesh``, in place (each takes the mesh's first rank's value on every
        rank), their gradients summed over it from then on (``block``)."""
        self.mesh = mesh
        for param in self.parameters():
            param.copy_(first_rank_value(mesh, param.detach()))

    def block(self, index: Sequence[Index] = ()) -> torch.Tensor:
        """The dense weight at ``index`` (per dim of ``shape``: None for all entries, a slice, or 1-D
        positions; missing trailing dims are whole), rebuilt from those rows of the factors only. Once
        parallelized, the gradients of the factors are summed over the mesh."""
        index = (*index, *(None,) * (len(self.shape) - len(index)))
        lead = self.core if self.factorization == "tucker" else self.weights
        tensors = [lead, *self.factors]
        axes = [] if self.mesh is None else [a for a in range(self.mesh.ndim) if self.mesh.size(a) > 1]
        if axes:
            # One flat tensor: one gradient all-reduce per mesh dim for all the factors.
            flat = torch.cat([t.reshape(-1) for t in tensors])
            for axis in axes:
                flat = comm.replicate(flat, group=self.mesh.get_group(axis))
            parts = flat.split([t.numel() for t in tensors])
            tensors = [part.view(t.shape) for part, t in zip(parts, tensors, strict=True)]
        lead, *factors = tensors
        factors = [_select(f, i) for f, i in zip(factors, index, strict=True)]
        if self.factorization == "tucker":
            return tucker_to_tensor(lead, factors)
        return cp_to_tensor(lead, factors)
