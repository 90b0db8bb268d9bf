"""The scheduler's journal (issue 16, point 1) and the state rebuilt from it (point 2's first half).

Pure tests of the format (torn tails, checksums, compaction), the check that the journal
misses no change the state machine makes (random event sequences, compared after every
event with a full snapshot of the state), and rebuilds: what a journal recovers, the
results held by workers that have not come back, and recomputation when they do not.
"""

import functools
import os
import stat

from hypothesis import given
from hypothesis import strategies as st

from hpc_cluster.protocol.frames import Opaque
from hpc_cluster.scheduler import journal as jr
from hpc_cluster.scheduler.journal import Journal, Recorder, Recovered, load, snapshot
from hpc_cluster.scheduler.state import SchedulerState
import helpers.tasks
from test_state_fuzz import FuzzRun, PoolsRun, check, fuzz, stable_hashes

F, A = Opaque(b"f" * 100), Opaque(b"a", [b"buffer"])      # payloads with a size and a buffer to store
task = functools.partial(helpers.tasks.task, func=F, args=A, retries=0)


def normal(rec: Recovered) -> tuple:
    """A Recovered as plain data, as it would come back from a file (msgpack both ways)."""
    def norm(x):
        return jr.unpack(jr.pack(x))
    return (norm(rec.specs), norm(rec.status), norm(rec.deaths), norm(rec.jobs))


def workload(s: SchedulerState) -> None:
    """Results on two workers, a dependent waiting, an error, a crash death (its verdict still
    open) charged to a task with a retry left, on a third worker (the only one with a gpu)."""
    s.add_client("c1")
    s.add_worker("tcp://a:1", nthreads=2, now=0, name="job-0")
    s.add_worker("tcp://b:1", nthreads=2, now=0, name="job-1")
    s.add_worker("tcp://c:1", nthreads=1, now=0, name="job-2", resources={"gpu": 1})
    s.update_graph("c1", [task("slow", retries=1, resources={"gpu": 1})], ["slow"])
    s.update_graph("c1", [task("x"), task("y"), task("z", ["x", "y"]), task("bad")], ["z", "bad"])
    s.take_outbox()
    where = {k: ts.processing_on.address for k, ts in s.tasks.items() if ts.processing_on}
    assert where["slow"] == "tcp://c:1" and "tcp://c:1" not in (where["x"], where["y"], where["bad"])
    s.task_finished(where["x"], "x", 8)
    s.task_finished(where["y"], "y", 16)
    s.task_erred(where["bad"], "bad", {"text": "boom", "exception": Opaque(b"pickled"), "traceback": None})
    s.task_started("tcp://c:1", "slow", 1.0)
    s.remove_worker("tcp://c:1", 2.0, {"cause": "crash", "blame": True, "text": "SIGSEGV", "final_at": None})
    s.take_outbox()


# -- the format --------------------------------------------------------------------------------
def test_a_torn_or_corrupt_last_frame_is_ignored(tmp_path):
    s = SchedulerState()
    j = Journal(tmp_path / "c.journal", cluster="c")
    j.start(s)
    s.add_client("c1")
    s.update_graph("c1", [task("a")], ["a"])
    assert j.flush() and j.wait_written()
    s.update_graph("c1", [task("b")], ["b"])
    assert j.flush() and j.wait_written()
    j.close()
    path = tmp_path / "c.journal"
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    whole = path.read_bytes()
    full = load(path)
    assert not full.torn and set(full.specs) == {"a", "b"} and full.cluster == "c"
    assert full.valid_bytes == len(whole)
    # Cut the file anywhere inside the last frame: the ones before survive, the cut is noticed.
    starts = _frame_starts(whole)
    for cut in (starts[-1] + 3, starts[-1] + 9, len(whole) - 1):
        path.write_bytes(whole[:cut])
        torn = load(path)
        assert torn.torn and set(torn.specs) == {"a"}, cut
    # A flipped byte in the last frame's payload: its checksum no longer matches.
    broken = bytearray(whole)
    broken[-2] ^= 0xFF
    path.write_bytes(bytes(broken))
    bad = load(path)
    assert bad.torn and set(bad.specs) == {"a"}


