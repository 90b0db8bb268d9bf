"""HTCondorCluster: dask-jobqueue's keywords reach the submit description, and bad ones are named."""

from __future__ import annotations

import pytest

from hpc_cluster import HTCondorCluster
from hpc_cluster.config import ConfigError


@pytest.fixture(autouse=True)
def home(tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path))


def test_keywords_become_submit_commands():
    c = HTCondorCluster(cores=2, memory="4GiB", disk="2GB", walltime="01:00:00", account="grp",
                        job_extra_directives={"+MyAttr": '"x"', "request_gpus": 1, "Stream_Output": False})
    script = c.job_script()
    assert "RequestCpus = 2\nRequestMemory = 4096\nRequestDisk = 1953125\n" in script
    assert "MY.HpcClusterWalltime = 3600\n" in script and "accounting_group = grp\n" in script
    assert script.index("periodic_remove") < script.index('+MyAttr = "x"\nrequest_gpus = 1\nStream_Output = false\n')


def test_disk_is_required_and_typos_are_named():
    with pytest.raises(ConfigError, match="HTCondor needs the disk each job asks for: give disk="):
        HTCondorCluster(cores=1, memory="1GB")
    with pytest.raises(ValueError, match="'disk_size' for HTCondorCluster; did you mean 'disk'"):
        HTCondorCluster(cores=1, memory="1GB", disk="1GB", disk_size=1)
    with pytest.raises(ConfigError, match="job_extra_directives=.* must map submit commands to values"):
        HTCondorCluster(cores=1, memory="1GB", disk="1GB", job_extra_directives={"a": [1]})
    with pytest.raises(ConfigError, match="disk .* is a HTCONDOR setting; on SLURM use job_extra_directives"):
        from hpc_cluster import SLURMCluster
        SLURMCluster(cores=1, memory="1GB", disk="1GB")
