"""State dicts and checkpoints written before the FNO was a stack of FNOBlocks load into today's FNO.

tests/fixtures/pre_fnoblock was written by commit 9ebfdf8 (its make.py): a neuraloperator-style FNO
(lifting MLP, channel MLPs with soft-gating skips, group norms) after one Adam step, as a DCP checkpoint
with the optimizer's state, as a plain state dict, and its output on a fixed input.
"""

from pathlib import Path

import pytest
import torch
from reference import TOL, rel_err

from drift.checkpoint import load_checkpoint, load_newest
from drift.nn import FNO
from drift.nn.fno import current_name, former_name

pytestmark = pytest.mark.other_host

FIXTURE = Path(__file__).parent / "fixtures" / "pre_fnoblock"
OPTIONS = dict(in_channels=3, out_channels=2, width=6, modes=(2, 3), n_layers=2, norm="group_norm")


@pytest.fixture(scope="module")
def expected() -> dict:
    return torch.load(FIXTURE / "expected.pt", weights_only=True)


def _model() -> FNO:
    return FNO.neuralop_defaults(**OPTIONS, dtype=torch.float64)


def test_former_state_dict_loads(expected):
    """Every former key has a place (strict load), and the model computes what it computed then."""
    model = _model()
    model.load_state_dict(expected["state_dict"])
    with torch.no_grad():
        assert rel_err(model(expected["x"]), expected["y"]) <= TOL[torch.float64]
    assert {current_name(k) for k in expected["state_dict"]} == set(model.state_dict())
    assert all(k.startswith(("lift", "blocks.", "project_")) for k in model.state_dict())


def test_former_name_inverts_current_name(expected):
    for key in expected["state_dict"]:
        assert former_name(current_name(key)) == key
    assert former_name("blocks.1.mlp_norm.bias") == "norms.3.bias"
    assert current_name("norms.2.weight") == "blocks.1.norm.weight"
    assert current_name("pointwise.0.weight") == "blocks.0.skip.weight"


@pytest.mark.parametrize("newest", [False, True], ids=["load_checkpoint", "load_newest"])
def test_former_checkpoint_loads_with_its_optimizer(expected, newest):
    """The DCP checkpoint loads (model and Adam's state, by the former names) and resumes: the model's
    output and every parameter's first moment equal those the commit before had."""
    model = _model()
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    if newest:
        load_newest(FIXTURE / "run", model, optimizer)
    else:
        load_checkpoint(FIXTURE / "run" / "epoch-0001", model, optimizer)
    with torch.no_grad():
        assert rel_err(model(expected["x"]), expected["y"]) <= TOL[torch.float64]
    parameters = dict(model.named_parameters())
    for name, moment in expected["exp_avg"].items():  # read back from the checkpoint: its stored bits
        assert torch.equal(optimizer.state[parameters[current_name(name)]]["exp_avg"], moment), name
    assert len(optimizer.state) == len(expected["exp_avg"])


@pytest.mark.parametrize(("a", "b"), [("norms.1", "norms.2"), ("channel_mlp_skips.0", "channel_mlp_skips.1")])
def test_the_tolerance_still_catches_a_wrong_mapping(expected, a, b):
    """Round-off is all the tolerance admits: a state dict loaded as a wrong mapping of the former names
    would load it (block 0's MLP norm taken for block 1's norm, one block's skip for the other's: tensors of
    one shape that one Adam step made differ) misses the fixture's output by far more."""
    state = dict(expected["state_dict"])
    for suffix in ("weight", "bias") if a.startswith("norms") else ("weight",):
        state[f"{a}.{suffix}"], state[f"{b}.{suffix}"] = state[f"{b}.{suffix}"], state[f"{a}.{suffix}"]
    model = _model()
    model.load_state_dict(state)
    with torch.no_grad():
        assert rel_err(model(expected["x"]), expected["y"]) > 1e6 * TOL[torch.float64]
