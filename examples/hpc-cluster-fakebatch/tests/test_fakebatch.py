"""The example adapter through hpc-cluster's adapter kit, its entry point, and real fakebatch jobs.

Run from the hpc-cluster checkout (scripts/setup.sh test installs this package):
    .venv/bin/python -m pytest examples/hpc-cluster-fakebatch/tests
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import pytest

from hpc_cluster.adapters import get_adapter
from hpc_cluster.adapters.base import BatchError, JobSpec
from hpc_cluster.runners.local import LocalRunner
from hpc_cluster.config import ConfigError, resolve
from hpc_cluster.testing.adapter_conformance import AdapterConformance, Captured, Ending

try:
    from hpc_cluster_fakebatch.adapter import FakeBatchAdapter, parse_fbstat
except ImportError:                                          # say how, rather than skip quietly
    raise ImportError("the example plugin is not installed: pip install -e examples/hpc-cluster-fakebatch "
                      "(scripts/setup.sh test does)") from None

FIXTURES = Path(__file__).resolve().parent / "fixtures"
# A plugin's own tests, written to be copied: they use hpc-cluster's public kit only, not the
# checkout's tests/helpers (so its deadline loops below are its own).


def read(name: str) -> str:
    return (FIXTURES / name).read_text()


class TestFakeBatch(AdapterConformance):
    adapter_class = FakeBatchAdapter
    entry_point = "fakebatch"
    script_must_contain = ("#FB --name=kit-job", "#FB --time=5400", "# fakebatch ignores queue='kit-queue'")
    submit_output = Captured("fbsub", read("fbsub.txt"))
    submitted_job_id = "8"
    status_outputs = [Captured("fbstat", read("fbstat_endings.txt"))]
    status_expected = {"1": "timeout", "2": "failed", "5": "cancelled", "6": "completed", "7": "running"}
    accounting_outputs = status_outputs
    endings = [
        Ending("1", "timeout", cause="walltime", signal=15),
        Ending("2", "failed", cause="crash", exit_code=3),
        Ending("3", "failed", cause="crash", exit_code=139),
        Ending("4", "failed", cause="crash", signal=11),
        Ending("5", "cancelled", cause="cancelled"),
        Ending("6", "completed", exit_code=0),
        Ending("2", "failed", cause="startup", registered=False),
    ]
    cancel_outputs = [Captured("fbdel", "", read("fbdel_finished_stderr.txt"), 1)]


def test_a_site_may_name_the_plugin_and_a_wrong_name_lists_it():
    assert resolve(batch="fakebatch", jobqueue=False)["batch"] == "fakebatch"
    with pytest.raises(Exception, match=r"installed: .*fakebatch.*; did you mean 'fakebatch'"):
        resolve(batch="fakebtch", jobqueue=False)
    with pytest.raises(ValueError, match=r"'fakebtch' is not an installed batch system; installed: .*fakebatch"):
        get_adapter("fakebtch")


def test_the_plugins_own_keyword_is_a_setting_checked_and_handed_to_it(tmp_path):
    """`fakebatch_grace`, declared in FakeBatchAdapter.keywords: a keyword, a site's YAML key and
    an HPC_CLUSTER_* variable, checked by the plugin's own check, refused on another batch system."""
    env = {"HOME": str(tmp_path), "XDG_CONFIG_HOME": str(tmp_path / "xdg"),
           "HPC_CLUSTER_SYSTEM_CONFIG_DIR": str(tmp_path / "etc")}
    assert resolve(batch="fakebatch", fakebatch_grace=30, jobqueue=False, environ=env)["fakebatch_grace"] == 30
    site = tmp_path / "hpc-cluster.yaml"
    site.write_text("sites:\n  fb:\n    batch: fakebatch\n    fakebatch_grace: 45\n")
    rc = resolve(config=site, jobqueue=False, environ=env)
    assert (rc["fakebatch_grace"], rc.sources["fakebatch_grace"]) == (45, f"file:{site}:4")
    assert resolve(batch="fakebatch", jobqueue=False, environ={**env, "HPC_CLUSTER_FAKEBATCH_GRACE": "9"}
                   )["fakebatch_grace"] == 9
    with pytest.raises(ConfigError, match=r"fakebatch_grace=0 must be a whole number of seconds from 1 to 300"):
        resolve(batch="fakebatch", fakebatch_grace=0, jobqueue=False, environ=env)
    site.write_text("sites:\n  fb:\n    batch: fakebatch\n    fakebatch_grace: soon\n")
    with pytest.raises(ConfigError, match=r"hpc-cluster.yaml, line 4: fakebatch_grace='soon' must be a whole number"):
        resolve(config=site, jobqueue=False, environ=env)
    with pytest.raises(ConfigError, match=r"fakebatch_grace \(keyword\) is a FAKEBATCH setting; on SLURM use "
                                          r"job_extra_directives"):
        resolve(batch="slurm", fakebatch_grace=30, jobqueue=False, environ=env)
    # ... and the other way round: fakebatch declares its keywords, so LSF's are refused here.
    with pytest.raises(ConfigError, match=r"ncpus \(keyword\) is a LSF setting; on FAKEBATCH use cores"):
        resolve(batch="fakebatch", ncpus=2, jobqueue=False, environ=env)
    script = get_adapter("fakebatch").render(JobSpec(worker_command="w", batch_options={"fakebatch_grace": 30}))
    assert "#FB --grace=30" in script
    assert "--grace" not in get_adapter("fakebatch").render(JobSpec(worker_command="w"))


