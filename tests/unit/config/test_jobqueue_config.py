"""A dask-jobqueue user's configuration carries over: dask's `jobqueue.<name>` config (its YAML
files, DASK_* variables, dask.config.set, config_name=), beneath our site files and keywords,
with every key we cannot honour named in one warning; walltimes read as the batch system
reads them; renamed keywords still work, with dask-jobqueue's FutureWarning.

dask reads its files and DASK_* variables when it is imported, so those cases run in a fresh
interpreter (`in_fresh_python`); dask.config.set is tried in this one.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import warnings
from pathlib import Path

import dask
import pytest

from hpc_cluster.cli import main
from hpc_cluster.config import ConfigError, resolve
from hpc_cluster.config.jobqueue import customized, import_jobqueue, site_from_section

REPO = Path(__file__).resolve().parents[3]


@pytest.fixture
def home(tmp_path, monkeypatch):
    """No site files, no HPC_CLUSTER_* of this machine; dask's config dir is empty."""
    for var in list(os.environ):
        if var.startswith(("HPC_CLUSTER_", "DASK_JOBQUEUE")):
            monkeypatch.delenv(var)
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "xdg"))
    monkeypatch.setenv("HPC_CLUSTER_SYSTEM_CONFIG_DIR", str(tmp_path / "etc"))
    monkeypatch.chdir(tmp_path)
    return tmp_path


def in_fresh_python(code: str, env: dict, cwd: Path) -> dict:
    """Run `code` (which prints one JSON line) in a new interpreter with `env` added."""
    base = {k: v for k, v in os.environ.items() if not k.startswith(("HPC_CLUSTER_", "DASK_"))}
    proc = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True,
                          env={**base, **env}, cwd=cwd, timeout=120)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout.strip().splitlines()[-1])


RESOLVE = """
    import json, warnings
    from hpc_cluster.config import resolve
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        rc = resolve(batch="slurm"{extra})
    print(json.dumps({{"values": {{k: rc.values[k] for k in ("cores", "memory", "queue", "account", "walltime",
                       "job_name", "processes", "job_script_prologue", "worker_extra_args")}},
                       "sources": rc.sources, "notes": rc.notes,
                       "warnings": [str(w.message) for w in caught]}}))
"""

JOBQUEUE_YAML = """\
jobqueue:
  slurm:
    name: dask-worker
    cores: 8
    memory: 32GB
    processes: null
    queue: normal
    walltime: '02:00:00'
    job-script-prologue: ["module load python/3.11"]
    worker-command: distributed.cli.dask_worker
    scheduler-options: {dashboard_address: ":8787", idle_timeout: 60}
    ncpus: 4
    env-extra: ["export OLD=1"]
  pbs:
    cores: 2
"""


def test_a_jobqueue_yaml_in_dasks_config_dir_and_dask_variables_are_read(home):
    config_dir = home / "dask"
    config_dir.mkdir()
    (config_dir / "jobqueue.yaml").write_text(JOBQUEUE_YAML)
    out = in_fresh_python(RESOLVE.format(extra=""), {
        "DASK_CONFIG": str(config_dir), "DASK_JOBQUEUE__SLURM__ACCOUNT": "lab123",
        "XDG_CONFIG_HOME": str(home / "xdg"), "HPC_CLUSTER_SYSTEM_CONFIG_DIR": str(home / "etc")}, home)
    v, src = out["values"], out["sources"]
    assert (v["cores"], v["memory"], v["queue"], v["account"]) == (8, 32 * 10**9, "normal", "lab123")
    assert v["walltime"] == 7200 and v["job_name"] == "dask-worker"
    assert v["processes"] == 4                                   # about sqrt(8), as dask-jobqueue splits
    # Where each came from: the file, the DASK_* variable.
    assert src["queue"] == f"jobqueue:{config_dir / 'jobqueue.yaml'}"
    assert src["account"] == "jobqueue:DASK_JOBQUEUE__SLURM__ACCOUNT"
    # env-extra was renamed job-script-prologue; the new one is set, so the old is ignored,
    # with dask-jobqueue's FutureWarning.
    assert v["job_script_prologue"] == ["module load python/3.11"]
    assert any("env_extra has been renamed to job_script_prologue" in w for w in out["warnings"])
    # Nothing dropped in silence: each key we cannot honour is named with what happens instead.
    notes = "\n".join(out["notes"])
    assert "jobqueue.slurm.ncpus" in notes and "ignored" in notes
    assert "scheduler_options['idle_timeout']: not an option of hpc-cluster's scheduler" in notes
    assert "dashboard_address" not in notes                     # the daemon serves the dashboard there
    assert "worker-command" not in notes                          # dask's standard worker: ours


