"""The exceptions users catch: named as they import them, whatever room they live in."""

import pickle
import traceback

import pytest

import hpc_cluster

PUBLIC = ["HPCClusterError", "KilledWorker", "TaskMemoryError", "TaskCrashedError", "TaskWalltimeError",
          "TaskTooLongError", "NoPoolError", "LostDataError", "CancelledError", "TimeoutError"]


@pytest.mark.parametrize("name", PUBLIC)
def test_a_public_exception_is_shown_and_pickled_by_its_public_name(name):
    cls = getattr(hpc_cluster, name)
    assert f"{cls.__module__}.{cls.__qualname__}" == f"hpc_cluster.{name}"
    assert pickle.loads(pickle.dumps(cls)) is cls
    line = traceback.format_exception_only(cls, cls.__new__(cls))[0]
    assert line.startswith(f"hpc_cluster.{name}")
