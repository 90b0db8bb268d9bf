"""Our pytest plugin for dask-jobqueue's tests (loaded with `-p djq_plugin` in the inner runs).

It gives their test modules what their repository's conftest.py gives them, with the same
semantics, but our classes (their conftest is not in the sdist and we copy none of it):

* `-E NAME` and the `env(NAME)` / `xfail_env({NAME: reason})` markers: without -E only
  tests marked for no batch system run; with -E NAME only tests marked NAME run.
* `loop` (and `loop_in_thread`) from distributed.utils_test, with `cleanup` overridden.
* `Cluster`: every batch system's class, for tests that need no batch system to be up;
  `EnvSpecificCluster`: the class of the -E system only. Systems we have no adapter for
  (Moab, OAR; and their LocalCluster) are placeholders, so those cases show as skipped,
  with the reason. As there, HTCondorCluster's cases run with `jobqueue.htcondor.disk` set.

Besides, it marks each test named in docs/migrating-from-dask-jobqueue.md's table as a
strict expected failure (a test there that passes fails the run and says so), and it makes
`import dask_jobqueue` fail, so no test can run their classes instead of ours.
"""

from __future__ import annotations

import copy
import sys

import dask
import distributed.utils_test
import pytest
from distributed.utils_test import loop, loop_in_thread  # noqa: F401  (fixtures their tests use)

from djq_placeholders import Placeholder, placeholder
from djq_suite import IDS
from djq_table import DOC, TABLE
from helpers.peers import known_failures, row_for
from hpc_cluster import HTCondorCluster, LSFCluster, PBSCluster, SGECluster, SLURMCluster

# dask-jobqueue is installed in the venv (the benchmarks run it side by side with ours); a
# None entry makes any import of it raise ImportError here.
sys.modules["dask_jobqueue"] = None

# The class each -E environment tests, as their conftest's `all_envs`.
ENVS = {
    None: placeholder("dask_jobqueue.local.LocalCluster"),
    "pbs": PBSCluster,
    "moab": placeholder("dask_jobqueue.MoabCluster"),
    "slurm": SLURMCluster,
    "sge": SGECluster,
    "lsf": LSFCluster,
    "oar": placeholder("dask_jobqueue.OARCluster"),
    "htcondor": HTCondorCluster,
}


def pytest_addoption(parser):
    parser.addoption("-E", action="store", metavar="NAME", help="only run tests matching the environment NAME.")


def pytest_configure(config):
    config.addinivalue_line("markers", "env(NAME): only run test if environment NAME matches")
    config.addinivalue_line("markers", "xfail_env(NAME): known failure for environment NAME")


def pytest_collection_modifyitems(config, items):
    table = known_failures(TABLE)
    for item in items:
        row = row_for(table, IDS.from_nodeid(item.nodeid))
        if row is not None:
            # First in the list, so it wins over an xfail_env mark added at setup.
            item.add_marker(pytest.mark.xfail(reason=f"{DOC.name}: {row.reason}", strict=True), append=False)


def pytest_runtest_setup(item):
    env = item.config.getoption("-E")
    envnames = [name for mark in item.iter_markers(name="env")
                for name in (mark.args[0] if isinstance(mark.args[0], list) else [mark.args[0]])]
    # Their condition, `None not in envnames and (env is None and envnames) or (env is not
    # None and env not in envnames)`, spelled out: without -E a test marked only for named
    # environments is skipped (env(None) marks one for the run without -E); with -E NAME
    # every test not marked NAME is.
    if env is None:
        skip = bool(envnames) and None not in envnames
    else:
        skip = env not in envnames
    if skip:
        pytest.skip(f"test requires env in {envnames!r}")
    xfail = {}
    for mark in item.iter_markers(name="xfail_env"):
        xfail.update(mark.args[0])
    if env in xfail:
        item.add_marker(pytest.mark.xfail(reason=xfail[env]))


@pytest.fixture(name="cleanup")     # replaces distributed.utils_test.cleanup by its name
def no_distributed_cleanup():
    """As in their conftest, distributed's `cleanup` (which `loop` asks for) is switched off:
    it kills every child process when a test starts, fails the test for any thread or child
    process still alive when it ends, and clears distributed's own registries. dask-jobqueue
    does not run its tests under it, so the tests must not be judged by it here either."""
    yield


def reset_config():
    """distributed.utils_test.reset_config, but keeping the defaults registered since.

    The `loop` fixture resets dask's config to a copy taken when distributed.utils_test was
    imported, which drops the jobqueue.* defaults a library registers after that;
    dask-jobqueue's conftest re-registers its jobqueue.yaml after the reset. We re-apply
    every default registered with dask (ours included, however they are registered), so a
    test with `loop` sees the same configuration as one without.
    """
    dask.config.config.clear()
    dask.config.config.update(copy.deepcopy(distributed.utils_test.original_config))
    for defaults in dask.config.defaults:
        dask.config.update(dask.config.config, copy.deepcopy(defaults), priority="old")


distributed.utils_test.reset_config = reset_config


def _usable(cls):
    if isinstance(cls, Placeholder):
        pytest.skip(cls.reason)
    if cls is HTCondorCluster:
        # As their fixtures do: HTCondor jobs need a disk request, which no other class takes.
        # Theirs leave it set for later tests; ours undo it when the test ends.
        with dask.config.set({"jobqueue.htcondor.disk": "1GB"}):
            yield cls
    else:
        yield cls


@pytest.fixture(params=[pytest.param(cls, marks=[pytest.mark.env(env)]) for env, cls in ENVS.items()])
def EnvSpecificCluster(request):  # noqa: N802  (their fixture's name)
    """The cluster class of the environment given with -E (placeholders skip)."""
    yield from _usable(request.param)


@pytest.fixture(params=list(ENVS.values()))
def Cluster(request):  # noqa: N802  (their fixture's name)
    """Each cluster class, for tests that need no batch system (placeholders skip)."""
    yield from _usable(request.param)