def _frame_starts(data: bytes) -> list[int]:
    pos, out = len(jr.MAGIC), []
    while pos < len(data):
        out.append(pos)
        length, _ = jr._FRAME.unpack_from(data, pos)
        pos += jr._FRAME.size + length
    return out


def test_not_a_journal_is_refused(tmp_path):
    (tmp_path / "x").write_bytes(b"something else")
    try:
        load(tmp_path / "x")
    except ValueError as exc:
        assert "magic" in str(exc)
    else:
        raise AssertionError("a file without the magic was read as a journal")


def test_compaction_keeps_exactly_the_live_state(tmp_path):
    """Loading a compacted journal gives what loading the full one gives, and both are the
    state's own snapshot; forgotten tasks are gone from the compacted file."""
    s = SchedulerState()
    full = Journal(tmp_path / "full.journal", cluster="c", compact_min_bytes=1 << 40)
    small = Journal(tmp_path / "small.journal", cluster="c", compact_min_bytes=0)
    full.start(s)
    s2 = SchedulerState()                                # the same events, journaled with compaction
    small.start(s2)
    for st_ in (s, s2):
        st_.add_client("c1")
        st_.add_worker("tcp://a:1", nthreads=4, now=0, name="w")
    for round_ in range(30):
        for st_, j in ((s, full), (s2, small)):
            keys = [f"r{round_}-{i}" for i in range(20)]
            st_.update_graph("c1", [task(k) for k in keys], keys)
            for k in keys:
                st_.task_finished("tcp://a:1", k, 8)
            j.flush()                                # (a task gone before a flush is never written)
            if round_ % 5:
                st_.client_releases("c1", keys)          # most rounds forgotten: the file outgrows the state
            j.flush()
    assert full.wait_written() and small.wait_written()
    full.close()
    small.close()
    assert small.compactions > 0 and full.compactions == 0
    a, b = load(tmp_path / "full.journal"), load(tmp_path / "small.journal")
    assert not a.torn and not b.torn
    assert normal(a) == normal(b) == normal(snapshot(s)) == normal(snapshot(s2))
    assert set(a.specs) == {f"r{r}-{i}" for r in range(0, 30, 5) for i in range(20)}
    assert os.path.getsize(tmp_path / "small.journal") < 0.6 * os.path.getsize(tmp_path / "full.journal")
    # A snapshot written from the full journal is the same again.
    jr.write_snapshot(tmp_path / "again.journal", a.records())
    assert normal(load(tmp_path / "again.journal")) == normal(a)


# -- the journal misses nothing the state machine changes ---------------------------------
def follow(run):
    """After every event, what the journal holds (records through msgpack, as from a file)
    equals the state's full snapshot."""
    rec = Recovered()
    recorder = Recorder(run.s)

    def compare():
        for r in jr.unpack(jr.pack(recorder.collect())):
            rec.apply(r)
        got, want = normal(rec), normal(snapshot(run.s))
        for part, g, w in zip(("specs", "status", "deaths", "jobs"), got, want):
            assert g == w, (part, {k: (g.get(k), w.get(k)) for k in set(g) | set(w) if g.get(k) != w.get(k)}
                            if isinstance(g, dict) else (g, w))
    return rec, compare


