"""Adapters own their keywords: config collects each adapter's declared settings (adapters/options.py)
into the settings table, and applies their rules, without a list of batch systems of its own."""

from __future__ import annotations

import warnings

import pytest

from hpc_cluster.adapters.base import BatchAdapter
from hpc_cluster.adapters.htcondor import HTCondorAdapter
from hpc_cluster.adapters.lsf import LSFAdapter
from hpc_cluster.adapters.options import AdapterOption
from hpc_cluster.adapters.pbs import PBSAdapter
from hpc_cluster.adapters.sge import SGEAdapter
from hpc_cluster.adapters.slurm import SLURMAdapter
from hpc_cluster.config import ConfigError, option_by_name, resolve
from hpc_cluster.config.adapter_options import OptionClash, collect
from hpc_cluster.config.jobqueue import customized, import_jobqueue, key_map, translate
from hpc_cluster.config.schema import ADAPTERS_AFTER, CORE_OPTIONS, table_with

OURS = {"slurm": SLURMAdapter, "pbs": PBSAdapter, "sge": SGEAdapter, "lsf": LSFAdapter, "htcondor": HTCondorAdapter}


@pytest.fixture
def env(tmp_path):
    return {"HOME": str(tmp_path), "XDG_CONFIG_HOME": str(tmp_path / "xdg"),
            "HPC_CLUSTER_SYSTEM_CONFIG_DIR": str(tmp_path / "etc")}


class Tape(BatchAdapter):
    name = "tape"
    keywords = (AdapterOption("tape_speed", "int > 0", "how fast the tape turns", example=3, per_pool=True),)


def test_the_table_is_the_core_one_with_each_adapters_settings_after_the_job_script_keys():
    table = table_with({**OURS, "tape": Tape})
    names = [o.name for o in table]
    at = names.index(ADAPTERS_AFTER) + 1
    own = names[at:at + len(table) - len(CORE_OPTIONS)]
    assert set(own) == {"job_cpu", "job_mem", "resource_spec", "ncpus", "mem", "lsf_units", "use_stdin", "disk",
                        "submit_command_extra", "cancel_command_extra", "tape_speed"}
    by = {o.name: o for o in table}
    assert by["resource_spec"].owners == ("pbs", "sge")          # one declaration, shared by two adapters
    assert by["resource_spec"].help.startswith("PBS/SGE only: the -l resource request")
    assert by["disk"].help.startswith("HTCondor only:") and by["tape_speed"].help == "TAPE only: how fast the tape turns"
    assert by["tape_speed"].check("tape_speed", 2) == 2              # the kind's own check, config's
    with pytest.raises(ValueError, match="tape_speed=0 must be a whole number greater than 0"):
        by["tape_speed"].check("tape_speed", 0)
    assert not any(o.owners for o in CORE_OPTIONS)


def test_a_declaration_that_clashes_is_refused_naming_both():
    class Again(BatchAdapter):
        keywords = (AdapterOption("tape_speed", "int > 0", "another meaning"),)

    class Core(BatchAdapter):
        keywords = (AdapterOption("speed", "str", "x", aliases=("queue",)),)
    with pytest.raises(OptionClash, match="the 'zz' adapter and the 'tape' adapter declare the setting 'tape_speed' differently"):
        collect({"tape": Tape, "zz": Again}, set())
    with pytest.raises(OptionClash, match="the 'core' adapter declares the setting 'queue', which is a core setting"):
        collect({"core": Core}, {"queue"})
    with pytest.raises(ValueError, match="kind 'colour' and no check"):
        class Odd(BatchAdapter):
            keywords = (AdapterOption("hue", "colour", "x"),)
        table_with({"odd": Odd})


def test_an_adapters_setting_is_refused_elsewhere_with_its_advice_or_ignored_if_it_says_so(env):
    with pytest.raises(ConfigError, match=r"disk \(keyword\) is a HTCONDOR setting; on SLURM use job_extra_directives"):
        resolve(batch="slurm", disk="1GB", jobqueue=False, environ=env)
    with pytest.raises(ConfigError, match=r"mem \(keyword\) is a LSF setting; on PBS use memory"):
        resolve(batch="pbs", mem="1GB", jobqueue=False, environ=env)
    # use_stdin (how bsub is called) is ignored elsewhere, as before; and not handed to SLURM's adapter.
    rc = resolve(batch="slurm", use_stdin=False, submit_command_extra=["-x"], jobqueue=False, environ=env)
    assert rc["use_stdin"] is False
    from hpc_cluster.deploy.batch_options import batch_options
    assert batch_options(rc.values) == {}
    assert batch_options(resolve(batch="htcondor", disk="1GB", jobqueue=False, environ=env).values) == {"disk": 10**9}


