"""Shared fixtures: an in-process service (dispatcher + 2 workers on loopback).

Run: PYTHONPATH=/work/main/python /usr/bin/python3 -m pytest -q python/tests
"""

import faulthandler
import sys

import pytest

import sluice

sluice.set_log_level("error")
# A hang (for example a next() that kept the GIL) dumps every thread's
# stack instead of stalling the run silently.
faulthandler.enable(file=sys.stderr)


@pytest.fixture(scope="session")
def service():
    """A DispatchServer with two WorkerServers (UCX data plane)."""
    with sluice.DispatchServer() as dispatcher:
        workers = [sluice.WorkerServer(dispatcher_address=dispatcher.address)
                   for _ in range(2)]
        try:
            yield dispatcher
        finally:
            for w in workers:
                w.stop()


@pytest.fixture
def hang_guard():
    """Kills the process with a traceback if the test runs over 30 s."""
    faulthandler.dump_traceback_later(30, exit=True)
    yield
    faulthandler.cancel_dump_traceback_later()
