"""LSFCluster and HTCondorCluster: dask-jobqueue's classes for LSF and HTCondor.

Beside cluster.py rather than in it only to keep that module under ~600 lines: these are the
same kind of thing as SLURMCluster, a JobQueueCluster with its batch system and its keywords
documented. The keywords themselves are settings (config/schema.py: ncpus, mem, lsf_units,
use_stdin; disk, submit_command_extra, cancel_command_extra), so a site file and a
`jobqueue.lsf` / `jobqueue.htcondor` section give them too.
"""

from __future__ import annotations

from .cluster import JOB_PARAMETERS, JobQueueCluster


class LSFCluster(JobQueueCluster):
    __doc__ = """Workers as LSF jobs (bsub), joining one scheduler that explains their deaths.

    dask-jobqueue's LSFCluster, keyword for keyword: `project` is bsub's -P (our `account`),
    `walltime` is read as bsub -W reads it ('00:30' is half an hour, '90' is 90 minutes).
    Verified on outputs captured from public sources and on a simulator, not a real LSF (docs/lsf.md).

    Parameters
    ----------
""" + JOB_PARAMETERS + """    project : str
        Project the jobs are charged to (bsub -P)
    ncpus : int
        Slots per job (bsub -n; default: cores)
    mem : int or str
        The job's memory limit (bsub -M; default: memory)
    lsf_units : str
        The unit LSF reads -M in (LSF_UNIT_FOR_LIMITS: kb, mb, gb ...; default: read from lsf.conf, else kb)
    use_stdin : bool
        Submit with `bsub < script` (default) or `bsub script`
"""
    batch = "lsf"


class HTCondorCluster(JobQueueCluster):
    __doc__ = """Workers as HTCondor jobs (condor_submit), joining one scheduler that explains their deaths.

    dask-jobqueue's HTCondorCluster, keyword for keyword: `disk` is required (request_disk),
    `job_extra_directives` is a dict of submit-description commands (a list of 'key = value'
    strings works too), `submit_command_extra` and `cancel_command_extra` go to condor_submit and
    condor_rm. The walltime is enforced by a periodic_remove expression, which HTCondor has no
    keyword for. Verified on outputs captured from public sources and on a simulator, not a real
    HTCondor (docs/htcondor.md).

    Parameters
    ----------
""" + JOB_PARAMETERS + """    disk : str
        Disk each job asks for (request_disk), e.g. '1 GB'; required
    submit_command_extra : list of str
        Extra arguments to condor_submit, e.g. ['-name', 'schedd.example.org']
    cancel_command_extra : list of str
        Extra arguments to condor_rm (and to condor_q and condor_history)
"""
    batch = "htcondor"


__all__ = ["LSFCluster", "HTCondorCluster"]