def replay(run, most: int):
    with stable_hashes():
        run.start()
        rec, compare = follow(run)
        compare()
        for _ in range(run.draw(st.integers(5, most))):
            getattr(run, run.draw(st.sampled_from(run.EVENTS)))()
            check(run.s)
            compare()
        # The scheduler dies here. A new one rebuilds from the journal; none of the workers
        # comes back (their reports in flight are lost with them): every wanted result still
        # finishes or fails, recomputed from lineage.
        old = run.s
        new = SchedulerState.rebuild(rec, run.now, allowed_failures=old.allowed_failures, prefetch=old.prefetch,
                                     debug=True)         # the held results' changes checked too (transitions.py)
        if old.pools:                                  # the daemon tells a new scheduler its pools again
            new.set_pools(old.pools, old.escalate)
        for key, ts in old.tasks.items():
            nts = new.tasks.get(key)
            if ts.who_wants:
                assert nts is not None and nts.who_wants == ts.who_wants, key
            if nts is not None:
                assert {d.key for d in nts.dependencies} == {d.key for d in ts.dependencies}
                if ts.state == "erred":
                    assert nts.state == "erred" and nts.error == ts.error
                if ts.state == "memory":
                    assert nts.state == "held" and nts.held_by == {w.name for w in ts.who_has}
        assert set(new.tasks) <= set(old.tasks)
        new.holders_missing({w.name for w in old.workers.values()})
        assert not any(ts.state == "held" for ts in new.tasks.values())
        run.s, run.in_flight, run.delivered = new, [], []
        for cid in sorted(old.clients - new.clients):
            new.add_client(cid)
        check(new)
        run.settle()


class BusyRun(FuzzRun):
    """test_state_fuzz's world with more of the work done: results are made, copied and lost
    more often than in its mix, so more of what the journal follows changes."""

    EVENTS = FuzzRun.EVENTS + ["worker_reports", "deliver", "deliver", "deliver", "deliver", "submit"]


@fuzz(150)
@given(st.data())
def test_the_journal_follows_every_change_and_rebuilds_a_state_that_finishes(data):
    replay(BusyRun(data), 80)


@fuzz(60)
@given(st.data())
def test_the_journal_follows_moves_between_pools(data):
    replay(PoolsRun(data), 60)


# -- rebuilding --------------------------------------------------------------------------------
def rebuilt_workload():
    """workload() journaled (in memory), then rebuilt: x's and y's holders by name, the new state."""
    s = SchedulerState()
    rec = Recovered()
    recorder = Recorder(s)
    workload(s)
    for r in recorder.collect():
        rec.apply(r)
    holder = {k: next(iter(s.tasks[k].who_has)).name for k in ("x", "y")}
    return holder, SchedulerState.rebuild(rec, now=10.0, debug=True)      # (held -> memory checked: transitions.py)


def test_a_rebuilt_state_holds_the_tasks_errors_deaths_and_wanted_keys(tmp_path):
    s = SchedulerState()
    j = Journal(tmp_path / "c.journal", cluster="c")
    j.start(s)
    workload(s)
    j.jobs = {"123": {"pool": "default"}}
    j.flush()
    assert j.wait_written()
    # The scheduler is SIGKILLed: no close, the file is what the writer thread wrote.
    rec = load(tmp_path / "c.journal")
    assert not rec.torn and rec.cluster == "c" and rec.jobs == {"123": {"pool": "default"}}
    new = SchedulerState.rebuild(rec, now=10.0)
    assert set(new.tasks) == set(s.tasks) == {"x", "y", "z", "bad", "slow"}
    assert new.clients == {"c1"}
    assert {k: ts.who_wants for k, ts in new.tasks.items()} == {k: ts.who_wants for k, ts in s.tasks.items()}
    # Results wait for the workers that held them, by name; z waits for them.
    holders = {k: {w.name for w in s.tasks[k].who_has} for k in ("x", "y")}
    assert {k: (new.tasks[k].state, new.tasks[k].held_by) for k in ("x", "y")} == {
        k: ("held", holders[k]) for k in ("x", "y")}
    assert new.tasks["z"].state == "waiting" and {d.key for d in new.tasks["z"].waiting_on} == {"x", "y"}
    assert new.tasks["bad"].state == "erred" and new.tasks["bad"].error == s.tasks["bad"].error
    assert new.tasks["x"].func == F and new.tasks["x"].args == A          # the payloads as stored
    # The crash: its record, the attempt charged to `slow`, its open verdict now final.
    assert [d["cause"] for d in new.deaths] == ["crash"] and new.deaths[0]["final_at"] == 10.0
    assert "restarted" in new.deaths[0]["text"]
    assert [a["death"] is new.deaths[0] for a in new.tasks["slow"].attempts] == [True]
    assert new.tasks["slow"].retries == 1 and new.tasks["slow"].state == "queued"
    # No worker yet: nothing is sent anywhere; the task to compute waits at the scheduler.
    assert not new.take_outbox()
    # New tasks come after the recovered ones.
    new.update_graph("c1", [task("later")], ["later"])
    assert new.tasks["later"].priority > max(ts.priority for k, ts in new.tasks.items() if k != "later")


