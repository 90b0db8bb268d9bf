"""LSFCluster: dask-jobqueue's keywords reach the job script, and bad ones are named."""

from __future__ import annotations

import pytest

from hpc_cluster import LSFCluster
from hpc_cluster.config import ConfigError


@pytest.fixture(autouse=True)
def home(tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.setenv("LSF_ENVDIR", str(tmp_path))           # no lsf.conf: LSF's default unit, kb
    return tmp_path


def test_keywords_become_the_bsub_header():
    c = LSFCluster(cores=4, memory="8GB", queue="normal", project="p1", walltime="01:30", ncpus=8, mem="4GB",
                   lsf_units="mb", job_extra_directives=["-u me@example.org"])
    script = c.job_script()
    assert ('#BSUB -q normal\n#BSUB -P "p1"\n#BSUB -n 8\n#BSUB -R "span[hosts=1]"\n#BSUB -M 4000\n#BSUB -W 01:30\n'
            '#BSUB -u me@example.org\n') in script
    assert "export HPC_CLUSTER_JOB_WALLTIME=5400\n" in script


def test_defaults_follow_cores_memory_and_lsf_conf(home):
    (home / "lsf.conf").write_text("LSF_UNIT_FOR_LIMITS=GB\n")
    script = LSFCluster(cores=1, memory="2GB", walltime="30").job_script()
    assert "#BSUB -n 1\n#BSUB -M 2\n#BSUB -W 00:30\n" in script and "span[hosts=1]" not in script


def test_bad_keywords_say_what_to_change():
    with pytest.raises(ValueError, match="'lsf_unit' for LSFCluster; did you mean 'lsf_units'"):
        LSFCluster(cores=1, memory="1GB", lsf_unit="mb")
    with pytest.raises(ConfigError, match="lsf_units='mib' must be one of kb, mb, gb"):
        LSFCluster(cores=1, memory="1GB", lsf_units="mib")
    with pytest.raises(ConfigError, match="walltime='1-00:00' is not a duration I understand .LSF has no day form"):
        LSFCluster(cores=1, memory="1GB", walltime="1-00:00")
    with pytest.raises(ConfigError, match="resource_spec .* is a PBS/SGE setting; on LSF use job_extra_directives"):
        LSFCluster(cores=1, memory="1GB", resource_spec="x")


def test_lsf_keywords_elsewhere_are_refused_with_the_keyword_to_use():
    from hpc_cluster import SLURMCluster
    with pytest.raises(ConfigError, match="ncpus .* is a LSF setting; on SLURM use cores"):
        SLURMCluster(cores=1, memory="1GB", ncpus=2)


@pytest.mark.parametrize("config_value,keyword", [(None, False), (None, True), (True, None), (False, None),
                                                  (True, False)])
def test_use_stdin_comes_from_the_keyword_over_jobqueue_config(config_value, keyword):
    """dask-jobqueue's test_use_stdin, which reads it off their internal Job object, on ours."""
    import dask
    with dask.config.set({"jobqueue.lsf.use-stdin": config_value}):
        c = LSFCluster(cores=1, memory="2GB", **({} if keyword is None else {"use_stdin": keyword}))
        assert c.config.values["use_stdin"] is (config_value if keyword is None else keyword)
