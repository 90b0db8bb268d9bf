"""The libraries that need distributed itself, unchanged, on workers hpc-cluster started as SLURM
jobs with engine="distributed" (issue 32, point 7): xgboost.dask, lightgbm.dask, joblib's dask
backend under scikit-learn's GridSearchCV, dask-ml's GridSearchCV, optuna's DaskStorage, xarray's
to_netcdf of dask-backed data, and a dataframe shuffle with distributed's P2P method.

One cluster for the module: 2 SLURM jobs of 2 cores, each running 2 single-threaded workers
(why single-threaded: the xarray test). Every test checks the library's answer (an accuracy above
chance, the best parameters, the trials stored, the file read back, the shuffled frame) and that
the work ran on those workers: distributed's task stream names the tasks each worker ran, and the
workers are known by the SLURM job they run in, read on the workers themselves (SLURM_JOB_ID) and
matched against the jobs the cluster submitted.
"""

from __future__ import annotations

import contextlib
import re
import uuid
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest

import distributed
from dask.utils import key_split
from distributed import Client, get_task_stream

from helpers.by_value import by_value
from helpers.slurm import squeue_ids
from helpers.wait import wait_until

from hpc_cluster.deploy.cluster import SLURMCluster

pytestmark = pytest.mark.slurm


@dataclass
class Deployed:
    cluster: SLURMCluster
    client: Client
    jobs: dict          # worker address -> the SLURM job id the worker read in its own environment
    tmp: Path


def slurm_job() -> str | None:
    import os
    return os.environ.get("SLURM_JOB_ID")


slurm_job = by_value(slurm_job)     # the workers cannot import this module (helpers/by_value.py)