def test_dask_config_set_is_read_and_keywords_and_sites_win(home):
    site = home / "site.yaml"
    site.write_text("default: lab\nsites:\n  lab:\n    batch: slurm\n    queue: fromsite\n")
    with dask.config.set({"jobqueue.slurm.queue": "fromdask", "jobqueue.slurm.cores": 4,
                          "jobqueue.slurm.memory": "8GB", "jobqueue.slurm.account": "acct"}):
        rc = resolve(batch="slurm")
        assert (rc["queue"], rc["cores"], rc["account"]) == ("fromdask", 4, "acct")
        assert rc.sources["queue"] == "jobqueue:dask.config.set"
        rc = resolve(config=site)                                  # the site file beats jobqueue
        assert (rc["queue"], rc["account"]) == ("fromsite", "acct")
        rc = resolve(config=site, queue="kw")                      # and a keyword beats both
        assert rc["queue"] == "kw" and rc.sources["queue"] == "keyword"
        assert resolve(batch="slurm", jobqueue=False)["queue"] is None


def test_config_name_picks_another_section(home):
    with dask.config.set({"jobqueue.bigmem": {"cores": 2, "memory": "64GB", "name": "bigjob"},
                          "jobqueue.slurm": {"cores": 1}}):
        rc = resolve(batch="slurm", config_name="bigmem")
        assert (rc["cores"], rc["memory"], rc["job_name"]) == (2, 64 * 10**9, "bigjob")
        assert resolve(batch="slurm")["cores"] == 1


def test_a_site_names_a_jobqueue_yaml_and_overrides_it(home):
    jq = home / "lab-jobqueue.yaml"
    jq.write_text(JOBQUEUE_YAML)
    site = home / "site.yaml"
    site.write_text(f"default: lab\nsites:\n  lab:\n    batch: slurm\n    jobqueue_config: {jq}\n    memory: 16GB\n")
    with warnings.catch_warnings(record=True):
        warnings.simplefilter("always")
        rc = resolve(config=site)
    assert (rc["cores"], rc["memory"], rc["queue"]) == (8, 16 * 10**9, "normal")
    assert rc.sources["cores"] == f"jobqueue:{jq}" and rc.sources["memory"].startswith("file:")


def test_bad_values_in_jobqueue_config_name_the_key_and_where(home):
    with dask.config.set({"jobqueue.slurm.walltime": "soon", "jobqueue.slurm.cores": "many"}):
        with pytest.raises(ConfigError) as info:
            resolve(batch="slurm")
    text = str(info.value)
    assert "jobqueue.slurm.walltime (dask.config.set): walltime='soon'" in text
    assert "jobqueue.slurm.cores (dask.config.set): cores='many' must be a whole number" in text


@pytest.mark.parametrize("batch, written, seconds", [
    ("slurm", "60", 3600), ("slurm", 60, 3600), ("slurm", "90:00", 5400), ("slurm", "1-00:00:00", 86400),
    ("slurm", "1-12", 129600), ("slurm", "00:02:00", 120), ("pbs", "60", 60), ("pbs", 3600, 3600),
    ("pbs", "90:00", 5400), ("pbs", "48:00:00", 172800), ("slurm", "90m", 5400), ("pbs", "1h30m", 5400),
])
def test_walltimes_read_as_the_batch_system_reads_them(home, batch, written, seconds):
    assert resolve(batch=batch, walltime=written)["walltime"] == seconds


