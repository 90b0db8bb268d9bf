"""A job over several nodes (nodes=): each worker's death is judged on its own node's part of the
job's accounting (scheduler/node_view.py), read from sacct outputs captured on the multi-node SLURM
(tests/unit/adapters/fixtures/slurm/multinode/SOURCES.md).

The one capture that matters most: hpcn2 of a 3-node --no-kill job lost power. SLURM did not fail
the job; it took hpcn2 out and went on: sacct then shows the job twice under one id, RESIZING on
hpcn[1-3] (every step too, even those still running) and RUNNING on hpcn[1,3].
"""

from __future__ import annotations

import asyncio
import dataclasses
from pathlib import Path

import pytest

from hpc_cluster.adapters.slurm_text import expand_hostlist, parse_sacct
from hpc_cluster.scheduler import evidence
from hpc_cluster.scheduler.diagnosis import Evidence, diagnose
from hpc_cluster.scheduler.node_view import node_name, on_node
from hpc_cluster.scheduler.state import SchedulerState
from helpers.fakes import FixedAccounting

FIXTURES = Path(__file__).resolve().parents[1] / "adapters" / "fixtures" / "slurm" / "multinode"


def fixture_record(name: str) -> dict:
    """A fixture's one job as the job manager hands it to the scheduler (deploy/daemon/jobs.py)."""
    (rec,) = parse_sacct((FIXTURES / name).read_text())
    return {**dataclasses.asdict(rec), "final": rec.final}


@pytest.mark.parametrize("text, names", [
    ("hpcn[1-2,4]", ["hpcn1", "hpcn2", "hpcn4"]), ("hpcn[1,3]", ["hpcn1", "hpcn3"]), ("hpcn1", ["hpcn1"]),
    ("n[08-10],gpu7", ["n08", "n09", "n10", "gpu7"]), ("r[1-2]-n[1-2]", ["r1-n1", "r1-n2", "r2-n1", "r2-n2"]),
    ("None assigned", []), ("", [])])
def test_expand_hostlist(text, names):
    assert expand_hostlist(text) == names


def test_parse_sacct_names_each_steps_node_and_the_node_taken_out():
    running = fixture_record("sacct_running_3_nodes.txt")
    assert running["nodes"] == ["hpcn1", "hpcn2", "hpcn3"] and running["released_nodes"] == []
    assert [(s["step_id"], s["nodes"]) for s in running["steps"]] == [
        ("batch", ["hpcn1"]), ("0", ["hpcn1"]), ("1", ["hpcn2"]), ("2", ["hpcn3"])]
    assert running["requested_memory"] == 100 * 2**20          # ReqMem 300M is 3 nodes' --mem=100M
    resized = fixture_record("sacct_node_removed.txt")
    assert (resized["state"], resized["raw_state"], resized["node"]) == ("running", "RUNNING", "hpcn[1,3]")
    assert resized["nodes"] == ["hpcn1", "hpcn3"] and resized["released_nodes"] == ["hpcn2"]
    assert resized["requested_memory"] == 100 * 2**20 and not resized["final"]
    ended = fixture_record("sacct_node_removed_then_node_fail.txt")
    assert ended["state"] == "node-fail" and ended["final"] and ended["released_nodes"] == ["hpcn2"]


def test_a_one_node_job_and_an_unknown_host_are_seen_whole():
    one = {"job_id": "7", "state": "running", "nodes": ["hpcn1"], "steps": [], "final": False}
    assert on_node(one, "hpcn1") is one and on_node(None, "hpcn1") is None
    three = fixture_record("sacct_running_3_nodes.txt")
    assert on_node(three, "elsewhere") is three and on_node(three, None) is three
    assert node_name("hpcn2.cluster.org", ["hpcn1", "hpcn2"]) == "hpcn2"


