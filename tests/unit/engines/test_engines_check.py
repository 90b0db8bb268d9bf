"""The engine setting (issue 32: `engine=`, a site's `engine:`, `hpc-cluster up --engine`):
which names and distributed versions engines/__init__.py's check_engine accepts, that the range
it checks is the one pyproject.toml's `distributed` extra declares, what the job command says,
and bad input refused at construction, before any file or job, with what to install or write:
an unknown name (keyword, command line, site file) and the distributed engine in an environment
that has no distributed.

That environment is a real one (conftest.py's no_distributed_python): nothing of ours is replaced."""

from __future__ import annotations

import re
import subprocess
import tomllib
from pathlib import Path

import pytest

from helpers.cli import run_cli

from hpc_cluster import SLURMCluster
from hpc_cluster.config import ConfigError, resolve
from hpc_cluster.deploy.plan import worker_command
from hpc_cluster.engines import (DEFAULT, DISTRIBUTED_BELOW, DISTRIBUTED_MIN, ENGINES, EngineError, check_engine,
                                 supported_range)
from hpc_cluster.worker.__main__ import build_parser
from hpc_cluster.worker.flags import ENGINE_WORKERS

REPO = Path(__file__).resolve().parents[3]
INSTALL = "pip install 'hpc-cluster[distributed]'"
SITE = "default: lab\nsites:\n  lab:\n    batch: slurm\n    cores: 1\n    memory: 1GB\n"


def test_the_engines_and_the_default():
    assert ENGINES == ("hpc-cluster", "distributed") and DEFAULT == "hpc-cluster"
    assert check_engine("hpc-cluster") == "hpc-cluster"
    assert check_engine("distributed") == "distributed"          # the one installed here is supported
    assert set(ENGINE_WORKERS) == set(ENGINES)                    # the worker knows each engine's module


@pytest.mark.parametrize("name", ["nope", "Distributed", "dask", ""])
def test_an_unknown_name_is_refused_naming_the_engines_there_are(name):
    with pytest.raises(EngineError) as info:
        check_engine(name)
    text = str(info.value)
    assert f"engine={name!r} is not an engine" in text
    assert "engine='hpc-cluster'" in text and "engine='distributed'" in text


@pytest.mark.parametrize("version", ["2024.12.0", "2024.12.1", "2025.1.0", "2026.8.0", "2026.12.1",
                                     "2025.3.0rc1", "2026.1.0+12.gabc1234"])
def test_versions_in_the_range_are_accepted(version):
    assert check_engine("distributed", installed=version) == "distributed"


@pytest.mark.parametrize("version", ["2024.11.2", "2024.1.0", "2023.12.1", "2.30.1", "2027.1.0", "2027.1.0.dev3",
                                     "2028.2.0"])
def test_versions_out_of_the_range_are_refused_with_what_to_install(version):
    with pytest.raises(EngineError) as info:
        check_engine("distributed", installed=version)
    text = str(info.value)
    assert f"supports distributed >=2024.12, <2027.1; this environment has {version}" in text
    assert INSTALL in text


def test_the_range_is_the_one_pyproject_declares_as_the_distributed_extra():
    extras = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    assert "distributed" in extras, "pyproject.toml declares no `distributed` extra"
    (requirement,) = extras["distributed"]
    bounds = re.fullmatch(r"distributed>=(\d+)\.(\d+),<(\d+)\.(\d+)", requirement.replace(" ", ""))
    assert bounds, requirement
    numbers = tuple(map(int, bounds.groups()))
    assert (numbers[:2], numbers[2:]) == (DISTRIBUTED_MIN, DISTRIBUTED_BELOW)
    assert supported_range() == ">=2024.12, <2027.1"


def config_of(tmp_path, **kw):
    environ = {"HOME": str(tmp_path), "XDG_CONFIG_HOME": str(tmp_path / "xdg"),
               "HPC_CLUSTER_SYSTEM_CONFIG_DIR": str(tmp_path / "etc")}
    return resolve(environ=environ, cwd=tmp_path, batch="slurm", cores=2, memory="1GB", **kw)


