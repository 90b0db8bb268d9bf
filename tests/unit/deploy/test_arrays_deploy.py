"""Job arrays (issue 18 point 5), deploy side: the `job_array` setting, and the job manager
submitting a scale-up as one array whose elements are jobs of their own. No batch system: a
fake adapter numbers submissions; tests/batch/slurm/test_job_arrays_slurm.py runs the real SLURM.
"""

from __future__ import annotations

import logging
import types

import pytest

from hpc_cluster.config import ConfigError, resolve
from hpc_cluster.deploy.cluster import SLURMCluster
from hpc_cluster.deploy.plan import PoolPlan, job_spec
from hpc_cluster.deploy.daemon.pools import PoolManager
from hpc_cluster.scheduler.state import SchedulerState
from helpers.aio import run
from helpers.fakes import FakeAdapter


@pytest.fixture(autouse=True)
def home(isolated_home):
    return isolated_home


def array_script(spec) -> str:
    """The job's index and array size, and the index variable where the template would use it."""
    body = f"#{spec.worker_index} x{spec.array_size}"
    return body + (" $FAKE_TASK" if spec.array_size and not spec.template else "")


def fake(**kw) -> FakeAdapter:
    """helpers.fakes.FakeAdapter numbering jobs from 101, its scripts as array_script renders them."""
    return FakeAdapter(first_id=101, script=array_script, **kw)


def array_pool_manager(adapter, job_array=True, pools=None, **job):
    state = SchedulerState()
    sched = types.SimpleNamespace(state=state, walltime_margin=60, retire_workers=lambda *a: None,
                                  drained=[], halts=[], fail_if_stranded=lambda: None)
    sched.drain = lambda addrs, why: sched.drained.append((tuple(addrs), why))
    sched.halt = sched.halts.append
    spec = {"worker_command": "w", "cores": 1, "memory": 300_000_000, "walltime": 600, "job_array": job_array, **job}
    pools = {"default": {"job": spec}, **(pools or {})}
    pm = PoolManager(sched, adapter, {name: PoolPlan.from_json(p) for name, p in pools.items()})
    return pm, sched


def test_a_scale_up_is_one_array_of_jobs_with_consecutive_indices():
    adapter = fake()
    pm, _ = array_pool_manager(adapter)

    async def go():
        await pm.scale(4)
        await pm.scale(6)          # two more: a second array, indices go on
        await pm.scale(7)          # one more: a plain job
        return pm.default.jobs

    jobs = run(go())
    assert adapter.scripts == ["#0 x4 $FAKE_TASK", "#4 x2 $FAKE_TASK", "#6 x0"]
    assert {j: jobs[j].index for j in jobs} == {"101_0": 0, "101_1": 1, "101_2": 2, "101_3": 3,
                                                "102_0": 4, "102_1": 5, "103": 6}


def test_scale_down_cancels_elements_one_by_one():
    adapter = fake()
    pm, _ = array_pool_manager(adapter)

    async def go():
        await pm.scale(4)
        await pm.scale(2)
        return pm.default.jobs

    jobs = run(go())
    assert len(adapter.cancelled) == 2 and set(adapter.cancelled) <= {"101_0", "101_1", "101_2", "101_3"}
    assert all(jobs[j].retiring for j in adapter.cancelled)
    assert sum(1 for j in jobs.values() if not j.retiring) == 2


def test_indices_stay_unique_across_pools_with_arrays():
    adapter = fake()
    big = {"job": {"worker_command": "w --pool big", "cores": 1, "memory": 1, "walltime": 600, "job_array": True}}
    pm, _ = array_pool_manager(adapter, pools={"big": big})

    async def go():
        await pm.scale(3)
        await pm.scale(2, "big")
        return [j.index for m in pm.managers.values() for j in m.jobs.values()]

    indices = run(go())
    assert sorted(indices) == [0, 1, 2, 3, 4]


def test_without_array_support_jobs_go_one_by_one_and_it_is_said_once(caplog):
    adapter = fake(supports_arrays=False)
    pm, _ = array_pool_manager(adapter)

    async def go():
        await pm.scale(3)
        await pm.scale(5)

    with caplog.at_level(logging.WARNING, logger="hpc_cluster.jobs"):
        run(go())
    assert adapter.scripts == [f"#{i} x0" for i in range(5)]
    notes = [r.getMessage() for r in caplog.records if "job_array" in r.getMessage()]
    assert len(notes) == 1 and "cannot submit job arrays" in notes[0] and "fake adapter" in notes[0]


def test_a_site_template_that_ignores_the_array_index_gets_single_jobs(caplog, tmp_path):
    adapter = fake()
    pm, _ = array_pool_manager(adapter, template=str(tmp_path / "site.sh.j2"))
    with caplog.at_level(logging.WARNING, logger="hpc_cluster.jobs"):
        run(pm.scale(2))
    assert adapter.scripts == ["#0 x0", "#1 x0"]
    assert any("never reads $FAKE_TASK" in r.getMessage() for r in caplog.records)


def test_without_job_array_nothing_changes():
    adapter = fake()
    pm, _ = array_pool_manager(adapter, job_array=False)
    run(pm.scale(3))
    assert adapter.scripts == ["#0 x0", "#1 x0", "#2 x0"]


def test_a_refused_array_is_a_submission_error_and_no_jobs():
    adapter = fake(refuse="fakesub: array too large")
    pm, _ = array_pool_manager(adapter)
    run(pm.scale(3))
    m = pm.default
    assert m.jobs == {} and [e.message for e in m.errors] == ["fakesub: array too large"]


# -- the setting -------------------------------------------------------------------------------
def test_job_array_setting_is_validated_and_reaches_the_job_spec(tmp_path):
    site = tmp_path / "site.yaml"
    text = "default: s\nsites:\n  s:\n    batch: slurm\n    cores: 1\n    memory: 1GB\n    job_array: true\n"
    site.write_text(text)
    cfg = resolve(config=str(site), environ={})
    assert cfg.values["job_array"] is True and job_spec(cfg, "/x/c.json").job_array is True
    default = resolve(batch="slurm", cores=1, memory="1GB", environ={})
    assert default.values["job_array"] is False and job_spec(default, "/x/c.json").job_array is False
    site.write_text(text.replace("job_array: true", "job_array: sometimes"))
    with pytest.raises(ConfigError, match=r"site.yaml, line 7: job_array=.sometimes. must be true or false"):
        resolve(config=str(site), environ={})


def test_cluster_keyword_and_job_script():
    c = SLURMCluster(cores=1, memory="1GB", walltime="00:10:00", job_array=True, asynchronous=True)
    # The job script shown is a single job's (an array's is made per scale-up): no --array in it.
    assert "--array" not in c.job_script() and "HPC_CLUSTER_WORKER_INDEX=0" in c.job_script()
