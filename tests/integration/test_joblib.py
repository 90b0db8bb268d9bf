"""joblib's backends of ours (hpc_cluster/client/joblib_backend.py): scikit-learn's fits, and any
joblib.Parallel, run as tasks on the workers under parallel_backend("hpc-cluster"), and under
"dask" while our Client is the current one."""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
from pathlib import Path

import joblib
import numpy as np
import pytest
from joblib import Parallel, delayed, parallel_backend, parallel_config
from sklearn.base import BaseEstimator, ClassifierMixin
from sklearn.datasets import load_iris
from sklearn.linear_model import LogisticRegression
from sklearn.model_selection import GridSearchCV

from helpers.ask import worker_pids
from helpers.funcs import pid_of, square
from helpers.wait import wait_until

pytestmark = pytest.mark.timeout(180)

GRID = {"C": [0.01, 0.1, 1.0, 10.0]}


class PidRecordingClassifier(ClassifierMixin, BaseEstimator):
    """A logistic regression that leaves a file named after the process each fit ran in."""

    def __init__(self, C=1.0, record_dir=None):
        self.C, self.record_dir = C, record_dir

    def fit(self, X, y):
        Path(self.record_dir, f"{os.getpid()}-{uuid.uuid4().hex}").touch()
        self.model_ = LogisticRegression(C=self.C, max_iter=1000).fit(X, y)
        self.classes_ = self.model_.classes_
        return self

    def predict(self, X):
        return self.model_.predict(X)


def test_grid_search_fits_run_in_the_workers_processes(client, tmp_path):
    X, y = load_iris(return_X_y=True)
    with parallel_backend("hpc-cluster"):
        search = GridSearchCV(PidRecordingClassifier(record_dir=str(tmp_path)), GRID, cv=3).fit(X, y)
    fit_pids = {int(p.name.split("-")[0]) for p in tmp_path.iterdir()}
    # 4 candidates x 3 folds, and the refit of the best one here (GridSearchCV refits in the caller).
    assert len(list(tmp_path.iterdir())) == 4 * 3 + 1
    assert os.getpid() in fit_pids and fit_pids - {os.getpid()} <= set(worker_pids(client).values())
    assert len(fit_pids - {os.getpid()}) >= 1
    local = GridSearchCV(PidRecordingClassifier(record_dir=str(tmp_path)), GRID, cv=3).fit(X, y)
    assert search.best_params_ == local.best_params_
    np.testing.assert_allclose(search.cv_results_["mean_test_score"], local.cv_results_["mean_test_score"])


def test_the_dask_name_runs_on_our_cluster_while_our_client_is_current(client):
    with parallel_backend("dask"):
        pids = Parallel()(delayed(pid_of)(i) for i in range(8))
    assert set(pids) <= set(worker_pids(client).values()) and os.getpid() not in pids
    with parallel_config("dask", client=client):
        assert Parallel()(delayed(square)(i) for i in range(5)) == [0, 1, 4, 9, 16]


def test_a_failing_call_raises_its_exception_with_the_workers_traceback(client):
    def fails_on_three(x):
        if x == 3:
            raise KeyError(f"no {x}")
        return x

    with parallel_backend("hpc-cluster"):
        with pytest.raises(KeyError, match="no 3") as info:
            Parallel()(delayed(fails_on_three)(i) for i in range(6))
    notes = "\n".join(getattr(info.value, "__notes__", []))
    assert "Remote traceback" in notes and "fails_on_three" in notes
    # The backend stays usable after the failure.
    with parallel_backend("hpc-cluster"):
        assert Parallel()(delayed(square)(i) for i in range(3)) == [0, 1, 4]


def _sum_of_squares_in_parallel(n):
    # A Parallel call inside a task: its batches go to the same cluster (the nested backend).
    return sum(Parallel()(delayed(square)(j) for j in range(n)))


