"""SLURM's job_mem (dask-jobqueue's keyword): the sizes sbatch --mem takes, '2GB' among them
(SLURM reads nothing after the unit's letter: 22.05 grants --mem=2GB as 2G, issue 34), handed
to sbatch in its plain form, and the memory the workers are told agreeing with it."""

from __future__ import annotations

import dask
import pytest

from hpc_cluster.adapters.slurm import SLURMAdapter
from hpc_cluster.adapters.slurm_text import check_job_mem, job_mem_bytes
from hpc_cluster.config import ConfigError, resolve
from hpc_cluster.deploy.plan import job_spec, memory_limit_flag, pool_table
from hpc_cluster.worker.flags import parse_bytes

GiB, MiB = 2**30, 2**20


@pytest.mark.parametrize("given, sbatch, nbytes", [
    ("2GB", "2G", 2 * GiB), ("2gb", "2G", 2 * GiB), ("2 GB", "2G", 2 * GiB), ("2GiB", "2G", 2 * GiB),
    ("2G", "2G", 2 * GiB), ("100g", "100G", 100 * GiB), ("500MB", "500M", 500 * MiB),
    ("512K", "512K", 512 * 2**10), ("1TB", "1T", 2**40), ("4000", "4000", 4000 * MiB),
    (4000, "4000", 4000 * MiB),
])
def test_sizes_sbatch_reads_are_taken_in_its_plain_form(given, sbatch, nbytes):
    assert check_job_mem("job_mem", given) == sbatch
    assert job_mem_bytes(sbatch) == nbytes


def test_no_size_for_unset_or_a_whole_nodes_memory():
    assert job_mem_bytes(None) is None and job_mem_bytes("") is None
    assert check_job_mem("job_mem", "0") == "0" and job_mem_bytes("0") is None   # --mem=0: the node's all


@pytest.mark.parametrize("bad", ["1.5G", "2 gigs", "2B", "G", "-1G", "2GBs", "", True, 2.5, "2P"])
def test_what_sbatch_would_refuse_is_refused_with_the_forms_it_takes(bad):
    with pytest.raises(ValueError) as info:
        check_job_mem("job_mem", bad)
    text = str(info.value)
    assert f"job_mem={bad!r} is not a size sbatch --mem reads" in text
    assert "'2GB' and '2GiB' are all 2 GiB" in text and "'1536M' for 1.5G" in text and "memory=" in text


def test_a_job_mem_of_2gb_asks_sbatch_for_2g_and_tells_each_worker_its_share(tmp_path):
    cfg = resolve(batch="slurm", cores=2, processes=2, memory="8GB", job_mem="2GB", jobqueue=False, environ={})
    assert cfg["job_mem"] == "2G"
    script = SLURMAdapter().render(job_spec(cfg, str(tmp_path / "c.json")))
    assert "#SBATCH --mem=2G\n" in script and "--mem=8G" not in script
    # Each of the 2 workers is told 1 GiB, what the job's cgroup holds for it, not 8 GB / 2.
    assert parse_bytes(memory_limit_flag(cfg.values)) == GiB
    assert "--memory-limit 1.00GiB" in script
    assert pool_table(cfg)["default"]["memory"] == GiB
    # memory_limit still says what each worker may use, whatever the job asks for.
    told = resolve(batch="slurm", cores=1, memory="8GB", job_mem="2GB", memory_limit="1GiB", jobqueue=False,
                   environ={})
    assert parse_bytes(memory_limit_flag(told.values)) == GiB


def test_a_bad_job_mem_stops_the_configuration_naming_the_key():
    with pytest.raises(ConfigError, match=r"job_mem='1.5GB' is not a size sbatch --mem reads"):
        resolve(batch="slurm", cores=1, memory="2GB", job_mem="1.5GB", jobqueue=False, environ={})


def test_dask_jobqueues_job_mem_of_2gb_is_taken():
    # What a jobqueue.yaml's `job-mem: 2GB` becomes in dask's config (the switch, issue 34).
    with dask.config.set({"jobqueue.slurm.cores": 1, "jobqueue.slurm.memory": "4GB", "jobqueue.slurm.job-mem": "2GB"}):
        cfg = resolve(batch="slurm", environ={})
    assert cfg["job_mem"] == "2G" and parse_bytes(memory_limit_flag(cfg.values)) == 2 * GiB
