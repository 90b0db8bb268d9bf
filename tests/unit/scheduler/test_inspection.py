"""scheduler/inspection.py without sockets: the task stream's selection (dask's meaning), events
and metadata kept within their bounds, the scheduler's log lines."""

from __future__ import annotations

import logging

import pytest

from hpc_cluster.scheduler import inspection
from hpc_cluster.scheduler.checks import Refused
from hpc_cluster.scheduler.inspection import select
from hpc_cluster.scheduler.server import Scheduler

# (worker name, lane, key, start, stop, outcome), in order of ending, as stream.py keeps them
RECORDS = [("w", 0, f"inc-{i}", i - 0.5, float(i), "memory") for i in range(10)]


def keys(records) -> list[str]:
    return [r[2] for r in records]


def test_the_task_stream_is_selected_as_dask_selects_it():
    assert keys(select(RECORDS, None, None, None)) == keys(RECORDS)
    assert keys(select(RECORDS, 3.0, None, None)) == [f"inc-{i}" for i in range(3, 10)]     # ended at or after
    assert keys(select(RECORDS, 3.0, 6.0, None)) == ["inc-3", "inc-4", "inc-5"]              # stop excluded
    assert keys(select(RECORDS, None, None, 2)) == ["inc-8", "inc-9"]                        # the latest
    assert keys(select(RECORDS, 3.0, None, 2)) == ["inc-3", "inc-4"]
    assert keys(select(RECORDS, None, 6.0, 2)) == ["inc-4", "inc-5"]
    assert select(RECORDS, 100.0, None, None) == [] and select([], None, None, 5) == []


@pytest.fixture
def looking():
    return Scheduler(b"s" * 32).inspection


def test_events_are_kept_per_topic_the_latest_only(looking, monkeypatch):
    monkeypatch.setattr(inspection, "EVENTS_PER_TOPIC", 3)
    for i in range(5):
        looking.publish(["a", "b"], {"i": i})
    assert [m["i"] for _, m in looking.get_events("a")] == [2, 3, 4]
    assert set(looking.get_events(None)) == {"a", "b"} and looking.get_events("nothing") == []


def test_the_topic_heard_from_longest_ago_goes_first_past_the_topic_limit(looking, monkeypatch):
    monkeypatch.setattr(inspection, "MAX_TOPICS", 3)
    for topic in ("a", "b", "c", "a", "d"):
        looking.publish(topic, 1)
    assert set(looking.events) == {"c", "a", "d"}


def test_an_oversized_event_is_kept_as_a_note_saying_so(looking, monkeypatch):
    monkeypatch.setattr(inspection, "MAX_EVENT_BYTES", 100)
    looking.publish("big", "x" * 1000)
    (_, kept), = looking.get_events("big")
    assert "1003 bytes" in kept["dropped"] and "scatter" in kept["dropped"]


def test_metadata_paths_make_nested_dicts_as_dask(looking):
    looking.set_metadata(["x", "y"], 123)
    looking.set_metadata(["x", "w", "z"], 456)
    assert looking.get_metadata(["x"]) == {"y": 123, "w": {"z": 456}}
    looking.set_metadata(["x", "y", "deeper"], 1)         # a value on the path becomes a dict
    assert looking.get_metadata(["x", "y"]) == {"deeper": 1}
    assert looking.get_metadata(["nope"]) is inspection._NO_DEFAULT


def test_metadata_beyond_the_bound_is_refused_with_advice_and_replacing_frees_room(looking, monkeypatch):
    monkeypatch.setattr(inspection, "MAX_METADATA_BYTES", 1000)
    looking.set_metadata(["a"], "x" * 600)
    with pytest.raises(Refused, match="small administrative values"):
        looking.set_metadata(["b"], "x" * 600)
    looking.set_metadata(["a"], "x" * 10)                 # the old value's bytes are given back
    looking.set_metadata(["b"], "x" * 600)
    assert looking.get_metadata(["b"]) == "x" * 600


def test_the_scheduler_keeps_its_latest_log_lines(looking):
    logging.getLogger("hpc_cluster.scheduler").warning("inspection-test-line %d", 7)
    level, line = looking._answer("scheduler-logs", {"n": 1}, None)[0]
    assert level == "WARNING" and "inspection-test-line 7" in line
