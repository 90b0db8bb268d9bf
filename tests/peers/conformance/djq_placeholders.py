"""Stand-ins for the dask-jobqueue names hpc-cluster does not provide.

The rewritten test modules import these in place of MoabCluster, OARCluster, SGEJob, the
internal Job class and so on (SLURM, PBS, SGE, LSF and HTCondor clusters are ours). Importing one costs nothing, so a file that also tests SLURMCluster is
still collected; *using* one (calling it, reading a public attribute, subclassing it and calling
the subclass) skips that test with the reason below. Identity and issubclass checks
(`Cluster is LocalCluster`, `issubclass(Cluster, LocalCluster)`) work as on any class and
are simply False for our classes.
"""

from __future__ import annotations

import pytest

_NO_ADAPTER = "{name}: hpc-cluster has no {system} adapter yet"
_JOB_CLASS = ("dask-jobqueue's internal Job class ({name}): no equivalent (we deploy with adapters, "
              "not Job objects)")

REASONS = {
    "MoabCluster": _NO_ADAPTER.format(name="MoabCluster", system="Moab"),
    "OARCluster": _NO_ADAPTER.format(name="OARCluster", system="OAR"),
    "LocalCluster": ("dask_jobqueue.local.LocalCluster (jobs as local processes, dask-jobqueue's "
                     "stand-in for a batch system): no equivalent (hpc_cluster.LocalCluster is "
                     "distributed's kind, not a job queue)"),
    "SLURMRunner": "SLURMRunner: hpc-cluster has no runner (starting a cluster inside one allocation)",
}


# The private methods of dask-jobqueue's Job class their tests call on the class itself
# (`Job._call(["condor_q", "-batch"])` in test_htcondor.py): a use like a public one.
JOB_PRIVATE_API = {"_call", "_submit_job", "_close_job", "_job_id_from_submit_output"}


class Placeholder(type):
    """Metaclass of the stand-ins: calling one or reading a public attribute (or one of
    JOB_PRIVATE_API) skips the test."""

    def __call__(cls, *args, **kwargs):
        pytest.skip(cls.reason)

    def __getattr__(cls, attr):
        # Python and pytest probe objects for dunders and private names (__wrapped__,
        # _pytestfixturefunction ...) while collecting; those get the usual answer, so only
        # a test's own use of the stand-in skips it.
        if attr.startswith("_") and attr not in JOB_PRIVATE_API:
            raise AttributeError(attr)
        pytest.skip(cls.reason)


_made: dict[str, type] = {}


def _reason(name: str, qualified: str) -> str:
    if name in REASONS:
        return REASONS[name]
    if name == "Job" or name.endswith("Job"):
        return _JOB_CLASS.format(name=name)
    return f"{qualified}: hpc-cluster provides no equivalent"


def placeholder(qualified: str) -> type:
    """The stand-in for `qualified` (e.g. "dask_jobqueue.sge.SGEJob"), one object per name,
    so `dask_jobqueue.MoabCluster` and `dask_jobqueue.moab.MoabCluster` are the same one
    here as they are there."""
    name = qualified.rsplit(".", 1)[-1]
    if name not in _made:
        _made[name] = Placeholder(name, (), {"reason": _reason(name, qualified),
                                             "__module__": "djq_placeholders",
                                             "__doc__": f"Stand-in for {qualified}."})
    return _made[name]
