"""LSFCluster's and HTCondorCluster's job headers against dask-jobqueue 0.9's LSFJob and
HTCondorJob, keyword for keyword; where ours differs on purpose, the test says how."""

from __future__ import annotations

import warnings

import pytest

from hpc_cluster.adapters import get_adapter
from hpc_cluster.config import resolve
from hpc_cluster.deploy.plan import job_spec

LSF_CASES = [
    dict(cores=2, memory="4GB", walltime="01:30", lsf_units="mb"),
    dict(cores=1, memory="1GB", queue="normal", project="p1", walltime="00:30", ncpus=4, mem=2 * 10**9,
         lsf_units="gb"),
    dict(cores=8, memory="16GB", queue="q", walltime="12:00", lsf_units="kb", job_extra_directives=["-u me@x.org"],
         job_directives_skip=["span", "-q"]),
]


@pytest.fixture(autouse=True)
def no_user_config(monkeypatch, tmp_path):
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path))
    monkeypatch.setenv("HPC_CLUSTER_SYSTEM_CONFIG_DIR", str(tmp_path / "etc"))


@pytest.mark.parametrize("kwargs", LSF_CASES)
def test_lsf_header_is_dask_jobqueues(kwargs, tmp_path):
    from dask_jobqueue.lsf import LSFJob
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        # A cluster always names its jobs' workers; the -J is then the job name (dask-worker).
        job = LSFJob(scheduler="tcp://127.0.0.1:8786", name="w", **kwargs)
    cfg = resolve(batch="lsf", jobqueue=False, **kwargs)
    ours = get_adapter("lsf").template_context(job_spec(cfg, str(tmp_path / "c.json"), "w"))["directives"]
    assert ours == job.job_header.splitlines()


def test_htcondor_header_has_dask_jobqueues_commands_in_its_order(tmp_path):
    """The same commands in the same order; ours writes RequestCpus/Memory/Disk as numbers (theirs
    as expressions over MY.DaskWorker*, which condor_q -json would print unevaluated) and adds
    the walltime's two lines."""
    from dask_jobqueue.htcondor import HTCondorJob
    kwargs = dict(cores=2, memory="4GB", disk="1GB", log_directory="/tmp/logs", job_name="dw")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        # In a cluster named "w", dask-jobqueue names its first job "w-0" (SpecCluster's worker
        # name), and HTCondorJob writes that name, not job_name, as batch_name.
        job = HTCondorJob(scheduler="tcp://127.0.0.1:8786", name="w-0", job_name="dw", cores=2, memory="4GB",
                          disk="1GB", log_directory="/tmp/logs")
    theirs = {k: str(v) for k, v in job.job_header_dict.items()}
    cfg = resolve(batch="htcondor", jobqueue=False, **kwargs)
    lines = get_adapter("htcondor").template_context(job_spec(cfg, str(tmp_path / "c.json"), "w"))["directives"]
    ours = dict(line.split(" = ", 1) for line in lines)
    assert [k for k in ours if k in theirs] == list(theirs)
    assert set(ours) - set(theirs) == {"MY.HpcClusterWalltime", "periodic_remove"}
    same = {k for k in theirs if not k.startswith("Request")}
    assert {k: ours[k] for k in same} == {k: theirs[k] for k in same}
    assert (ours["RequestCpus"], ours["RequestMemory"], ours["RequestDisk"]) == ("2", "3815", "976563")
    assert ours["batch_name"] == "w-0"
    assert theirs["RequestMemory"] == "floor(MY.DaskWorkerMemory / 1048576)"     # 4e9 / 2**20, floored: 3814
