"""The journal's "C" records (scheduler/journal.py, issue 31 point 5): what the scheduler's
coordination hands it at each flush lands in the file, a later record of the same object replaces
the earlier, a None payload removes it, and compaction keeps exactly the live ones."""

from __future__ import annotations

from hpc_cluster.scheduler.journal import Journal, load, write_snapshot
from hpc_cluster.scheduler.state import SchedulerState


class Changes:
    """Stands where coordination.py's journal_records is: hands over what the test queued."""

    def __init__(self):
        self.queued: list[list] = []
        self.everything: list[list] = []

    def __call__(self, everything: bool = False) -> list[list]:
        if everything:
            return list(self.everything)
        out, self.queued = self.queued, []
        return out


def test_coordination_records_are_kept_replaced_and_removed(tmp_path):
    path = tmp_path / "j"
    changes = Changes()
    changes.everything = [["C", "semaphore", "s", 2]]
    journal = Journal(path)
    journal.extra = changes
    journal.start(SchedulerState())
    changes.queued = [["C", "variable", "v", {"data": b"one", "keys": []}],
                      ["C", "dataset", ["a", 1], {"data": b"ds", "keys": ["k"]}],
                      ["C", "event", "e", True]]
    journal.flush()
    changes.queued = [["C", "variable", "v", {"data": b"two", "keys": []}], ["C", "event", "e", None]]
    journal.flush()
    journal.close()
    held = {(r[1], str(r[2])): r[3] for r in load(path).coordination.values()}
    assert held == {("semaphore", "s"): 2, ("variable", "v"): {"data": b"two", "keys": []},
                    ("dataset", "['a', 1]"): {"data": b"ds", "keys": ["k"]}}
    compacted = tmp_path / "compacted"
    write_snapshot(compacted, load(path).records())
    assert load(compacted).coordination == load(path).coordination
    assert sum(1 for r in load(compacted).records() if r[0] == "C") == 3