@pytest.fixture(scope="module")
def libs_cluster(slurm_cluster, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("dlibs")
    name = f"dlibs-{uuid.uuid4().hex[:4]}"
    with SLURMCluster(cores=2, processes=2, memory="3GB", walltime="00:20:00", engine="distributed", name=name,
                      job_name=name, log_directory=str(tmp / "logs")) as cluster, Client(cluster) as client:
        cluster.scale(4)                        # 2 jobs of 2 workers
        client.wait_for_workers(4, timeout=180)
        jobs = client.run(slurm_job)
        submitted = {str(j["job_id"]) for j in cluster.status_table()["jobs"]}
        assert len(jobs) == 4 and set(jobs.values()) == submitted and len(submitted) == 2, (jobs, submitted)
        assert cluster.status == "running"     # distributed's Client awaits the started cluster: no relaunch
        yield Deployed(cluster, client, jobs, tmp)
    wait_until(lambda: not submitted & squeue_ids(), 120, "the cluster's jobs to leave squeue")


@contextlib.contextmanager
def ran_on_workers(d: Deployed, *names: str):
    """Record distributed's task stream while the block runs; then assert that tasks named
    `names` (dask's key_split) ran, all on the cluster's SLURM workers. Yields the records."""
    records: list = []
    with get_task_stream(d.client) as stream:
        yield records
    records.extend(stream.data)
    ran = {key_split(r["key"]) for r in records}
    for name in names:
        where = {r["worker"] for r in records if key_split(r["key"]) == name}
        assert where, f"no {name!r} task in the task stream; it had {sorted(ran)}"
        assert where <= d.jobs.keys(), f"{name} ran on {where}, not on the SLURM workers {d.jobs}"


def separable(n: int = 400, seed: int = 0):
    """Two well-separated classes (class_sep=2): any working classifier scores far above chance."""
    from sklearn.datasets import make_classification
    return make_classification(n_samples=n, n_features=6, n_informative=4, n_redundant=0, class_sep=2.0,
                               random_state=seed)


def xor(n: int = 300, seed: int = 0):
    """y = sign(x0) xor sign(x1): a depth-1 tree cannot do better than chance, a deeper one can."""
    rng = np.random.default_rng(seed)
    X = rng.uniform(-1, 1, size=(n, 3))
    return X, ((X[:, 0] > 0) ^ (X[:, 1] > 0)).astype(int)


def spread(d: Deployed, X, y, parts: int = 8):
    """X and y as dask arrays whose parts are held on every worker in turn (scattered there, not
    left to where the scheduler puts them): xgboost and lightgbm train on each worker that holds
    parts of the data, and only there."""
    import dask.array as da
    workers = sorted(d.jobs)
    xs, ys = [], []
    for i, (xc, yc) in enumerate(zip(np.array_split(X, parts), np.array_split(y, parts))):
        fx, fy = d.client.scatter([xc, yc], workers=[workers[i % len(workers)]])
        xs.append(da.from_delayed(fx, xc.shape, dtype=xc.dtype))
        ys.append(da.from_delayed(fy, yc.shape, dtype=yc.dtype))
    return da.concatenate(xs), da.concatenate(ys)


def workers_that_ran(records: list, name: str) -> set:
    return {r["worker"] for r in records if key_split(r["key"]) == name}


def test_xgboost_dask_classifier_trains_on_the_workers(libs_cluster):
    import xgboost.dask as xgb_dask
    X, y = separable()
    dX, dy = spread(libs_cluster, X, y)
    # xgboost 3 trains in one task per worker (map_worker_partitions' `fn`), its tracker on the scheduler.
    with ran_on_workers(libs_cluster, "fn") as records:
        clf = xgb_dask.DaskXGBClassifier(n_estimators=20, max_depth=3, tree_method="hist")
        clf.client = libs_cluster.client
        clf.fit(dX, dy)
        predicted = clf.predict(dX).compute()
    assert (predicted == y).mean() > 0.9
    assert workers_that_ran(records, "fn") == libs_cluster.jobs.keys()      # one training group of all four


def test_lightgbm_dask_classifier_trains_on_the_workers(libs_cluster):
    import lightgbm.dask as lgb
    X, y = separable()
    dX, dy = spread(libs_cluster, X, y)
    with ran_on_workers(libs_cluster, "train_part") as records:
        clf = lgb.DaskLGBMClassifier(client=libs_cluster.client, n_estimators=20, num_leaves=7, min_child_samples=5,
                                     verbose=-1)
        clf.fit(dX, dy)
        predicted = clf.predict(dX).compute()
    assert (predicted == y).mean() > 0.9
    assert workers_that_ran(records, "train_part") == libs_cluster.jobs.keys()    # its network spans all four


def test_joblib_dask_backend_runs_scikit_learn_grid_search_on_the_workers(libs_cluster):
    import joblib
    from sklearn.model_selection import GridSearchCV
    from sklearn.tree import DecisionTreeClassifier
    X, y = xor()
    search = GridSearchCV(DecisionTreeClassifier(random_state=0), {"max_depth": [1, 6]}, cv=3, n_jobs=-1)
    with ran_on_workers(libs_cluster) as records, joblib.parallel_backend("dask"):
        search.fit(X, y)
    assert search.best_params_ == {"max_depth": 6}
    assert search.best_score_ > 0.75
    # joblib's dask backend names each task after its batch ("batch_of__fit_and_score_N_calls"):
    # the 6 fits (2 candidates x 3 folds) all ran as tasks, on the cluster's workers.
    batches = [r for r in records if key_split(r["key"]).startswith("batch_of__fit_and_score_")]
    assert sum(int(re.search(r"_(\d+)_calls", key_split(r["key"])).group(1)) for r in batches) == 6, \
        sorted({key_split(r["key"]) for r in records})
    assert {r["worker"] for r in batches} <= libs_cluster.jobs.keys()


def test_dask_ml_grid_search_on_the_workers(libs_cluster):
    from dask_ml import model_selection
    from sklearn.tree import DecisionTreeClassifier
    X, y = xor()
    search = model_selection.GridSearchCV(DecisionTreeClassifier(random_state=0), {"max_depth": [1, 6]}, cv=3)
    # dask-ml's own graph: the folds split and each candidate fitted and scored, as tasks.
    with ran_on_workers(libs_cluster, "cv-split", "decisiontreeclassifier-fit-score"):
        search.fit(X, y)
    assert search.best_params_ == {"max_depth": 6}
    assert search.best_score_ > 0.75


def objective(trial):
    import os
    x = trial.suggest_int("x", 0, 9)
    trial.set_user_attr("slurm_job", os.environ.get("SLURM_JOB_ID"))     # where the trial ran
    return (x - 2) ** 2


objective = by_value(objective)


def test_optuna_dask_storage_shares_trials_across_the_workers(libs_cluster):
    import optuna
    # optuna 5 keeps its integrations in optuna-integration (optuna.integration.dask is deprecated).
    from optuna_integration.dask import DaskStorage
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    storage = DaskStorage(client=libs_cluster.client)
    # The grid sampler reads which points the storage already holds: it visits all 10 before any
    # repeat (and stops the study once all are visited), so the best is x=2 whatever the order.
    study = optuna.create_study(storage=storage, sampler=optuna.samplers.GridSampler({"x": list(range(10))}))
    with ran_on_workers(libs_cluster, "optimize"):
        futures = [libs_cluster.client.submit(study.optimize, objective, n_trials=5, pure=False) for _ in range(4)]
        distributed.wait(futures)
        [f.result() for f in futures]
    trials = study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.COMPLETE,))
    assert len(trials) >= 10, len(trials)
    assert sorted(t.number for t in study.trials) == list(range(len(study.trials)))   # one numbering: one storage
    assert {t.params["x"] for t in trials} == set(range(10))
    assert study.best_params == {"x": 2} and study.best_value == 0
    assert {t.user_attrs["slurm_job"] for t in trials} <= set(libs_cluster.jobs.values())
    # The trials live on distributed's scheduler (DaskStorage's extension), not in this process.
    held = libs_cluster.client.run_on_scheduler(count_stored_trials, study_name=study.study_name)
    assert held == len(study.trials)


