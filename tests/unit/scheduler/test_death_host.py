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