def test_the_failed_nodes_workers_die_of_node_failure_the_others_live_on():
    resized = fixture_record("sacct_node_removed.txt")
    lost = on_node(resized, "hpcn2")
    assert lost["final"] and lost["state"] == "node-fail" and lost["node"] == "hpcn2"
    assert [s["step_id"] for s in lost["steps"]] == ["1"]
    v = diagnose(Evidence(connection="heartbeat-lost", job_id="500000", executing=["f-1"], accounting=lost,
                          host="hpcn2"))
    assert v.cause == "node-failure" and not v.blame
    assert v.text.startswith("job 500000's node hpcn2 failed while running 'f-1'")
    line = next(e for e in v.evidence if e.startswith("accounting:"))
    assert "RESIZING: SLURM took the failed node hpcn2 out of the job, which goes on on hpcn[1,3]" in line
    assert "node hpcn2" in line and "(steps: 1 RESIZING)" in line
    # A worker on hpcn3 (one that died for another reason meanwhile) is not told its node failed.
    alive = on_node(resized, "hpcn3")
    assert not alive["final"] and alive["state"] == "running" and [s["step_id"] for s in alive["steps"]] == ["2"]
    assert diagnose(Evidence(connection="closed", job_id="500000", accounting=alive, host="hpcn3")).cause \
        == "connection-lost"


def test_a_step_that_ended_on_its_node_while_the_job_runs_is_that_nodes_verdict():
    rec = fixture_record("sacct_running_3_nodes.txt")
    rec["steps"][2] = dict(rec["steps"][2], state="out-of-memory", raw_state="OUT_OF_MEMORY", exit_code=0, signal=125)
    mine = on_node(rec, "hpcn2")
    assert mine["final"] and mine["state"] == "out-of-memory" and mine["node"] == "hpcn2"
    assert mine["raw_state"] == "OUT_OF_MEMORY (step 1; the job goes on on its other nodes)"
    assert diagnose(Evidence(connection="closed", job_id="500000", accounting=mine, host="hpcn2")).cause \
        == "memory-batch"
    # hpcn3's workers are not charged with hpcn2's out-of-memory step.
    other = on_node(rec, "hpcn3")
    assert not other["final"] and all(s["state"] != "out-of-memory" for s in other["steps"])
    assert diagnose(Evidence(connection="closed", job_id="500000", accounting=other, host="hpcn3")).cause \
        == "connection-lost"


def test_a_job_that_ended_whole_is_every_nodes_verdict():
    cancelled = fixture_record("sacct_cancelled_3_nodes.txt")
    for host in ("hpcn1", "hpcn2", "hpcn4"):
        view = on_node(cancelled, host)
        assert view["final"] and view["state"] == "cancelled" and view["cancelled_by"] == "0"
        assert view["node"] == "hpcn[1-2,4]"                # which node, sacct does not say
    assert [s["step_id"] for s in on_node(cancelled, "hpcn1")["steps"]] == ["batch", "1"]


def test_the_collector_judges_each_worker_on_its_own_node(monkeypatch):
    """Two workers of one 3-node job lost at once (hpcn2's, and hpcn3's by its connection): one
    sacct answer, two verdicts; hpcn2's final at once, hpcn3's still waiting for its step."""
    monkeypatch.setattr(evidence, "BACKOFF", (0.01,) * 3)
    state = SchedulerState()
    col = evidence.EvidenceCollector(state, clock=lambda: 1000.0, flush=lambda: None)
    col.source = FixedAccounting({"500000": fixture_record("sacct_node_removed.txt")})
    for i, host in ((0, "hpcn2"), (1, "hpcn3")):
        state.add_worker(f"tcp://w:{i}", 1, 990.0, name=f"w-0-n{i + 1}", info={"job_id": "500000", "host": host})

    async def run():
        lost = col.worker_removed("tcp://w:0", "heartbeat-lost", None)
        other = col.worker_removed("tcp://w:1", "closed", None)
        await asyncio.wait_for(col._task, 5)
        return lost, other

    lost, other = asyncio.run(run())
    assert lost["cause"] == "node-failure" and lost["final_at"] is not None and "node hpcn2 failed" in lost["text"]
    assert other["cause"] == "connection-lost"