def test_the_adapters_rules_run_through_its_hook(env):
    with pytest.raises(ConfigError, match="HTCondor needs the disk each job asks for: give disk='1 GB'"):
        resolve(batch="htcondor", jobqueue=False, environ=env)
    rc = resolve(batch="pbs", jobqueue=False, environ={**env, "PBS_ACCOUNT": "g1"})
    assert (rc["account"], rc.sources["account"]) == ("g1", "env:PBS_ACCOUNT")
    with warnings.catch_warnings():
        warnings.simplefilter("error", FutureWarning)              # project is LSF's own name: no warning
        assert resolve(batch="lsf", project="p9", jobqueue=False, environ=env)["account"] == "p9"
    with pytest.warns(FutureWarning, match="project has been renamed to account"):
        resolve(batch="slurm", project="p9", jobqueue=False, environ=env)


def test_a_pool_may_set_the_settings_an_adapter_declares_per_pool(env):
    rc = resolve(batch="slurm", cores=4, memory="8GB", pools={"wide": {"job_cpu": 8, "job-mem": "20G"}},
                 jobqueue=False, environ=env)
    wide = rc.pools()["wide"].values
    assert (wide["job_cpu"], wide["job_mem"]) == (8, "20G")
    with pytest.raises(ConfigError, match=r"unknown key 'disk' in pool 'big'.*a pool takes: .*resource_spec"):
        resolve(batch="slurm", pools={"big": {"disk": "1GB"}}, jobqueue=False, environ=env)


def test_jobqueue_sections_read_the_adapters_settings_under_their_hyphenated_names():
    assert key_map()["lsf-units"] == "lsf_units" and key_map()["job-cpu"] == "job_cpu"
    layer = translate({"disk": "2GB", "ncpus": 4, "use-stdin": True}, "htcondor", "htcondor")
    assert layer.entries["disk"].value == 2 * 10**9
    assert layer.notes == ["jobqueue.htcondor.ncpus is a LSF setting; HTCondorCluster does not use it "
                           "(nor does dask-jobqueue's); ignored"]          # use-stdin: LSF's default, no word
    # A section of the user's own name is the batch system whose settings it gives.
    sites, notes = import_jobqueue({"mine": {"cores": 2, "disk": "1GB"}, "theirs": {"cores": 2, "resource-spec": "x"}})
    assert sites["mine"]["batch"] == "htcondor" and sites["theirs"]["batch"] == "pbs"
    # Defaults as dask-jobqueue writes them (LSF's '00:30', use-stdin: true) are no customization.
    assert customized({"walltime": "00:30", "use-stdin": True}, "lsf") == {}
    assert customized({"walltime": "00:30"}, "slurm") == {"walltime": "00:30"}    # 30 s to sbatch


def test_the_installed_table_has_our_settings_as_before():
    table = option_by_name()
    assert table["ncpus"].owners == ("lsf",) and table["job_mem"].owners == ("slurm",)
    assert table["use_stdin"].default is True and table["submit_command_extra"].default == []


def test_each_adapter_declares_how_its_batch_system_reads_a_walltime(env, monkeypatch):
    from hpc_cluster.config import adapter_options
    from hpc_cluster.units import UnitError, WalltimeReading, parse_walltime

    # Ours, as their batch systems read '60' and '90:00': minutes to sbatch and bsub, seconds to qsub.
    assert resolve(batch="slurm", walltime="60", jobqueue=False, environ=env)["walltime"] == 3600
    assert resolve(batch="pbs", walltime="60", jobqueue=False, environ=env)["walltime"] == 60
    assert resolve(batch="lsf", walltime="01:30", jobqueue=False, environ=env)["walltime"] == 5400
    with pytest.raises(ConfigError, match="SGE has no day form"):
        resolve(batch="sge", walltime="1-00:00:00", jobqueue=False, environ=env)

    # A plugin's batch system declares its own reading; units.py knows no batch system by name.
    class Hours(Tape):
        walltime_reading = WalltimeReading("TAPE", "hours ('2') or 'HH:MM'", bare_minutes=True,
                                           hours_minutes=True)
    monkeypatch.setattr(adapter_options, "adapter_classes", lambda: {**OURS, "tape": Hours})
    reading = adapter_options.walltime_reading("tape")
    assert parse_walltime("02:00", batch=reading) == 7200
    assert reading in adapter_options.walltime_readings()
    with pytest.raises(UnitError, match=r"use hours \('2'\) or 'HH:MM'"):
        parse_walltime("soon", batch=reading)
    assert adapter_options.walltime_reading("local") is None
