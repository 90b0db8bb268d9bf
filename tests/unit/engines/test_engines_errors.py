"""The exceptions a distributed client's result() raises for a task our verdicts failed
(engines/errors.py): each is distributed's KilledWorker and ours at once, says the cause, the
evidence and the fix (not "inspect worker logs"), and survives the pickling through distributed's
scheduler with its text and attributes. The error records are the ledger's own (blame.py)."""

from __future__ import annotations

import concurrent.futures
import pickle

import distributed
import pytest
from distributed.protocol import pickle as dpickle

import hpc_cluster
from hpc_cluster.engines import errors
from hpc_cluster.engines.blame import Ledger
from hpc_cluster.protocol.messages import Cause

WORKER = "tcp://10.1.2.3:40111"


def failed(key, cause: Cause, **more) -> tuple:
    """The error record of a task failed at its first charged (or walltime) final verdict."""
    record = {"id": 0, "worker": WORKER, "name": "default-3", "time": 1_700_000_000.0, "cause": cause.value,
              "blame": cause != Cause.WALLTIME, "job_id": "4242", "pool": "default", "final_at": 1_700_000_009.0,
              "text": f"the worker died: {cause.value} (staged)", "advice": f"the fix for {cause.value}",
              "evidence": ["nanny: exit signal 9, peak RSS 1.2 GiB", "accounting: job 4242 OUT_OF_MEMORY 0:125"],
              "walltime": 600.0, **more}
    ((k, error),) = Ledger(allowed_failures=0, walltime_failures=0).charge(record, {key: 12.5})
    assert k == key
    return key, error


CASES = [(Cause.MEMORY_BATCH, errors.TaskMemoryError, hpc_cluster.TaskMemoryError),
         (Cause.MEMORY_NANNY, errors.TaskMemoryError, hpc_cluster.TaskMemoryError),
         (Cause.CRASH, errors.TaskCrashedError, hpc_cluster.TaskCrashedError),
         (Cause.WALLTIME, errors.TaskWalltimeError, hpc_cluster.TaskWalltimeError)]


@pytest.mark.parametrize("cause, engine_class, our_class", CASES, ids=[c[0].value for c in CASES])
def test_each_is_distributeds_killed_worker_and_ours(cause, engine_class, our_class):
    key, error = failed(("hog", 3), cause)
    exc = errors.killed_worker(key, error, WORKER)
    assert type(exc) is engine_class
    assert isinstance(exc, distributed.KilledWorker) and isinstance(exc, our_class)
    assert isinstance(exc, hpc_cluster.KilledWorker)
    # distributed's attributes, as its KilledWorker has them
    assert exc.task == ("hog", 3) and exc.last_worker == WORKER and exc.allowed_failures == 0
    assert exc.cause == cause.value and exc.key == ("hog", 3)


@pytest.mark.parametrize("cause", [Cause.MEMORY_BATCH, Cause.CRASH], ids=["memory", "crash"])
def test_its_text_names_the_cause_the_evidence_and_the_fix(cause):
    exc = errors.killed_worker(*failed("parse-3a9c", cause), last_worker=WORKER)
    text = str(exc)
    assert text.startswith("Task 'parse-3a9c' failed: 1 worker died while running it (allowed failures: 0).")
    assert f"Cause: {cause.value}: the worker died: {cause.value} (staged)" in text
    assert "Evidence:\n  nanny: exit signal 9, peak RSS 1.2 GiB\n  accounting: job 4242 OUT_OF_MEMORY 0:125" in text
    assert f"Fix: the fix for {cause.value}" in text
    assert f"default-3 (job 4242): {cause.value}, after 12.5 s" in text
    assert "worker logs" not in text.lower() and "Attempted to run task" not in text
    assert exc.evidence == ["nanny: exit signal 9, peak RSS 1.2 GiB", "accounting: job 4242 OUT_OF_MEMORY 0:125"]
    assert exc.advice == f"the fix for {cause.value}"


def test_a_walltime_error_says_the_walltime_and_how_long_it_ran():
    exc = errors.killed_worker(*failed("long", Cause.WALLTIME), last_worker=WORKER)
    assert str(exc).startswith("Task 'long' is too long for the job's walltime (600 s): it was still running "
                               "when the job's time ran out 1 times (it had run 12 s).")


@pytest.mark.parametrize("dumps, loads", [(pickle.dumps, pickle.loads), (dpickle.dumps, dpickle.loads)],
                         ids=["pickle", "distributed.protocol.pickle"])
@pytest.mark.parametrize("cause", [Cause.MEMORY_NANNY, Cause.CRASH, Cause.WALLTIME], ids=lambda c: c.value)
def test_a_pickle_round_trip_keeps_the_class_the_text_and_the_attributes(dumps, loads, cause):
    exc = errors.killed_worker(*failed(("x", 0, 1), cause), last_worker=WORKER)
    back = loads(dumps(exc))
    assert type(back) is type(exc) and str(back) == str(exc) and back.args == exc.args
    assert (back.task, back.last_worker, back.allowed_failures) == (("x", 0, 1), WORKER, 0)
    assert (back.cause, back.evidence, back.advice, back.attempts) == (exc.cause, exc.evidence, exc.advice,
                                                                      exc.attempts)


def test_work_no_worker_will_run_fails_with_our_cancelled_error_and_the_reason():
    exc = errors.stranded(("sum", 7), "no worker is left to run it and none will be started: jobs never started")
    assert isinstance(exc, hpc_cluster.CancelledError) and isinstance(exc, concurrent.futures.CancelledError)
    back = dpickle.loads(dpickle.dumps(exc))
    assert type(back) is errors.CancelledError and str(back) == str(exc)
    assert back.key == ("sum", 7) and back.reason.endswith("jobs never started")
