"""A death record names the node its worker ran on (issue 33): with workers spread over many
nodes, "which node?" must not depend on the batch system's accounting (a nanny's verdict is
final without it; some sites have no sacct)."""

from hpc_cluster.scheduler.state import SchedulerState


def test_a_workers_death_names_the_host_it_registered_from():
    s = SchedulerState()
    s.add_worker("tcp://10.77.0.12:4000", nthreads=1, now=0, info={"host": "hpcn2", "job_id": "7"})
    record = s.remove_worker("tcp://10.77.0.12:4000", now=5, death={"cause": "crash", "blame": True, "text": "x"})
    assert (record["host"], record["job_id"]) == ("hpcn2", "7")


def test_a_job_that_never_started_its_worker_names_the_node_its_accounting_gives():
    from hpc_cluster.scheduler.server import Scheduler

    sched = Scheduler(b"s" * 32)
    record = sched.deaths.job_never_started("8", {"job_id": "8", "state": "failed", "raw_state": "FAILED",
                                                  "exit_code": 1, "node": "hpcn3", "final": True},
                                            ["module: command not found"])
    assert (record["cause"], record["host"]) == ("startup", "hpcn3")
    assert sched.deaths.job_never_started("9", None, ["no accounting"])["host"] is None


def test_a_job_that_never_started_is_asked_about_until_its_accounting_is_final(monkeypatch):
    """The job left the queue before sacct had its end: its first record said RUNNING (its batch
    step FAILED). That record made the verdict final and kept it (CI saw "accounting: job 5357
    RUNNING 0:0 ... (steps: batch FAILED)" as a refused worker's evidence); it is asked again
    until the record is final, as a worker's death is."""
    import asyncio

    from hpc_cluster.scheduler import evidence
    from helpers.fakes import FixedAccounting

    monkeypatch.setattr(evidence, "BACKOFF", (0.01,) * 5)
    state = SchedulerState()
    col = evidence.EvidenceCollector(state, clock=lambda: 1000.0, flush=lambda: None)
    running = {"job_id": "5357", "state": "running", "raw_state": "RUNNING", "exit_code": 0, "node": "vm",
               "final": False}
    col.source = FixedAccounting({"5357": dict(running, state="failed", raw_state="FAILED", exit_code=3,
                                               final=True)})

    async def run():
        record = col.job_never_started("5357", running, ["this worker's packages differ"])
        assert record["final_at"] is None                      # not final on a RUNNING record
        await asyncio.wait_for(col._task, 5)
        return record

    record = asyncio.run(run())
    assert record["final_at"] is not None and record["cause"] == "startup"
    assert any("FAILED 3:0" in e for e in record["evidence"]), record["evidence"]