def test_a_walltime_the_batch_system_would_not_take_is_refused(home):
    with pytest.raises(ConfigError, match="PBS has no day form.*PBS's forms"):
        resolve(batch="pbs", walltime="1-00:00:00")


def test_an_unquoted_clock_in_a_site_file_is_not_yamls_base_60_number(home):
    site = home / "site.yaml"
    site.write_text("default: s\nsites:\n  s:\n    batch: slurm\n    walltime: 30:00\n")
    rc = resolve(config=site)
    assert rc["walltime"] == 1800 and rc.raw["walltime"] == "30:00"    # YAML 1.1 alone: 1800 minutes


def test_renamed_keywords_warn_as_dask_jobqueue_and_count_only_where_the_new_one_is_empty(home):
    pairs = [("extra", "worker_extra_args", ["--nthreads", "1"]), ("env_extra", "job_script_prologue", ["x"]),
             ("job_extra", "job_extra_directives", ["-x"]), ("header_skip", "job_directives_skip", ["-J"]),
             ("project", "account", "proj")]
    for old, new, value in pairs:
        with pytest.warns(FutureWarning, match=f"{old} has been renamed to {new}"):
            assert resolve(batch="slurm", **{old: value})[new] == value
        newer = ["--nthreads", "2"] if isinstance(value, list) else "acct"
        with pytest.warns(FutureWarning, match=f"{old} has been renamed"):
            assert resolve(batch="slurm", **{old: value, new: newer})[new] == newer
        with pytest.warns(FutureWarning):
            assert resolve(batch="slurm", **{old: value, new: [] if isinstance(value, list) else None})[new] == value


def test_pbs_account_comes_from_PBS_ACCOUNT_as_in_dask_jobqueue(home):
    rc = resolve(batch="pbs", environ={**os.environ, "PBS_ACCOUNT": "grant42"})
    assert rc["account"] == "grant42" and rc.sources["account"] == "env:PBS_ACCOUNT"
    assert resolve(batch="slurm", environ={**os.environ, "PBS_ACCOUNT": "grant42"})["account"] is None


# -- import-jobqueue ---------------------------------------------------------------------

def test_import_makes_a_site_of_each_slurm_and_pbs_section_and_says_what_it_left():
    tree = {"slurm": {"name": "dask-worker", "cores": 8, "memory": "32GB", "walltime": "90:00",
                      "extra": ["--lifetime", "55m"], "ncpus": 4, "worker-command": "distributed.cli.dask_worker",
                      "scheduler-options": {"dashboard_address": ":8787", "port": 8786, "idle_timeout": 60}},
            "pbs": {"cores": 2, "resource-spec": "select=1:ncpus=2", "job-cpu": 3},
            "sge": {"queue": "all.q", "walltime": "00:30:00", "project": "p1"},   # a site: SGE is ours now
            "lsf": {"walltime": "00:30", "use-stdin": True},            # only defaults: not a word
            "mine": {"cores": 1}}                                       # whose? said so
    sites, notes = import_jobqueue(tree)
    assert sites["slurm"] == {"batch": "slurm", "job_name": "dask-worker", "cores": 8, "memory": "32GB",
                              "walltime": "90:00",
                              "scheduler_options": {"dashboard_address": ":8787", "port": 8786, "idle_timeout": 60},
                              "worker_extra_args": ["--lifetime", "55m"]}
    assert sites["pbs"] == {"batch": "pbs", "cores": 2, "resource_spec": "select=1:ncpus=2"}
    text = "\n".join(notes)
    assert "dashboard_address" not in text
    for part in ("jobqueue.slurm.ncpus: a LSF setting; left out", "idle_timeout']: not an option of hpc-cluster's scheduler",
                 "jobqueue.slurm.extra: renamed to worker_extra_args", "jobqueue.pbs.job-cpu: a SLURM setting",
                 "jobqueue.mine: cannot tell which batch system"):
        assert part in text, part
    assert sites["sge"] == {"batch": "sge", "queue": "all.q", "walltime": "00:30:00", "account": "p1"}
    assert "jobqueue.lsf" not in text and "jobqueue.sge" not in text and set(sites) == {"slurm", "pbs", "sge"}
    sites, _ = import_jobqueue(tree, {"mine": "pbs"})
    assert sites["mine"] == {"batch": "pbs", "cores": 1}
    assert customized({"name": "dask-worker", "walltime": "00:30:00", "cores": None}) == {}
    assert site_from_section({"walltime": "soon"}, "slurm", "slurm")[1] == [
        "jobqueue.slurm.walltime: walltime='soon' is not a duration I understand; use SLURM's forms: minutes "
        "('60'), 'MM:SS' ('90:00'), 'HH:MM:SS', 'D-HH', 'D-HH:MM', 'D-HH:MM:SS', or units like '90m', "
        "'1h30m', '2d'; left out"]


