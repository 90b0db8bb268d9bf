"""LocalCluster.adapt's decisions and settings (deploy/local/adapt.py), without a cluster."""

import math
from types import SimpleNamespace

import pytest

from hpc_cluster.deploy.local.adapt import AdaptSettings, adapt_settings, least_busy, wanted_workers

SIZES = SimpleNamespace(threads_per_worker=2, memory_limit=4 << 30)      # what adapt_settings reads


def test_workers_to_finish_the_work_in_the_target_duration_within_the_bounds():
    s = AdaptSettings(minimum=1, maximum=4, target_duration=5.0)
    assert wanted_workers(s, workload=0.0, threads_per_worker=2, holding=False) == 1      # the minimum
    assert wanted_workers(s, workload=20.0, threads_per_worker=2, holding=False) == 2     # 20 s / (5 s x 2)
    assert wanted_workers(s, workload=21.0, threads_per_worker=2, holding=False) == 3
    assert wanted_workers(s, workload=1e6, threads_per_worker=2, holding=False) == 4      # the maximum
    unbounded = AdaptSettings()
    assert wanted_workers(unbounded, workload=0.0, threads_per_worker=1, holding=False) == 0
    assert wanted_workers(unbounded, workload=1e3, threads_per_worker=1, holding=False) == 200


def test_one_worker_stays_while_results_are_held_unless_the_maximum_says_none():
    assert wanted_workers(AdaptSettings(), workload=0.0, threads_per_worker=1, holding=True) == 1
    assert wanted_workers(AdaptSettings(maximum=0), workload=0.0, threads_per_worker=1, holding=True) == 0


def test_the_least_busy_workers_retire_first():
    rows = [{"name": "w0", "processing": 2, "stored": 0}, {"name": "w1", "processing": 0, "stored": 5},
            {"name": "w2", "processing": 0, "stored": 1}]
    assert [r["name"] for r in least_busy(rows, 2)] == ["w2", "w1"]


def test_settings_take_distributeds_keywords_and_count_cores_and_memory_in_workers():
    s = adapt_settings(SIZES, minimum_cores=3, maximum_memory="16GiB", interval="500ms", wait_count=2,
                       target_duration="10s")
    assert s == AdaptSettings(minimum=2, maximum=4, interval=0.5, wait_count=2, target_duration=10.0)
    assert adapt_settings(SIZES).maximum == math.inf and adapt_settings(SIZES, maximum=None).maximum == math.inf


@pytest.mark.parametrize("kwargs, message", [
    ({"minimum": 3, "maximum": 2}, r"minimum 3 and maximum 2"),
    ({"wait_count": 0}, r"wait_count=0"),
    ({"interval": "soon"}, r"interval='soon'"),
    ({"Adaptive": object}, r"drop Adaptive="),
    ({"worker_key": len}, r"'worker_key'.*it takes minimum"),
])
def test_bad_settings_say_what_to_change(kwargs, message):
    with pytest.raises((ValueError, TypeError), match=message):
        adapt_settings(SIZES, **kwargs)


def test_memory_bounds_need_workers_with_a_memory_limit():
    with pytest.raises(ValueError, match="no memory_limit"):
        adapt_settings(SimpleNamespace(threads_per_worker=1, memory_limit=0), maximum_memory="8GB")


class _Proc:
    def poll(self):
        return None


class _Scheduler:
    """What adapt_once asks of a client: the scheduler's workload reply, and the drains sent."""

    def __init__(self, cluster):
        self.cluster, self.workload, self.drained, self.timeout = cluster, 0.0, [], 10
        self._lt = SimpleNamespace(run=lambda request, timeout: request)

    def _request(self, msg):
        rows = [{"name": n, "address": f"tcp://{n}", "processing": 0, "stored": 0} for n in self.cluster.workers]
        return {"workload": self.workload, "workers": rows}

    def _send(self, msg):
        self.drained.extend(msg["workers"])


def test_a_shrink_goes_only_as_far_as_every_agreeing_decision_wanted():
    from hpc_cluster.deploy.local.adapt import LocalAdaptive
    cluster = SimpleNamespace(workers={f"w{i}": _Proc() for i in range(3)}, threads_per_worker=1,
                              _start_worker=lambda: None, _stop_worker=lambda name: None)
    adaptive = object.__new__(LocalAdaptive)         # its decisions alone, no thread
    settings = AdaptSettings(minimum=0, maximum=3, wait_count=3, target_duration=5.0)
    adaptive.cluster, adaptive.settings, adaptive.wait_count = cluster, settings, settings.wait_count
    adaptive.minimum, adaptive.maximum, adaptive.state = settings.minimum, settings.maximum, "running"
    adaptive.log, adaptive._retiring = [], {}
    adaptive._lower, adaptive._lower_most, adaptive._stopping = 0, 0, SimpleNamespace(is_set=lambda: False)
    client = _Scheduler(cluster)
    # The last tasks finishing: 4 s, then 1 s, then no work left (each wants 1, 1, then 0 workers).
    for workload in (4.0, 1.0, 0.0):
        client.workload = workload
        adaptive.adapt_once(client)
    assert len(client.drained) == 2, client.drained        # one worker stays for what comes next
    assert adaptive.log[-1][1] == {"status": "down", "n": 1}
