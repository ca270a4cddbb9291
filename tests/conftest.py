import ctypes
import gc

import pytest
from harness import Ranks

from drift.memory import empty_cache


@pytest.fixture(scope="session")
def ranks():
    """Live process groups of 1..4 ranks, shared by every test of the session."""
    pools = Ranks()
    yield pools
    pools.close()


@pytest.fixture
def memory_released():
    """After the test: its memory released (tests holding fields of hundreds of MB use it), so that ranks
    forked later in the session (``drift bench capacity``'s, whose private memory is capped) do not inherit
    this process's high-water mark."""
    yield
    gc.collect()
    empty_cache()
    ctypes.CDLL(None).malloc_trim(0)  # glibc keeps freed heap below its mmap threshold (32 MiB) otherwise
