"""The time of one collective over one link: a schedule's latency steps and bytes, and an alpha-beta link.

A collective on ``size`` ranks over an ``nbytes`` vector (the whole: the all-reduce's and reduce-scatter's
input, the all-gather's output, the all-to-all's input) takes L latency steps and sends W bytes from each
rank (``terms``: the ring schedules Gloo and NCCL use for large messages, and the pairwise all-to-all,
which has a ring's terms). A link makes seconds of them: ``alpha L + beta W`` (``Fit``), plus gamma per
step above a message-size threshold where a fit finds one. A ``drift.cost.Machine`` joins the ranks of
a host by such a link and adds the links between hosts.
"""

from __future__ import annotations

from dataclasses import dataclass

# Rounds of a ring of P ranks each collective makes, each (P - 1) steps sending (P - 1) / P of the vector
# from every rank: an all-reduce is a reduce-scatter and then an all-gather.
_RING_ROUNDS = {"all_reduce": 2.0, "reduce_scatter": 1.0, "all_gather": 1.0, "all_to_all": 1.0}


def terms(kind: str, size: int, nbytes: float) -> tuple[float, float]:
    """(latency steps L, bytes each rank sends W) of a ``kind`` collective on ``size`` ranks over an
    ``nbytes`` vector: t = alpha L + beta W (none on one rank). ValueError for a collective the model
    does not know."""
    if size == 1:
        return 0.0, 0.0
    if kind not in _RING_ROUNDS:
        raise ValueError(f"no model for collective {kind!r}")
    rounds = _RING_ROUNDS[kind]
    return rounds * (size - 1), rounds * ((size - 1) / size) * nbytes


@dataclass(frozen=True)
class Fit:
    """An alpha-beta link with a message-size threshold: ``t = alpha L + beta W + gamma L [n / P > S]``.

    alpha: seconds per latency step; beta: seconds per byte sent; gamma: extra seconds per step whose
    message (``n / P`` bytes, to one peer) exceeds ``threshold_bytes`` S, as in LogGPS's synchronisation
    threshold (on a loopback TCP, the time per step rises between 64 and 128 KiB messages).
    ``threshold_bytes=None``: the plain alpha-beta model. ``drift bench comm`` fits one per collective
    (``drift.cost.fit_alpha_beta``); a ``Machine``'s ranks of one host are joined by one.
    """

    alpha_s: float
    beta_s_per_byte: float
    gamma_s: float = 0.0
    threshold_bytes: int | None = None

    def predict(self, kind: str, size: int, nbytes: float) -> float:
        """Modelled seconds of one ``kind`` call on ``size`` ranks over an ``nbytes`` vector."""
        steps, wire = terms(kind, size, nbytes)
        seconds = self.alpha_s * steps + self.beta_s_per_byte * wire
        if self.threshold_bytes is not None and nbytes / size > self.threshold_bytes:
            seconds += self.gamma_s * steps
        return seconds
