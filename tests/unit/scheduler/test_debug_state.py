"""$HPC_CLUSTER_DEBUG_STATE: the scheduler checks its state machine as it runs (server.py's
hook; scheduler/state/transitions.py and validate.py do the checking)."""

import pytest

from hpc_cluster.config.resolve import env_overrides
from hpc_cluster.scheduler.server import Scheduler
from hpc_cluster.scheduler.state.validate import InvalidState

from test_state import task


def test_the_server_validates_after_each_batch_with_the_debug_setting(monkeypatch):
    monkeypatch.delenv("HPC_CLUSTER_DEBUG_STATE", raising=False)
    assert not Scheduler(b"s" * 32).state.debug
    monkeypatch.setenv("HPC_CLUSTER_DEBUG_STATE", "1")
    sched = Scheduler(b"s" * 32)
    assert sched.debug_state and sched.state.debug
    assert not Scheduler(b"s" * 32, debug_state=False).state.debug        # a keyword beats the variable
    st = sched.state
    st.add_worker("w", nthreads=1, now=0.0)
    st.add_client("c")
    st.update_graph("c", [task("x")], ["x"])
    sched._flush()                                  # what the server calls after each batch it applies
    st.workers["w"].processing.clear()
    with pytest.raises(InvalidState, match="worker lists it as processing"):
        sched._flush()
    quiet = Scheduler(b"s" * 32, debug_state=False)
    quiet.state.add_worker("w", nthreads=1, now=0.0)
    quiet.state.update_graph("c", [task("x")], ["x"])
    quiet.state.workers["w"].processing.clear()
    quiet._flush()                                  # not checked without the setting


def test_the_debug_variable_is_not_refused_as_a_misspelt_setting():
    assert env_overrides({"HPC_CLUSTER_DEBUG_STATE": "1"}) == {}