def test_held_results_are_confirmed_by_their_worker_or_recomputed_without_it():
    holder, new = rebuilt_workload()
    new.add_worker("tcp://a2:1", nthreads=2, now=11, name=holder["x"])     # came back at a new address
    new.take_outbox()
    accepted, dropped = new.confirm_held("tcp://a2:1", ["x", "unknown"])
    assert (accepted, dropped) == (["x"], ["unknown"])
    assert new.tasks["x"].state == "memory" and {w.address for w in new.tasks["x"].who_has} == {"tcp://a2:1"}
    assert new.tasks["x"].held_by == set()
    assert holder["x"] != holder["y"]
    assert new.tasks["z"].state == "waiting" and {d.key for d in new.tasks["z"].waiting_on} == {"y"}
    # y's worker is not coming back: y is computed again from its spec, then z runs.
    assert new.held_names() == {holder["y"]}
    assert new.holders_missing([holder["y"]]) == ["y"]
    out = new.take_outbox()
    assert "y" in [m["key"] for m in out["tcp://a2:1"] if m["op"] == "compute"]
    # z was sent ahead with y (its other input, x, is there already: scheduler/state/ahead.py) and
    # runs there once y finishes
    z = [m for m in out["tcp://a2:1"] if m["op"] == "compute" and m["key"] == "z"]
    assert z and z[0]["after"] == "y" and z[0]["deps"] == {"x": ["tcp://a2:1"], "y": []}
    new.task_finished("tcp://a2:1", "y", 16)
    assert new.tasks["z"].state == "processing" and new.tasks["z"].processing_on.address == "tcp://a2:1"


def test_a_held_result_nobody_needs_any_more_is_forgotten():
    s = SchedulerState()
    rec = Recovered()
    recorder = Recorder(s)
    s.add_client("c1")
    s.add_worker("tcp://a:1", nthreads=1, now=0, name="w0")
    s.update_graph("c1", [task("k")], ["k"])
    s.task_finished("tcp://a:1", "k", 8)
    for r in recorder.collect():
        rec.apply(r)
    new = SchedulerState.rebuild(rec, now=1.0)
    assert new.tasks["k"].state == "held"
    new.client_releases("c1", ["k"])
    assert "k" not in new.tasks
    # ... and a scattered result whose worker is gone fails, as when its worker dies.
    s.scatter("c1", {"d": ["tcp://a:1"]}, {"d": 8})
    for r in recorder.collect():
        rec.apply(r)
    new = SchedulerState.rebuild(rec, now=1.0)
    new.holders_missing(["w0"])
    assert new.tasks["d"].state == "erred" and new.tasks["d"].error["kind"] == "lost-data"


def test_a_copy_lost_with_its_worker_leaves_the_journal():
    """A result on two workers, one dies: the journal names only the other (the random runs
    rarely make two copies)."""
    class World:
        s = SchedulerState()
    rec, compare = follow(World)
    s = World.s
    s.add_client("c1")
    s.add_worker("tcp://a:1", nthreads=1, now=0, name="wa")
    s.add_worker("tcp://b:1", nthreads=1, now=0, name="wb")
    s.update_graph("c1", [task("k")], ["k"])
    s.task_finished("tcp://a:1", "k", 8)
    s.task_finished("tcp://b:1", "k", 8)            # a second copy (as a replica or a duplicate run)
    compare()
    assert rec.status["k"][2:4] == ["m", ["wa", "wb"]]
    s.remove_worker("tcp://a:1", 1.0, {"cause": "crash", "blame": False, "text": ""})
    compare()
    assert rec.status["k"][2:4] == ["m", ["wb"]] and rec.deaths[0]["name"] == "wa"


