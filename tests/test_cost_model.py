"""drift.cost's collective model on one and several hosts, reduction levels, and the reduction choice."""

from __future__ import annotations

import math

import pytest

from drift.cost import Hosts, Machine, choose_reduction, method_costs, reduction_levels

ALPHA, BETA = 1e-4, 1e-9  # within a host
LINK = Hosts(2, 1e-3, 8e-9)  # 2 ranks a host; a slower link between hosts
ONE_HOST = Machine(1e10, 1e10, ALPHA, BETA)
TWO_LEVEL = Machine(1e10, 1e10, ALPHA, BETA, LINK)


def test_collectives_within_a_host_are_rings():
    n = 4e6
    for kind in ("reduce_scatter", "all_gather", "all_to_all"):
        assert ONE_HOST.collective_s(kind, 4, n) == pytest.approx(3 * ALPHA + 3 / 4 * n * BETA)
        assert TWO_LEVEL.collective_s(kind, 2, n, stride=1) == pytest.approx(ALPHA + n / 2 * BETA)
        assert TWO_LEVEL.collective_s(kind, 1, n) == 0.0
    with pytest.raises(ValueError, match="no model for collective 'broadcast'"):
        ONE_HOST.collective_s("broadcast", 2, n)


def test_collectives_across_hosts_count_what_leaves_a_host():
    n = 4e6
    # 4 ranks on 2 hosts: a ring sends 3/4 n out of each host, an all-to-all q (P - q) / P n = n.
    assert TWO_LEVEL.collective_s("all_gather", 4, n) == pytest.approx(
        3 * LINK.alpha_s + 3 / 4 * n * LINK.beta_s_per_byte
    )
    assert TWO_LEVEL.collective_s("all_to_all", 4, n) == pytest.approx(3 * LINK.alpha_s + n * LINK.beta_s_per_byte)
    pairwise = Machine(1e10, 1e10, ALPHA, BETA, LINK, pairwise_reduce_scatter=True)
    assert pairwise.collective_s("reduce_scatter", 4, n) == pytest.approx(TWO_LEVEL.collective_s("all_to_all", 4, n))
    assert TWO_LEVEL.collective_s("reduce_scatter", 4, n) == pytest.approx(TWO_LEVEL.collective_s("all_gather", 4, n))
    # The across level of a (2, 2) reduction: groups of 2 ranks 2 apart, one rank a host; both groups of
    # the dim share each host's link: 2 x n / 2 out of each host.
    across = LINK.alpha_s + 2 * n / 2 * LINK.beta_s_per_byte
    for kind in ("reduce_scatter", "all_gather", "all_to_all"):
        assert TWO_LEVEL.collective_s(kind, 2, n, stride=2) == pytest.approx(across)


def test_reduction_levels():
    assert reduction_levels((4, 1, 1)) == [[(4, 1)]]
    assert reduction_levels((4, 1, 1), (2, 2)) == [[(2, 2), (2, 1)]]
    assert reduction_levels((4, 2, 1), (2, 2, 2)) == [[(2, 4), (2, 2)], [(2, 1)]]
    assert reduction_levels((1, 1)) == []
    with pytest.raises(ValueError, match="does not split the spatial mesh dims"):
        reduction_levels((4, 1), (3, 2))


