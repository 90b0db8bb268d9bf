"""Workers' memory over their whole life and the record a death keeps of it (issue 17):
the bounded timeline, max-preserving downsampling, and the state machine's death record,
driven directly (no sockets, no clocks)."""

from __future__ import annotations

import json

import pytest

from hpc_cluster.memseries import MemoryTimeline, downsample, merge
from hpc_cluster.scheduler.journal import Recorder, snapshot
from hpc_cluster.scheduler.state import SchedulerState
from hpc_cluster.scheduler.state.timeline import (CAP, JOURNAL_SAMPLES, KEEP_FULL, MAX_SAMPLES, MAX_STARTS, OLD_SAMPLES,
                                            journal_death)
from helpers.tasks import task

MiB = 2**20
KEYS = {"worker", "samples", "memory_limit", "terminate_at", "batch_limit", "task_starts", "died_at"}


def nanny_worker(s, addr="w1", limit=1000 * MiB, name="c-3", now=0.0):
    s.add_worker(addr, nthreads=1, now=now, memory_limit=limit, name=name,
                 info={"nanny": True, "memory_fractions": {"target": 0.6, "spill": 0.7, "pause": 0.8,
                                                           "terminate": 0.95}})


# -- the timeline ------------------------------------------------------------------------

def test_a_timeline_of_100000_points_keeps_its_cap_its_spike_and_its_whole_life():
    tl = MemoryTimeline()
    spike_at = 61_234
    for i in range(100_000):
        tl.add(float(i), 9 * MiB if i == spike_at else 100 * MiB + i % 7)
        assert len(tl) <= CAP
    points = tl.points()
    assert len(points) <= CAP and len(points) > CAP // 4
    times = [t for t, _ in points]
    assert times == sorted(times)
    assert [spike_at, 9 * MiB] not in points             # (a dip is no spike: merged away)
    tl.add(100_000.0, 5000 * MiB)
    # ... but a spike is never lost, at its own time, however many halvings follow
    for i in range(100_001, 300_000):
        tl.add(float(i), 100 * MiB)
    points = tl.points()
    assert [100_000.0, 5000 * MiB] in points and max(v for _, v in points) == 5000 * MiB
    # The resolution is even over the life: the first tenth of it has about a tenth of the points.
    early = sum(1 for t, _ in points if t < 30_000)
    assert 0.05 * len(points) < early < 0.15 * len(points), early
    assert points[0][0] < 1000 and points[-1][0] >= 299_000     # from its start to its latest report


def test_a_short_timeline_keeps_every_point_and_a_cap_below_2_is_refused():
    tl = MemoryTimeline(cap=10)
    for i in range(9):
        tl.add(i, i)
    assert tl.points() == [[float(i), i] for i in range(9)]
    with pytest.raises(ValueError, match="at least 2"):
        MemoryTimeline(cap=1)


def test_downsample_keeps_maxima_at_their_times_and_at_most_n_points():
    pts = [[float(t), (t * 37) % 101] for t in range(5000)]
    pts[4321] = [4321.0, 10_000]
    out = downsample(pts, 60)
    assert len(out) == 60 and [4321.0, 10_000] in out
    assert [t for t, _ in out] == sorted(t for t, _ in out)
    assert downsample(pts[:5], 60) == pts[:5]
    with pytest.raises(ValueError, match="at least 1"):
        downsample(pts, 0)


def test_merge_sorts_drops_repeats_and_skips_what_is_not_a_point():
    a = [[1.0, 10], [3.0, 30]]
    b = [(2.0, 20), (3.0, 30), ("x", 1), None, (float("nan"), 5), (4.0, -1), [5.0]]
    assert merge(a, b) == [[1.0, 10], [2.0, 20], [3.0, 30]]
    assert merge(a, None, n=1) == [[3.0, 30]]
    assert merge(a, 5, {"x": 1}, [{"t": 1}, "ab", 7]) == a         # a report from a broken peer: its junk skipped


# -- the death record ----------------------------------------------------------------------

def test_a_death_record_carries_the_workers_memory_life_in_the_documented_schema():
    s = SchedulerState(prefetch=1)
    nanny_worker(s)
    s.update_graph("c", [task("a"), task("b")], ["a", "b"])   # a runs, b is only prefetched
    for i in range(1, 20):
        s.worker_memory("w1", {"rss": (100 + 10 * i) * MiB, "peak_rss": (105 + 10 * i) * MiB}, now=float(i))
        if i == 5:
            s.task_started("w1", "a", now=5.5, memory={"rss": 150 * MiB, "managed": 0})
    record = s.remove_worker("w1", now=20.0, death={"cause": "memory-nanny", "blame": True})
    memory = s.death_memory(record["id"])
    assert memory is record["memory"] and set(memory) == KEYS
    assert json.loads(json.dumps(memory)) == memory            # JSON-safe: lists, plain numbers and strings
    assert memory["worker"] == "c-3" and memory["died_at"] == 20.0
    assert memory["memory_limit"] == 1000 * MiB and memory["terminate_at"] == int(1000 * MiB * 0.95)
    assert memory["batch_limit"] is None
    assert memory["task_starts"] == [[5.5, "a"]]               # only tasks that executed
    samples = memory["samples"]
    assert [t for t, _ in samples] == sorted(t for t, _ in samples)
    # each heartbeat's point is the most since the last one (peak_rss), and the task's start a point too
    assert samples[-1] == [19.0, 295 * MiB] and [5.5, 150 * MiB] in samples and len(samples) == 20
    assert s.death_memory(99) is None and s.death_memory(-1) is None


