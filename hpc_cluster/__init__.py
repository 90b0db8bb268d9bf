"""hpc-cluster: a task cluster on HPC batch systems that knows why a worker died."""

__version__ = "0.1.0"

from .client import Client
from .futures import Future, as_completed, wait
from .deploy.cluster import PBSCluster, SLURMCluster
from .deploy.local import LocalCluster
from .progress import progress
from .exceptions import (CancelledError, HPCClusterError, KilledWorker, LostDataError, TaskCrashedError,
                         TaskMemoryError, TaskTooLongError, TaskWalltimeError, TimeoutError)

__all__ = ["Client", "Future", "as_completed", "wait", "LocalCluster", "SLURMCluster", "PBSCluster", "CancelledError",
           "HPCClusterError", "KilledWorker", "LostDataError", "TaskCrashedError", "TaskMemoryError",
           "TaskTooLongError", "TaskWalltimeError", "TimeoutError", "progress", "__version__"]
