"""A future cancelled by its client is cancelled at once, and stays so until retried
(futures.FutureStates.cancel_now, retried), without a cluster."""

import threading

from hpc_cluster.client.futures import FutureStates


def test_a_cancel_here_is_at_once_and_a_result_on_its_way_does_not_undo_it():
    lock = threading.RLock()
    states = FutureStates(lock)
    st = states.state("k")
    scheduled = []
    states.cancel_now(["k", "unknown"], "by the user", lambda fn, arg: scheduled.append((fn, arg)))
    assert st.status == "cancelled" and st.error["text"] == "by the user"
    assert "unknown" not in states and len(scheduled) == 1          # one loop callback for them all
    with lock:
        st.settle("finished", None)             # the scheduler's key-in-memory, sent before our cancel
    assert st.status == "cancelled"
    with lock:
        st.settle("cancelled", {"kind": "cancelled", "text": "cancelled by the client"})
    assert st.error["text"] == "cancelled by the client"               # the scheduler's word replaces ours
    states.retried("k")
    assert st.status == "pending" and st.error is None
    with lock:
        st.settle("finished", None)
    assert st.status == "finished"
    states.close()


def test_callbacks_of_futures_cancelled_here_run():
    states = FutureStates(threading.RLock())
    ran = threading.Event()
    states.add_callback("k", ran.set)            # added while pending, as on the loop thread
    states.cancel_now(["k"], "by the user", lambda fn, arg: fn(arg))
    assert ran.wait(10)
    states.retried("never-held")                 # a key it does not hold: nothing to do
    assert "never-held" not in states
    states.close()
