"""Everything a user's process runs: the Client and its futures, submissions, dask graphs and
collections, results to and from workers, reattaching, secede/rejoin, progress, and the
exceptions users see. `hpc_cluster`'s own names are the public API; this package's face hands
on the Client for `from hpc_cluster.client import Client`."""

from .client import Client
from .xarray_shim import install as _install_xarray_shim

_install_xarray_shim()        # xarray's netCDF writes lock with our Lock on our clusters (xarray_shim.py)

__all__ = ["Client"]