def count_stored_trials(dask_scheduler, study_name):
    ext = dask_scheduler.extensions["optuna"]
    storage = next(iter(ext.storages.values()))
    return len(storage.get_all_trials(storage.get_study_id_from_name(study_name), deepcopy=False))


count_stored_trials = by_value(count_stored_trials)


def test_xarray_to_netcdf_of_dask_data_written_by_the_workers(libs_cluster):
    # On workers of several threads this write stalls for distributed's lock lease (30 s) or hangs,
    # on any distributed cluster (a LocalCluster too): xarray's CombinedLock takes the file's
    # distributed.Lock and its in-process netCDF lock in the order of their id(), and each task
    # unpickles a new distributed.Lock, so two tasks of one worker can take them in opposite orders
    # and each wait on the other's. Single-threaded workers (this module's) write as they should.
    import dask.array as da
    import xarray as xr
    values = da.arange(40 * 30, chunks=300, dtype="float64").reshape(40, 30)
    ds = xr.Dataset({"t": (("x", "y"), values)}, coords={"x": np.arange(40), "y": np.arange(30)})
    path = libs_cluster.tmp / f"written-by-workers-{uuid.uuid4().hex[:6]}.nc"
    with ran_on_workers(libs_cluster) as records:
        ds.to_netcdf(path, engine="netcdf4")
    with xr.open_dataset(path, engine="netcdf4") as back:
        xr.testing.assert_equal(back.load(), ds.compute())
    # dask.array.store's tasks (`...store-map`, fused with the chunk's computation): each of the 4
    # chunks written by the worker that computed it.
    writes = [r for r in records if key_split(r["key"]).endswith("store-map")]
    assert len(writes) >= values.npartitions, sorted({key_split(r["key"]) for r in records})
    assert {r["worker"] for r in writes} <= libs_cluster.jobs.keys()


def test_dataframe_p2p_shuffle_on_the_workers(libs_cluster):
    import dask
    import dask.dataframe as dd
    import pandas as pd
    frame = pd.DataFrame({"k": np.arange(1000) % 37, "v": np.arange(1000)})
    shuffled = dd.from_pandas(frame, npartitions=8).shuffle("k", npartitions=5, shuffle_method="p2p")
    # shuffle-transfer is the P2P shuffle's own task (the task-based one has shuffle-group/split).
    with ran_on_workers(libs_cluster, "shuffle-transfer"):
        parts = dask.compute(*shuffled.to_delayed())
    whole = pd.concat(parts).sort_values("v").reset_index(drop=True)
    pd.testing.assert_frame_equal(whole, frame)
    # A shuffle on k: every k in exactly one partition.
    owners = {}
    for i, part in enumerate(parts):
        for k in set(part["k"]):
            assert owners.setdefault(k, i) == i, f"k={k} in partitions {owners[k]} and {i}"
    assert len(owners) == 37
