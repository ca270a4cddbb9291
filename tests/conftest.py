import pytest
from harness import Ranks


@pytest.fixture(scope="session")
def ranks():
    """Live process groups of 1..4 ranks, shared by every test of the session."""
    pools = Ranks()
    yield pools
    pools.close()