def test_a_reattaching_worker_confirms_what_the_journal_held_for_it_by_name():
    """The two halves of issue 16 meet here: a worker reattaching (reattach.py: held results
    key -> nbytes, running keys) to a scheduler rebuilt from its journal (recovery.py: results
    held by worker name) has its results confirmed; what it no longer holds is recomputed."""
    holder, new = rebuilt_workload()
    new.take_outbox()
    assert new.awaited_workers == set(holder.values())
    new.add_reattached_worker("tcp://other:1", 1, 11.0, held={}, running=[], name="someone-else")
    assert new.tasks["x"].state == "held" and new.awaited_workers == set(holder.values())   # not awaited: nothing
    new.add_reattached_worker("tcp://y2:1", 1, 11.0, held={"y": 8}, running=[], name=holder["y"])
    assert new.tasks["y"].state == "memory" and {w.address for w in new.tasks["y"].who_has} == {"tcp://y2:1"}
    assert holder["y"] not in new.awaited_workers
    if holder["x"] != holder["y"]:
        assert new.tasks["x"].state == "held"
        # x's worker is back without x (its process restarted): x is computed again.
        new.add_reattached_worker("tcp://x2:1", 1, 12.0, held={}, running=[], name=holder["x"])
        assert new.tasks["x"].state in ("processing", "queued") and not new.awaited_workers


def test_a_record_msgpack_cannot_hold_costs_only_itself(tmp_path):
    s = SchedulerState()
    j = Journal(tmp_path / "c.journal", cluster="c")
    j.start(s)
    s.add_client("c1")
    s.update_graph("c1", [task("a"), task("b")], ["a", "b"])
    s.cancel(["b"], "no")
    s.tasks["b"].error["odd"] = {1, 2}                # a set: msgpack has no such type
    assert j.flush() == 5 and j.wait_written()          # B (their shared function), 2 S, 2 T
    j.close()
    rec = load(tmp_path / "c.journal")
    assert set(rec.specs) == {"a", "b"} and rec.status["a"][2] == "p" and "b" not in rec.status


def test_a_function_many_tasks_share_is_written_once_while_they_live(tmp_path):
    path = tmp_path / "c.journal"
    s = SchedulerState()
    j = Journal(path, cluster="c", compact_min_bytes=1 << 40)
    j.start(s)

    def written():                                       # every record in the file so far
        assert j.wait_written()
        return jr.read_frames(path.read_bytes())[0]

    s.add_client("c1")
    s.add_worker("tcp://a:1", nthreads=1, now=0, name="w")
    s.update_graph("c1", [task(f"m{i}") for i in range(50)], [f"m{i}" for i in range(50)])
    j.flush()
    records = written()
    assert [r[0] for r in records].count("B") == 1 and {r[2] for r in records if r[0] == "S"} == {0}
    assert path.stat().st_size < 50 * len(F.data)
    s.client_releases("c1", [f"m{i}" for i in range(50)])
    j.flush()
    assert [r[0] for r in written()].count("F") == 50
    # Every task using it is gone: a new one writes it again, under a new id, and a compacted
    # file still resolves it.
    s.update_graph("c1", [task("again")], ["again"])
    j.flush()
    assert [r[:2] for r in written() if r[0] == "B"] == [["B", 0], ["B", 1]]
    j.compact_min_bytes, j.file_bytes = 0, 1 << 30       # the next flush compacts the file
    s.update_graph("c1", [task("more")], ["more"])
    j.flush()
    j.close()
    assert j.compactions == 1
    assert [r[:2] for r in written() if r[0] == "B"] == [["B", 1]]
    rec = load(path)
    assert set(rec.specs) == {"again", "more"} and rec.tasks()["more"]["func"] == F == rec.tasks()["again"]["func"]