def test_config_import_jobqueue_writes_a_site_config_that_resolves_the_same(home, capsys):
    jq = home / "jobqueue.yaml"
    jq.write_text(JOBQUEUE_YAML)
    target = home / "out.yaml"
    assert main(["config", "import-jobqueue", str(jq), "--path", str(target)]) == 0
    out = capsys.readouterr().out
    assert f"wrote {target}: site 'slurm'" in out and "site 'pbs'" in out
    assert "jobqueue.slurm.ncpus: a LSF setting" in out and "env-extra: ignored, job_script_prologue is set" in out
    with warnings.catch_warnings(record=True):
        warnings.simplefilter("always")
        via_site = resolve(config=target, site="slurm", jobqueue=False)
        via_jobqueue = resolve(batch="slurm", jobqueue_config=str(jq))
    for key in ("cores", "memory", "queue", "walltime", "job_name", "job_script_prologue", "processes"):
        assert via_site[key] == via_jobqueue[key], key
    assert main(["config", "import-jobqueue", str(jq), "--path", str(target)]) == 1     # no overwrite
    assert "already exists" in capsys.readouterr().err
    assert main(["config", "check", "--config", str(target)]) == 0


def test_config_check_reads_dask_jobqueues_sections_too(home, capsys):
    with dask.config.set({"jobqueue.slurm": {"queue": "normal", "ncpus": 4}}):
        assert main(["config", "check"]) == 0
        out = capsys.readouterr().out
        assert "dask-jobqueue's jobqueue.slurm: queue" in out and "note: jobqueue.slurm.ncpus" in out
        assert "jobqueue.pbs" not in out
    with dask.config.set({"jobqueue.pbs.walltime": "1-00:00:00", "jobqueue.pbs.cores": "many"}):
        assert main(["config", "check"]) == 2
        err = capsys.readouterr().err
        assert "jobqueue.pbs.cores (dask.config.set): cores='many' must be a whole number" in err
        assert "jobqueue.pbs.walltime (dask.config.set): walltime='1-00:00:00' is not a duration I understand " \
               "(PBS has no day form)" in err


def test_config_show_with_a_batch_system_says_what_came_from_jobqueue(home, capsys):
    with dask.config.set({"jobqueue.slurm.queue": "fromdask", "jobqueue.slurm.scheduler-options":
                          {"dashboard_address": ":8787", "idle_timeout": 60}}):
        assert main(["config", "show", "--batch", "slurm"]) == 0
    out = capsys.readouterr().out
    rows = {line.split()[0]: line for line in out.splitlines() if line.strip()}
    assert rows["queue"].split()[1:] == ["fromdask", "jobqueue:dask.config.set"]
    assert "dask-jobqueue's configuration: jobqueue.slurm" in out
    assert "not used here (what happens instead):" in out and "idle_timeout" in out
