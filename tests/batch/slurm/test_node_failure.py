"""A node dies under a running job: the adapter must say node-fail.

"Dies" is done for real: the node's slurmd and the job's processes are killed, and the
node is marked down as an admin (or the controller, after SlurmdTimeout) would. The
node is brought back afterwards whatever happens, so later tests have a cluster. Marked
`node_down`: every job on the node ends too, so scripts/test runs it last, alone.
"""

from __future__ import annotations

import pytest

from slurm_jobs import fail_node, restore_node, scenarios, wait_final, wait_running

pytestmark = [pytest.mark.slurm, pytest.mark.node_down]   # runs alone, last (scripts/test)


@pytest.fixture
def node(slurm_node):
    yield slurm_node
    restore_node(slurm_node)


def test_node_failure(adapter, submitted, node, tmp_path):
    job_id = adapter.submit(adapter.render(scenarios(str(tmp_path))["node_fail"]))
    submitted.append(job_id)
    wait_running(adapter, job_id)
    fail_node(node, job_id)

    r = wait_final(adapter, [job_id], timeout=120)[job_id]
    assert (r.state, r.raw_state) == ("node-fail", "NODE_FAIL")
    assert r.node == node
    assert adapter.status([job_id])[job_id].state == "node-fail"
