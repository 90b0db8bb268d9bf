"""Workers that run another dask.distributed than the cluster's scheduler (issue 32, point 9),
on the real SLURM: the job's worker is stopped at start with both versions and the fix, our
nanny does not restart it, the job ends, and its death is a `startup` one whose log tail and
`hpc-cluster why` say so; no worker of that job ever registers with distributed's scheduler.

The jobs run a second, real Python environment (the cluster's `python=`): a venv of this
interpreter with an older dask and distributed pair from the package registry and this repo
installed with --no-deps from a copy of its source (a build in the checkout leaves build/ and
an egg-info there). hpc-cluster's other dependencies are installed too, those our own handshake
compares (protocol/versions.py) pinned to the versions here, so that distributed's check, not
ours, is what refuses the worker. It is built once per test session under the session's tmp
dir, in 8 to 15 s here (the time is printed), most of it the build of this repo's wheel.

    python -m pytest -m slurm tests/batch/slurm/test_distributed_versions.py -v -s
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import time
import uuid
from importlib import metadata
from pathlib import Path

import pytest

from helpers.scenarios import deployed
from helpers.slurm import squeue_ids
from helpers.wait import wait_until

from hpc_cluster import SLURMCluster
from hpc_cluster.engines import DISTRIBUTED_MIN
from hpc_cluster.engines.dask_worker import EXIT_REFUSED
from hpc_cluster.protocol.versions import OPTIONAL, PACKAGES

pytestmark = [pytest.mark.slurm, pytest.mark.timeout(900)]

REPO = Path(__file__).resolve().parents[3]
# Older than the one installed here and inside the supported range: a version a user may well
# have left on the compute nodes' environment.
OLDER = "2025.1.0"
assert tuple(int(p) for p in OLDER.split(".")[:2]) >= DISTRIBUTED_MIN


def pins() -> list[str]:
    """The packages our own handshake compares, at the versions installed here (not the optional
    ones: compared only where both sides have them, and numpy and pandas are big to install)."""
    out = []
    for name in PACKAGES:
        if name == "hpc-cluster" or name in OPTIONAL:
            continue
        try:
            out.append(f"{name}=={metadata.version(name)}")
        except metadata.PackageNotFoundError:
            continue
    return out


@pytest.fixture(scope="session")
def older_distributed_python(tmp_path_factory) -> Path:
    """The python of a venv whose dask and distributed are OLDER, with hpc-cluster installed."""
    base = tmp_path_factory.mktemp("older-distributed")
    venv, source = base / "venv", base / "source"
    t0 = time.monotonic()
    # Without pip of its own (ensurepip takes seconds): this interpreter's pip installs into it.
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, capture_output=True,
                   timeout=120)
    shutil.copytree(REPO / "hpc_cluster", source / "hpc_cluster", ignore=shutil.ignore_patterns("__pycache__"))
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(REPO / name, source / name)
    python = venv / "bin" / "python"
    # hpc-cluster's requirements, then the repo itself --no-deps: pip chooses nothing from it.
    requires = [r for r in metadata.requires("hpc-cluster") or [] if "extra ==" not in r]
    steps = ([*requires, *pins(), f"dask=={OLDER}", f"distributed=={OLDER}"], ["--no-deps", str(source)])
    for step in steps:
        proc = subprocess.run([sys.executable, "-m", "pip", "--python", str(python), "install", "-q",
                               "--disable-pip-version-check", *step],
                              capture_output=True, text=True, timeout=600)
        if proc.returncode:
            pytest.fail(f"building the second environment failed: pip install {' '.join(step)}:\n"
                        f"{proc.stdout}\n{proc.stderr}")
    got = subprocess.run([str(python), "-c", "import dask, distributed, hpc_cluster; "
                          "print(dask.__version__, distributed.__version__, hpc_cluster.__file__)"],
                         capture_output=True, text=True, check=True, cwd=base).stdout.split()
    assert got[:2] == [OLDER, OLDER] and got[2].startswith(str(venv)), got
    print(f"\nthe second environment (dask and distributed {OLDER}) took {time.monotonic() - t0:.1f} s to build")
    return python


def test_workers_of_another_distributed_are_stopped_at_start(older_distributed_python, slurm_cluster, own_home,
                                                             tmp_path, monkeypatch):
    # Not the checkout: `python -m` puts the working directory first on the job's sys.path, and
    # the jobs (submitted from here) must import the second environment's hpc_cluster.
    monkeypatch.chdir(tmp_path)
    ours = {name: metadata.version(name) for name in ("dask", "distributed")}
    assert ours["distributed"] != OLDER and ours["dask"] != OLDER
    logs = tmp_path / "logs"
    cluster = SLURMCluster(cores=1, memory="300MB", walltime="00:10:00", engine="distributed",
                           python=str(older_distributed_python), name=f"dver-{uuid.uuid4().hex[:4]}",
                           log_directory=str(logs))
    assert cluster.job_script().count(str(older_distributed_python)) == 1
    with deployed(cluster, lambda: squeue_ids(check=False), jobs=0) as run:
        run.cluster.scale(1)
        death = run.death(lambda d: d["cause"] == "startup")
        job = str(death["job_id"])
        tail = "\n".join(death["log_tail"])
        said = [f"distributed {OLDER} here, {ours['distributed']} on the scheduler",
                f"dask {OLDER} here, {ours['dask']} on the scheduler"]
        fix = "install the same versions in the environment the jobs run"
        assert all(s in tail for s in said) and fix in tail and str(older_distributed_python) in tail, tail
        assert death["blame"] is False and death["worker"] is None, death
        why = subprocess.run([sys.executable, "-m", "hpc_cluster.cli", "why", job, cluster.id],
                             capture_output=True, text=True, timeout=120)
        assert why.returncode == 0 and "startup" in why.stdout, why.stdout + why.stderr
        assert all(s in why.stdout for s in said) and fix in why.stdout, why.stdout

        # Refused with EXIT_REFUSED, not restarted: the job's log has the refusal once, then its
        # nanny exited with the worker's code, which ended the job.
        err = wait_until(lambda: [p for p in logs.glob(f"*{job}*.err")], 30, f"job {job}'s .err file")
        text = err[0].read_text()
        assert text.count("this worker's packages differ from the scheduler's") == 1, text
        assert f"worker ended (exit code {EXIT_REFUSED}); nanny exits" in text and "restarting" not in text, text
        assert any(f"job {job} FAILED {EXIT_REFUSED}:0" in e for e in death["evidence"]), death["evidence"]
        # Nothing ever joined distributed's scheduler (no add-worker event, no worker), nor ours.
        user = run.client.user
        joined = [m for _, m in user.get_events("all") if isinstance(m, dict) and m.get("action") == "add-worker"]
        assert joined == [] and user.scheduler_info()["workers"] == {}
        assert run.client.ours.scheduler_info()["workers"] == {}
        assert not any(d["worker"] for d in run.client.deaths()), run.client.deaths()
    assert run.outcome["jobs"] and not run.outcome["left_in_queue"], run.outcome