def test_the_job_command_starts_the_engines_worker(tmp_path):
    ours = worker_command(config_of(tmp_path), "/c/big.json", "big")
    theirs = worker_command(config_of(tmp_path, engine="distributed"), "/c/big.json", "big")
    assert "--engine" not in ours                                    # the default: as before issue 32
    assert theirs == ours + " --engine distributed"
    args = build_parser().parse_args(theirs.split(" -m hpc_cluster.worker ", 1)[1].split())
    assert args.engine == "distributed" and ENGINE_WORKERS[args.engine] == "hpc_cluster.engines.dask_worker"


def test_an_unknown_engine_keyword_fails_at_construction(isolated_home):
    with pytest.raises(ConfigError, match=r"^engine='nope' must be one of hpc-cluster, distributed$"):
        SLURMCluster(cores=1, memory="1GB", engine="nope")
    assert not (isolated_home / "xdg" / "hpc-cluster" / "clusters").exists()


def test_up_with_an_unknown_engine_exits_2_naming_the_choices(isolated_home, capsys):
    code, out, err = run_cli(capsys, "up", "--engine", "nope")
    assert code == 2 and out == ""
    assert "argument --engine: invalid choice: 'nope' (choose from 'hpc-cluster', 'distributed')" in err


def test_a_site_file_with_an_unknown_engine_is_a_config_error_at_its_line(isolated_home, capsys):
    site = isolated_home / "site.yaml"
    site.write_text(SITE + "    engine: nope\n")
    said = f"{site}, line 7: engine='nope' must be one of hpc-cluster, distributed"
    with pytest.raises(ConfigError) as info:
        SLURMCluster(config=str(site))
    assert str(info.value) == said
    code, out, err = run_cli(capsys, "up", "--config", str(site), "--no-wait")
    assert code == 2 and said in err
    assert not (isolated_home / "xdg" / "hpc-cluster" / "clusters").exists()


NO_DISTRIBUTED = """
import importlib.metadata, importlib.util
try:
    importlib.metadata.version("distributed")
    raise SystemExit("distributed's metadata is found")
except importlib.metadata.PackageNotFoundError:
    pass
assert importlib.util.find_spec("distributed") is None and importlib.util.find_spec("dask") is not None
from hpc_cluster import SLURMCluster
from hpc_cluster.engines import check_engine, EngineError
assert check_engine("hpc-cluster") == "hpc-cluster"
try:
    SLURMCluster(cores=1, memory="1GB", engine="distributed")
except EngineError as exc:
    print(exc)
else:
    raise SystemExit("constructed")
"""


def test_the_distributed_engine_without_distributed_fails_at_construction(no_distributed_python, isolated_home):
    proc = subprocess.run([str(no_distributed_python), "-c", NO_DISTRIBUTED], capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    said = proc.stdout.strip()
    assert said.startswith("engine='distributed' needs dask.distributed in this environment and on the compute "
                           "nodes: " + INSTALL), said
    assert "pip install 'distributed>=2024.12,<2027.1'" in said and "leave engine unset" in said
    assert not (isolated_home / "xdg" / "hpc-cluster" / "clusters").exists()     # no daemon, no file


def test_up_with_the_distributed_engine_without_distributed_says_what_to_install(no_distributed_python,
                                                                               isolated_home):
    site = isolated_home / "site.yaml"
    site.write_text(SITE)
    for how in (["--engine", "distributed"], []):
        if not how:
            site.write_text(SITE + "    engine: distributed\n")
        proc = subprocess.run([str(no_distributed_python), "-m", "hpc_cluster.cli", "up", "--config", str(site),
                               "--no-wait", *how], capture_output=True, text=True, timeout=120)
        assert proc.returncode == 2, proc.stdout + proc.stderr
        assert "engine='distributed' needs dask.distributed" in proc.stderr and INSTALL in proc.stderr, proc.stderr
        assert "Traceback" not in proc.stderr
    assert not (isolated_home / "xdg" / "hpc-cluster" / "clusters").exists()