def test_the_plugins_cluster_class_is_importable_from_hpc_cluster():
    # A batch system's cluster class needs no line in hpc_cluster: it is made from its adapter.
    import hpc_cluster
    from hpc_cluster import FakeBatchCluster
    from hpc_cluster.deploy.cluster import JobQueueCluster
    assert issubclass(FakeBatchCluster, JobQueueCluster) and FakeBatchCluster.batch == "fakebatch"
    assert hpc_cluster.FakeBatchCluster is FakeBatchCluster and "fakebatch_grace" in FakeBatchCluster.__doc__
    with pytest.raises(AttributeError):
        hpc_cluster.NoSuchCluster


def test_parser_refuses_a_changed_output_format():
    with pytest.raises(BatchError, match="fbstat printed a line of 3 fields"):
        parse_fbstat("ID|NAME|STATE\n1|x|running\n")


def test_real_jobs_end_as_the_adapter_says(tmp_path, monkeypatch):
    """fakebatch for real: a job over its time limit and one that exits 3, through the entry point."""
    monkeypatch.setenv("FAKEBATCH_SPOOL", str(tmp_path / "spool"))
    # fbsub and friends are console scripts beside this interpreter (the venv's bin).
    monkeypatch.setenv("PATH", f"{Path(sys.executable).parent}:{os.environ['PATH']}")
    adapter = get_adapter("fakebatch", LocalRunner())
    logs = tmp_path / "logs"
    logs.mkdir()
    spec = JobSpec(worker_command="sleep 30", job_name="too-long", walltime=1, log_directory=str(logs))
    long_id = adapter.submit(adapter.render(spec))
    exit_id = adapter.submit(adapter.render(spec.replace(worker_command="bash -c 'exit 3'", job_name="exit3")))
    deadline = time.monotonic() + 30
    while True:
        records = adapter.accounting([long_id, exit_id])
        if len(records) == 2 and all(r.final for r in records.values()):
            break
        assert time.monotonic() < deadline, f"jobs not finished after 30 s: {records}"
        time.sleep(0.2)
    assert (records[long_id].state, records[long_id].time_limit) == ("timeout", 1)
    assert (records[exit_id].state, records[exit_id].exit_code) == ("failed", 3)
    assert "time limit of 1 s reached" in (logs / f"too-long-{long_id}.out").read_text()


def test_a_cluster_of_fakebatch_workers_through_the_entry_point(tmp_path, monkeypatch):
    """The whole stack on a plugin's batch system: JobQueueCluster(batch='fakebatch') renders
    the plugin's template, submits with fbsub, polls with fbstat, and its workers compute."""
    from hpc_cluster import Client
    from hpc_cluster.deploy.cluster import JobQueueCluster
    for var, value in (("HOME", tmp_path), ("XDG_CONFIG_HOME", tmp_path / "xdg"),   # no user config
                       ("HPC_CLUSTER_SYSTEM_CONFIG_DIR", tmp_path / "etc"), ("FAKEBATCH_SPOOL", tmp_path / "spool")):
        monkeypatch.setenv(var, str(value))
    monkeypatch.delenv("HPC_CLUSTER_CONFIG", raising=False)
    monkeypatch.delenv("HPC_CLUSTER_SITE", raising=False)
    monkeypatch.setenv("PATH", f"{Path(sys.executable).parent}:{os.environ['PATH']}")
    monkeypatch.chdir(tmp_path)
    with JobQueueCluster(batch="fakebatch", cores=1, memory="1GB", walltime="00:05:00", fakebatch_grace=2,
                         log_directory=str(tmp_path / "logs"), name="fb") as cluster:
        assert "#FB --time=300" in cluster.job_script() and "#FB --grace=2" in cluster.job_script()
        cluster.scale(2)
        with Client(cluster) as client:
            client.wait_for_workers(2, timeout=60)
            assert client.gather(client.map(lambda x: x + 1, range(50))) == list(range(1, 51))
            assert {j["state"] for j in cluster.jobs.values()} == {"running"}
    records = get_adapter("fakebatch", LocalRunner()).accounting(["1", "2"])
    deadline = time.monotonic() + 30
    while not all(r.final for r in records.values()) or len(records) < 2:
        assert time.monotonic() < deadline, records
        time.sleep(0.2)
        records = get_adapter("fakebatch", LocalRunner()).accounting(["1", "2"])
    assert {r.state for r in records.values()} <= {"cancelled", "completed"}, records
