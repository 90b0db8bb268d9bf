"""xarray's netCDF writes of dask-backed data on our cluster (issue 31, point 8): xarray takes our
Client for a distributed-style scheduler (client/xarray_shim.py), so each chunk is written by the
worker that computed it, under our Lock, whichever of xarray and hpc_cluster was imported first."""

from __future__ import annotations

import os
import pickle
import subprocess
import sys
import textwrap
import threading

import dask
import numpy as np
import pytest

xr = pytest.importorskip("xarray")
pytest.importorskip("netCDF4")
pytest.importorskip("scipy")

from xarray.backends.locks import HDF5_LOCK, CombinedLock, get_dask_scheduler, get_write_lock  # noqa: E402

from hpc_cluster import Lock  # noqa: E402
from hpc_cluster.protocol.clusterfile import SECRET_ENV  # noqa: E402


def dataset() -> "xr.Dataset":
    rng = np.random.default_rng(0)
    return xr.Dataset({"t": (("time", "x"), rng.random((12, 10))), "n": (("time",), np.arange(12))},
                      coords={"time": np.arange(12), "x": np.linspace(0, 1, 10)}).chunk({"time": 3, "x": 5})


def test_xarray_takes_our_client_for_a_distributed_scheduler(client):
    assert get_dask_scheduler() == "distributed"
    assert isinstance(get_write_lock("some.nc"), Lock)
    with dask.config.set(scheduler="threads"):
        assert get_dask_scheduler() == "threaded"
        assert isinstance(get_write_lock("some.nc"), type(threading.Lock()))


@pytest.mark.parametrize("compute", [True, False])
def test_to_netcdf_of_dask_backed_data_is_written_by_the_workers(client, tmp_path, compute):
    original = dataset()
    path = str(tmp_path / "out.nc")
    written = original.to_netcdf(path, engine="netcdf4", compute=compute)
    if not compute:
        written.compute()
    with xr.open_dataset(path, engine="netcdf4", chunks={"time": 4}) as restored:
        assert isinstance(restored.t.data, dask.array.Array)
        xr.testing.assert_identical(restored.compute(), original.compute())


def test_scipy_writes_as_on_distributed(client, tmp_path):
    """xarray refuses the scipy engine for dask-backed data on any multi-process scheduler (its
    store cannot close the file after each write); loaded data it writes, and reads back in chunks."""
    original = dataset()
    with pytest.raises(NotImplementedError, match="scipy backend is not currently supported with dask's distributed"):
        original.to_netcdf(str(tmp_path / "refused.nc"), engine="scipy")
    path = str(tmp_path / "loaded.nc")
    original.load().to_netcdf(path, engine="scipy")
    with xr.open_dataset(path, engine="scipy", chunks={"time": 4}) as restored:
        assert restored.t.sum().compute() == pytest.approx(float(original.t.sum()))


def locked_inc(x, lock):
    with lock:
        return x + 1


def test_xarrays_locks_and_ours_combined_travel_to_tasks(client):
    """xarray's test_serializable_locks, with a client of ours (theirs is an async gen_cluster test)."""
    for lock in (HDF5_LOCK, Lock(), Lock("filename.nc"), CombinedLock([HDF5_LOCK]),
                 CombinedLock([HDF5_LOCK, Lock("filename.nc")])):
        assert client.gather(client.map(locked_inc, range(10), lock=lock)) == list(range(1, 11))
        assert type(pickle.loads(pickle.dumps(lock))) is type(lock)
    # Copies of one Lock unpickled in a process are one object, so CombinedLock, which orders its
    # locks by id(), takes them in one order in every task of a worker (else two tasks deadlock).
    lock = Lock("one-per-process")
    assert pickle.loads(pickle.dumps(lock)) is pickle.loads(pickle.dumps(lock))


WRITE = textwrap.dedent("""\
    import os, sys
    {first}
    {second}
    from xarray.backends.locks import get_write_lock
    with Client(sys.argv[1], set_as_default=True) as client:
        ds = xr.Dataset({{"a": (("x", "y"), np.arange(40.0).reshape(8, 5))}}).chunk({{"x": 2}})
        ds.to_netcdf(sys.argv[2], engine="netcdf4")
        with xr.open_dataset(sys.argv[2]) as back:
            assert float(back.a.sum()) == 780.0
        print(type(get_write_lock(sys.argv[2])).__module__)
""")


@pytest.mark.parametrize("xarray_first", [True, False], ids=["xarray-imported-first", "hpc_cluster-imported-first"])
def test_the_shim_applies_whichever_is_imported_first(cluster, tmp_path, xarray_first):
    imports = ["import numpy as np, xarray as xr", "from hpc_cluster import Client"]
    script = WRITE.format(first=imports[0 if xarray_first else 1], second=imports[1 if xarray_first else 0])
    env = dict(os.environ, **{SECRET_ENV: cluster.secret.hex()})
    proc = subprocess.run([sys.executable, "-c", script, cluster.scheduler_address, str(tmp_path / "w.nc")],
                          capture_output=True, text=True, timeout=120, env=env, stdin=subprocess.DEVNULL)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.split()[-1] == "hpc_cluster.client.coordination"
