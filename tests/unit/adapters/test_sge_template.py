"""SGECluster's job header is dask-jobqueue's SGEJob header, keyword for keyword."""

from __future__ import annotations

import warnings

import pytest

from hpc_cluster.adapters import get_adapter
from hpc_cluster.config import resolve
from hpc_cluster.deploy.plan import job_spec

CASES = [
    dict(cores=2, memory="4GB", walltime="01:00:00"),
    dict(cores=2, memory="4GB", queue="all.q", project="p1", resource_spec="h_vmem=4G", walltime="01:00:00",
         log_directory="/tmp/logs", job_name="dw"),
    dict(cores=1, memory="1GB", queue="q", job_extra_directives=["-pe smp 1", "-V"], job_directives_skip=["-j y", "-P"],
         project="gone"),
]


@pytest.mark.parametrize("kwargs", CASES)
def test_header_is_dask_jobqueues(kwargs, monkeypatch, tmp_path):
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path))        # no site config of the user's
    monkeypatch.setenv("HPC_CLUSTER_SYSTEM_CONFIG_DIR", str(tmp_path / "etc"))
    from dask_jobqueue.sge import SGEJob
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        theirs = SGEJob(scheduler="tcp://127.0.0.1:8786", name="w", **kwargs).job_header.splitlines()
    cfg = resolve(batch="sge", jobqueue=False, **kwargs)
    ours = get_adapter("sge").template_context(job_spec(cfg, str(tmp_path / "c.json"), "w"))["directives"]
    assert ours == theirs


def test_project_is_sges_own_keyword_and_account_a_clash(monkeypatch, tmp_path):
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path))
    with warnings.catch_warnings():
        warnings.simplefilter("error")                           # no "renamed" FutureWarning for SGE
        assert resolve(batch="sge", project="p1", jobqueue=False)["account"] == "p1"
    with pytest.raises(Exception, match="project='p1' and account='a' name one setting; give only project"):
        resolve(batch="sge", project="p1", account="a", jobqueue=False)
    with pytest.warns(FutureWarning, match="project has been renamed to account"):
        resolve(batch="pbs", project="p1", jobqueue=False)       # elsewhere it is dask-jobqueue's old name
