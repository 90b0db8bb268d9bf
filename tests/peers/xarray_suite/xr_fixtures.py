"""What xarray's test_distributed.py imports from distributed.utils_test, made of ours
(xr_fetch.switch_xarray_imports points its import here): the distributed suite's fixtures (its
dist_plugin.py: `loop`, `loop_in_thread`, `cleanup`, `cluster_fixture`, `client`, on an hpc_cluster
LocalCluster) and `cluster()` (its distributed_switched.utils_test). `gen_cluster` stays distributed's: the tests
using it drive distributed's own Scheduler and Worker in-process and are deselected by that plugin,
out of scope here as in the distributed suite."""

from __future__ import annotations

from dist_plugin import cleanup, client, cluster_fixture, loop, loop_in_thread  # noqa: F401
from distributed_switched.utils_test import cluster, gen_cluster  # noqa: F401