def test_without_a_nanny_there_is_no_terminate_level_and_no_heartbeat_time_no_point():
    s = SchedulerState()
    s.add_worker("w1", nthreads=1, now=0, memory_limit=0, name="plain")
    s.worker_memory("w1", {"rss": 5 * MiB})                    # no time: not a point
    s.worker_memory("w1", {"rss": 6 * MiB}, now=1.0)
    record = s.remove_worker("w1", now=2.0, death={"cause": "crash", "blame": True})
    assert record["memory"]["samples"] == [[1.0, 6 * MiB]]
    assert record["memory"]["memory_limit"] is None and record["memory"]["terminate_at"] is None


def test_100000_heartbeats_give_at_most_the_cap_and_the_spike_survives_to_the_death():
    s = SchedulerState()
    nanny_worker(s)
    for i in range(100_000):
        s.worker_memory("w1", {"rss": 200 * MiB, "peak_rss": 990 * MiB if i == 77_777 else 200 * MiB}, now=float(i))
    assert len(s.workers["w1"].timeline) <= CAP
    samples = s.remove_worker("w1", now=100_000.0, death={"cause": "memory-nanny"})["memory"]["samples"]
    assert len(samples) <= MAX_SAMPLES
    assert [77_777.0, 990 * MiB] in samples and max(v for _, v in samples) == 990 * MiB


def test_task_starts_are_bounded_to_the_latest():
    s = SchedulerState(prefetch=0)
    nanny_worker(s)
    n = MAX_STARTS + 100
    s.update_graph("c", [task(f"t{i}") for i in range(n)], [f"t{i}" for i in range(n)])
    for i in range(n):
        s.task_started("w1", f"t{i}", now=float(i))
        s.task_finished("w1", f"t{i}", nbytes=8)
    starts = s.remove_worker("w1", now=float(n), death={"cause": "crash"})["memory"]["task_starts"]
    assert len(starts) == MAX_STARTS and starts[0] == [100.0, "t100"] and starts[-1] == [float(n - 1), f"t{n - 1}"]


def test_the_nanny_report_and_the_accounting_refine_the_memory_record():
    s = SchedulerState()
    nanny_worker(s, limit=0)                      # the worker did not say its limit; its nanny does
    for i in range(5):
        s.worker_memory("w1", {"rss": 100 * MiB}, now=float(i))
    record = s.remove_worker("w1", now=5.0, death={"cause": "connection-lost", "final_at": None})
    s.touched_deaths = set()
    report = {"samples": [(4.5 + k / 10, (300 + 20 * k) * MiB) for k in range(5)], "memory_budget": 380 * MiB,
              "memory_limit": 400 * MiB, "timeline": [[0.5, 90 * MiB], [4.0, 100 * MiB]]}
    s.refine_death_memory(record["id"], nanny=report)
    memory = s.death_memory(record["id"])
    assert memory["terminate_at"] == 380 * MiB and memory["memory_limit"] == 400 * MiB
    samples = memory["samples"]
    # 5 heartbeats, 5 nanny samples, and of the nanny's timeline the point no heartbeat had
    assert [t for t, _ in samples] == sorted(t for t, _ in samples) and len(samples) == 5 + 5 + 1
    assert samples[-1] == [4.9, 380 * MiB] and samples[0] == [0.0, 100 * MiB]
    assert s.touched_deaths == {record["id"]}                   # the journal writes it again
    s.refine_death_memory(record["id"], batch_limit=512 * MiB)
    assert memory["batch_limit"] == 512 * MiB
    s.refine_death_memory(record["id"], batch_limit=None)       # an accounting record without it changes nothing
    assert memory["batch_limit"] == 512 * MiB
    assert json.loads(json.dumps(memory)) == memory


def test_a_job_that_never_started_its_worker_has_no_memory_record():
    s = SchedulerState()
    record = s.add_death({"worker": None, "name": "job 7", "time": 1.0, "cause": "startup", "blame": False})
    assert s.death_memory(record["id"]) is None
    s.refine_death_memory(record["id"], nanny={"samples": [[1, 2]]}, batch_limit=5)     # nothing to refine
    assert "memory" not in s.deaths[record["id"]]


def test_old_deaths_keep_a_summary_and_the_journal_a_bounded_one():
    s = SchedulerState()
    s.touched_deaths = set()
    for d in range(KEEP_FULL + 3):
        nanny_worker(s, addr=f"w{d}", name=f"c-{d}", now=d * 10_000.0)
        for i in range(3000):
            s.worker_memory(f"w{d}", {"rss": (i % 50) * MiB}, now=d * 10_000.0 + i)
        s.remove_worker(f"w{d}", now=d * 10_000.0 + 3000, death={"cause": "retired"})
    sizes = [len(d["memory"]["samples"]) for d in s.deaths]
    assert sizes[:3] == [OLD_SAMPLES] * 3 and all(OLD_SAMPLES < n <= MAX_SAMPLES for n in sizes[3:])
    assert {0, 1, 2} <= s.touched_deaths
    written = journal_death(s.deaths[-1])
    assert len(written["memory"]["samples"]) == JOURNAL_SAMPLES and written["memory"]["died_at"] == s.deaths[-1]["time"]
    assert len(s.deaths[-1]["memory"]["samples"]) > JOURNAL_SAMPLES       # the live record is untouched
    rec = Recorder(s)
    records = rec.collect()
    deaths = [r[1] for r in records if r[0] == "D"]
    assert len(deaths) == len(s.deaths) and all(len(d["memory"]["samples"]) <= JOURNAL_SAMPLES for d in deaths)
    assert snapshot(s).deaths[len(s.deaths) - 1] == deaths[-1]          # compaction writes the same