def test_a_parallel_call_inside_a_task_runs_on_the_cluster_without_holding_its_thread(client):
    # 8 outer calls fill the cluster's 4 threads; their inner calls run only if the outer tasks
    # give up their slots while they wait.
    with parallel_backend("hpc-cluster"):
        out = Parallel(batch_size=1)(delayed(_sum_of_squares_in_parallel)(n) for n in range(2, 10))
    assert out == [sum(j * j for j in range(n)) for n in range(2, 10)]


class Pickled:
    """A large argument that counts how often it is pickled in this process."""

    count = 0

    def __init__(self):
        self.data = bytes(100_000)

    def __sizeof__(self):
        return len(self.data)

    def __reduce__(self):
        type(self).count += 1
        return (bytes, (self.data,))


def _length(blob, i):
    return len(blob) + i


def test_a_large_argument_travels_once_per_call_not_once_per_batch(client):
    big = Pickled()
    with parallel_backend("hpc-cluster"):
        out = Parallel(batch_size=1)(delayed(_length)(big, i) for i in range(12))
    assert out == [100_000 + i for i in range(12)]
    assert Pickled.count == 1


def test_keywords_reach_client_submit_and_unknown_ones_are_refused(client):
    with parallel_config("hpc-cluster", retries=1, priority=5):
        assert Parallel()(delayed(square)(i) for i in range(3)) == [0, 1, 4]
    with pytest.raises(TypeError, match=r"parallel_config\('hpc-cluster', colour=...\).*retries"):
        with parallel_config("hpc-cluster", colour="red"):
            pass


def test_without_a_client_the_error_says_to_make_one(cluster):
    # No Client of ours is current here (the `client` fixture closed its own), and no distributed one.
    with pytest.raises(ValueError, match=r"(?s)needs a Client.*hpc_cluster\.Client\(cluster\)"):
        with parallel_backend("hpc-cluster"):
            pass
    with pytest.raises(ValueError, match=r"(?s)parallel_config\('dask'\) needs a current Client.*hpc_cluster\.Client"):
        with parallel_backend("dask"):
            pass


def _modules_after(code: str) -> list[str]:
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    return out.stdout.split()


def test_importing_hpc_cluster_loads_neither_joblib_nor_the_client_and_joblib_finds_our_backends():
    show = ("import sys; from joblib.parallel import BACKENDS; "
            "print(*sorted(n for n in ('hpc-cluster', 'dask') if n in BACKENDS), "
            "'client-loaded' if 'hpc_cluster.client' in sys.modules else 'client-not-loaded')")
    # hpc_cluster first: joblib is not loaded by it; importing joblib afterwards registers ours.
    assert _modules_after("import sys, hpc_cluster; assert 'joblib' not in sys.modules; import joblib; "
                          + show) == ["dask", "hpc-cluster", "client-not-loaded"]
    # joblib first: registered when hpc_cluster is imported.
    assert _modules_after("import joblib, hpc_cluster; " + show) == ["dask", "hpc-cluster", "client-not-loaded"]
    # joblib loaded through the hook is joblib as it would be: its own loader.
    assert _modules_after("import hpc_cluster, joblib; print(type(joblib.__spec__.loader).__name__, "
                          "type(joblib.__loader__).__name__)") == ["SourceFileLoader", "SourceFileLoader"]


def test_joblib_is_registered_in_this_process_too():
    assert {"hpc-cluster", "dask"} <= set(joblib.parallel.BACKENDS)


def _fails_first_else_sleeps(i):
    import time
    if i == 0:
        raise RuntimeError("the first batch fails")
    time.sleep(60)


def test_when_a_batch_fails_the_rest_of_the_call_is_cancelled_on_the_cluster(client):
    with parallel_backend("hpc-cluster"):
        with pytest.raises(RuntimeError, match="the first batch fails"):
            Parallel(batch_size=1)(delayed(_fails_first_else_sleeps)(i) for i in range(4))
    # Long before the sleeping batches could end, the workers have nothing of this call left.
    wait_until(lambda: not any(w["processing"] for w in client.scheduler_info()["workers"].values()), 20,
               "the sleeping batches to be cancelled")