def test_reduction_choice_takes_the_hosts():
    spectrum = 16 * 16 * 16 * 16 * 8
    channels = dict(in_channels=20, out_channels=20)
    # One alpha, one beta: every shape sends the same bytes, so the fewest latency steps win.
    assert choose_reduction((4, 1), spectrum, **channels, machine=ONE_HOST) == (2, 2)
    assert choose_reduction((4, 1), spectrum, **channels, machine=Machine(1, 1, 0.0, BETA)) is None
    # Two hosts: within each host first, then across, halves what leaves a host for the reduce-scatter.
    assert choose_reduction((4, 1), spectrum, **channels, machine=TWO_LEVEL) == (2, 2)
    flat = method_costs((64, 64, 32, 30), (8, 8, 8, 16), (4, 1, 1, 1), **channels, machine=TWO_LEVEL)
    tree = method_costs((64, 64, 32, 30), (8, 8, 8, 16), (4, 1, 1, 1), **channels, machine=TWO_LEVEL, reduction=(2, 2))
    flat, tree = ({c.method: c for c in costs} for costs in (flat, tree))
    assert tree["drift"].bytes_sent == pytest.approx(flat["drift"].bytes_sent)  # the same bytes from each rank
    assert tree["drift"].comm_s < flat["drift"].comm_s
    assert tree["dfno-pruned"] == flat["dfno-pruned"]
    m = 16 * 16 * 16 * 16 * 8 * 20
    rs = LINK.alpha_s + 2 * m / 4 * LINK.beta_s_per_byte + ALPHA + m / 2 * BETA
    assert tree["drift"].comm_s == pytest.approx(2 * rs)  # the all-gather mirrors the reduce-scatter
    assert math.isclose(flat["drift"].comm_s, 2 * (3 * LINK.alpha_s + 3 / 4 * m * LINK.beta_s_per_byte))


def test_each_level_passes_over_its_buffer():
    spectrum = 16 * 16 * 16 * 16 * 8
    channels = dict(in_channels=20, out_channels=20)
    m = spectrum * 20
    copy = 4e-10
    # One rank a host: both levels of (2, 2) cross the link with the bytes of the flat reduction, so only
    # its latency steps favour it; the pass each level makes over its buffer costs more than they save.
    one_a_host = Hosts(1, 1e-4, 8e-9)
    without = Machine(1e10, 1e10, ALPHA, BETA, one_a_host, True)
    with_copies = Machine(1e10, 1e10, ALPHA, BETA, one_a_host, True, copy_s_per_byte=copy)
    assert choose_reduction((4, 1), spectrum, **channels, machine=without) == (2, 2)
    assert choose_reduction((4, 1), spectrum, **channels, machine=with_copies) is None
    flat = method_costs((64, 64, 32, 30), (8, 8, 8, 16), (4, 1, 1, 1), **channels, machine=with_copies)
    tree = method_costs(
        (64, 64, 32, 30), (8, 8, 8, 16), (4, 1, 1, 1), **channels, machine=with_copies, reduction=(2, 2)
    )
    flat, tree = ({c.method: c for c in costs} for costs in (flat, tree))
    plain = {
        c.method: c for c in method_costs((64, 64, 32, 30), (8, 8, 8, 16), (4, 1, 1, 1), **channels, machine=without)
    }
    # A flat level passes over the whole spectrum each way; the tree's levels over it and over its half.
    assert flat["drift"].comm_s - plain["drift"].comm_s == pytest.approx(2 * m * copy)
    assert tree["drift"].comm_s - flat["drift"].comm_s == pytest.approx(
        2 * (m + m / 2) * copy - 2 * m * copy - 2 * one_a_host.alpha_s
    )
    # Two ranks a host: the reduction within each host first halves the bytes on the link, which outweighs
    # its second pass.
    two_a_host = Machine(1e10, 1e10, ALPHA, BETA, LINK, True, copy_s_per_byte=copy)
    assert choose_reduction((4, 1), spectrum, **channels, machine=two_a_host) == (2, 2)


def test_measure_takes_this_machines_rates_and_the_given_collective_terms():
    machine = Machine.measure("cpu", alpha_s=ALPHA, beta_s_per_byte=BETA, hosts=LINK)
    for rate in (machine.matmul_flops_per_s, machine.fft_flops_per_s, 1 / machine.copy_s_per_byte):
        assert math.isfinite(rate) and rate > 0
    assert (machine.alpha_s, machine.beta_s_per_byte, machine.hosts) == (ALPHA, BETA, LINK)
    assert machine.pairwise_reduce_scatter  # drift's CPU reduce-scatter is an all-to-all and a sum
