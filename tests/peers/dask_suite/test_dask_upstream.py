"""dask's own tests of its collections, computing on our Client.

The installed dask version's sdist is downloaded from the package registry at test time
(nothing of dask's is in this repository; dask_fetch.py says exactly what is extracted)
and these files run under our plugin (dask_plugin.py), which starts one LocalCluster per
run, every worker in its own mount namespace with a private /tmp, and makes our Client
dask's scheduler for every compute: dask/array/tests/test_reductions.py and
test_array_core.py, dask/bag/tests/test_bag.py, dask/tests/test_delayed.py,
dask/dataframe/tests/test_groupby.py and test_shuffle.py.

Every test must pass, skip or xfail as dask says, or be listed with its reason in
docs/dask-collections.md; the table there is read here and its tests must fail. Each row
also says whether distributed's Client fails the test too, and the run of our failures on
distributed's Client (same plugin, same workers, same private /tmp) must agree. Our client
must fail no test that distributed's passes, unless the row says we refuse it deliberately.

Run alone: `.venv/bin/python -m pytest tests/peers/dask_suite -ra` (TEST_DASK_SUITE_DISTRIBUTED_ON=all
runs every file on distributed's Client too); the summary at the end gives each file's
counts and time, and a command line that repeats each run by hand.
"""

from __future__ import annotations

import shutil
import subprocess
import tempfile
import time
from pathlib import Path

import pytest
from dask_clusters import WORKERS, check_probe, private_tmp_mode, private_tmp_wrapper
from dask_fetch import FILES, IDS, PACKAGE, ini, rewrite
from dask_plugin import in_shard
from dask_runs import DEADLINE, FAILED, SUMMARIES, Campaign, DaskRun, short
from dask_table import DOC, HEADING, TABLE, deliberate, distributed_fails_too

from helpers.peers import TableError, covers, indent, known_failures, last_lines, row_for, unknown_rows

WAIT = DEADLINE + 120


def run_problems(campaign, run: DaskRun) -> list[str]:
    """What makes the run as a whole a failure: it did not start or end well, its cluster or
    probe did not, a test left dask's scheduler changed."""
    if run.proc is None:
        return [f"not run: the campaign passed its deadline of {DEADLINE} s first"]
    out = run.ended_badly(run.results())
    if campaign.overran and run.timed_out:
        out.append(f"stopped: the campaign passed its deadline of {DEADLINE} s")
    report = run.report()
    for key in ("start_error", "probe_problems", "close_errors"):
        if report.get(key):
            out.append(f"{run.client}'s cluster: {key}: {report[key]}")
    for change in report.get("scheduler_changed_by", []):
        out.append(f"dask's scheduler was no longer the cluster after {change['after']} "
                   f"(it was {change['scheduler']}); the plugin put it back")
    return out


def failure_text(r) -> str:
    return f"{r.test_id} {r.outcome.upper()}: {r.first_line}\n{indent(last_lines(r.text, 12))}"


@pytest.mark.timeout(WAIT)
@pytest.mark.parametrize("path", FILES, ids=short)
def test_dask_tests_on_our_client(dask_suite, path):
    """Exactly the tests in the table fail; nothing else about the run went wrong."""
    campaign = dask_suite.get()
    bad, results = [], []
    for run in campaign.ours[path]:             # the file's parts (dask_runs.SHARDS)
        campaign.wait_for(run)
        bad += run_problems(campaign, run)
        results += run.results()
    unlisted = [r for r in results if r.outcome in FAILED and row_for(dask_suite.table, r.test_id) is None]
    if unlisted:
        # Whether distributed's client fails them too is what their rows must say: wait for it.
        campaign.wait()
        theirs = {r.test_id: r for run in set(campaign.distributed.values()) for r in run.results()}
        for r in unlisted:
            d = theirs.get(r.test_id)
            verdict = ("not run on distributed's client" if d is None
                       else f"distributed's client {'fails it too' if d.outcome in FAILED else 'passes it: OURS ALONE'}")
            bad.append(f"{failure_text(r)}\n    ({verdict}; add it to the table or fix it)")
    passing = [(r, row_for(dask_suite.table, r.test_id)) for r in results
               if r.outcome == "passed" and row_for(dask_suite.table, r.test_id) is not None]
    if dask_suite.private_tmp == "off":
        # Tests that fail only where each worker has its own /tmp (their rows say /tmp) pass
        # here: the table cannot be held to them. Said at the end of the session; CI (root)
        # checks them.
        shared_tmp = [(r, row) for r, row in passing if "/tmp" in row.reason]
        if shared_tmp:
            SUMMARIES.append(f"NOTE: {short(path)}: {len(shared_tmp)} test(s) of the table that need private /tmp "
                             "pass here, where the workers share /tmp (not checked: "
                             + ", ".join(r.test_id.split("::")[1] for r, _ in shared_tmp) + ")")
        passing = [(r, row) for r, row in passing if "/tmp" not in row.reason]
    for r, row in passing:
        bad.append(f"{r.test_id} PASSES now: remove it from the table in {DOC.name} (line {row.line})"
                   + (" (the row has no [parameters], so it covers all of them: narrow it to those "
                      "still failing)" if "[" not in row.test_id else ""))
    if bad:
        pytest.fail(f"{short(path)} on our client: {len(bad)} problem(s) (a test not in the table of "
                    f"{DOC.name} must pass or skip; a test in it must fail):\n\n" + "\n\n".join(bad),
                    pytrace=False)


def compared(dask_suite) -> list[tuple]:
    """Each test that failed on our client with its row and its result on distributed's
    client (None: not run there), once every run has ended."""
    campaign = dask_suite.get()
    campaign.wait()
    theirs = {r.test_id: r for run in set(campaign.distributed.values()) for r in run.results()}
    return [(r, row_for(dask_suite.table, r.test_id), theirs.get(r.test_id))
            for run in campaign.our_runs() for r in run.results() if r.outcome in FAILED]


@pytest.mark.timeout(WAIT)
def test_ours_fails_no_test_that_distributed_passes(dask_suite):
    """The issue's bar: distributed's Client, through the same plugin on the same workers.
    A failure of ours alone is a bug, unless its row says we refuse it deliberately."""
    ours_alone = [(r, row, d) for r, row, d in compared(dask_suite) if d is not None and d.outcome not in FAILED]
    SUMMARIES.append(f"Failures that are ours alone, {len(ours_alone)}:" + "".join(
        f"\n  {r.test_id}: {'deliberate: ' if row and deliberate(row) else 'BUG: '}{row.reason if row else r.first_line}"
        for r, row, d in ours_alone))
    bugs = [f"{r.test_id} (distributed's client: {d.outcome}):\n    ours: {r.first_line}"
            + (f"\n    the table's reason (line {row.line}): {row.reason}" if row else "")
            for r, row, d in ours_alone if row is None or not deliberate(row)]
    assert not bugs, (f"{len(bugs)} test(s) fail on our client that distributed's client passes: fix them "
                      f"(or, for a refusal on purpose, say 'no, deliberately' in {DOC.name}):\n" + "\n".join(bugs))


@pytest.mark.timeout(WAIT)
def test_table_says_which_failures_are_shared(dask_suite):
    """Each row's 'fails with distributed's Client too?' is what distributed's client does."""
    wrong = []
    for r, row, d in compared(dask_suite):
        said = distributed_fails_too(row) if row is not None else None
        if said is None:
            continue                       # not in the table (the per-file test says so), or it varies
        if d is None:
            wrong.append(f"{r.test_id}: not run on distributed's client")
        elif (d.outcome in FAILED) != said:
            wrong.append(f"{r.test_id}: the table (line {row.line}) says distributed's client "
                         f"{'fails' if said else 'passes'} it, but it {d.outcome}"
                         + (f": {d.first_line}" if d.outcome in FAILED else ""))
    assert not wrong, f"{DOC.name}'s second column is wrong:\n" + "\n".join(wrong)


@pytest.mark.timeout(WAIT)
def test_table_names_only_tests_that_exist(dask_suite):
    campaign = dask_suite.get()
    collected = set()
    for run in campaign.our_runs():
        campaign.wait_for(run)
        collected |= {r.test_id for r in run.results()}
    assert collected, "the runs on our client reported no tests"
    unknown = unknown_rows(dask_suite.table, collected)
    assert not unknown, f"{DOC.name} lists tests the suite does not have: {unknown}"


@pytest.mark.timeout(WAIT)
def test_workers_each_have_their_own_tmp(dask_suite):
    """The probe of every run on our client: tasks ran in the workers, each with its own /tmp."""
    if dask_suite.private_tmp == "off":
        pytest.skip(dask_suite.private_tmp_why)
    campaign = dask_suite.get()
    for run in campaign.our_runs():
        campaign.wait_for(run)
        report = run.report()
        assert report.get("private_tmp") == dask_suite.private_tmp, f"{run.cwd}: {report}"
        probe = report.get("probe", [])
        assert len(probe) == WORKERS and not check_probe(probe, private_tmp=True), f"{run.cwd}: {report}"


# -- the harness's own parts, on their own ----------------------------------------------------
def test_campaign_keeps_its_runs_going_and_ends_with_the_last(tmp_path):
    """A freed place is taken at once (not when the other run ends), and the campaign ends
    when its last run does, not at its deadline."""
    campaign = Campaign(base=tmp_path, private_tmp="off", files=(), parallel=2)
    runs = []
    for i, seconds in enumerate([1.5, 0.2, 0.2, 0.2]):
        (tmp_path / str(i)).mkdir()
        runs.append(DaskRun(cwd=tmp_path / str(i), command=["sleep", str(seconds)], environ={"PATH": "/usr/bin:/bin"}))
    campaign.started = time.monotonic()
    campaign._run(list(runs))
    took = time.monotonic() - campaign.started
    assert all(r.finished and r.proc.returncode == 0 for r in runs)
    assert runs[3].started < runs[0].started + runs[0].seconds, "the short runs waited for the long one"
    assert took < 1.5 + 1.0, f"the campaign took {took:.1f} s for runs that end after 1.5 s"


def test_a_private_tmp_still_shows_what_the_worker_lives_in_under_tmp():
    """A clone and its .venv under /tmp (as CI may make) stay visible in a worker's private
    /tmp; nothing else of the machine's /tmp does."""
    mode, why = private_tmp_mode()
    if mode == "off":
        pytest.skip(why)
    keep = Path(tempfile.mkdtemp(dir="/tmp", prefix="hpc-cluster-keep-"))
    other = Path(tempfile.mkdtemp(dir="/tmp", prefix="hpc-cluster-other-"))
    try:
        (keep / "venv").mkdir()
        (keep / "venv" / "python").write_text("here")
        proc = subprocess.run([*private_tmp_wrapper(mode, [str(keep / "venv"), "/usr/lib"]), "sh", "-c",
                               'cat "$1"/venv/python && echo && ls -A /tmp', "sh", str(keep)],
                              capture_output=True, text=True, timeout=30, stdin=subprocess.DEVNULL)
        assert proc.returncode == 0, proc.stderr
        assert proc.stdout.split() == ["here", keep.name]
    finally:
        shutil.rmtree(keep)
        shutil.rmtree(other)


def test_check_probe_finds_workers_sharing_tmp():
    ok = [{"pid": 10**7 + i, "mount_namespace": f"mnt:[{i}]", "tmp_fstype": "tmpfs", "marker": f"m{i}",
           "tmp": [f"m{i}"]} for i in range(2)]
    assert check_probe(ok, private_tmp=True) == []
    shared = [dict(r, mount_namespace="mnt:[0]", tmp=["m0", "m1"]) for r in ok]
    found = "\n".join(check_probe(shared, private_tmp=True))
    assert "not each their own" in found and "sees other workers' files" in found
    assert check_probe(shared, private_tmp=False) == []
    one_process = [dict(r, pid=ok[0]["pid"]) for r in ok]
    assert "not one each" in "\n".join(check_probe(one_process, private_tmp=False))


def test_shards_split_a_file_into_parts_that_cover_it_once():
    items = [f"t{i}" for i in range(7)]
    parts = [in_shard(items, f"{i}/3") for i in range(3)]
    assert sorted(sum(parts, [])) == items and parts[0] == ["t0", "t3", "t6"]
    with pytest.raises(ValueError, match="0 <= I < N"):
        in_shard(items, "3/3")


def test_test_ids_are_dask_paths():
    assert IDS.from_junit(f"{PACKAGE}.array.tests.test_reductions", "test_x[1-a]") == \
        "dask/array/tests/test_reductions.py::test_x[1-a]"
    assert IDS.from_junit(f"{PACKAGE}.tests.test_delayed", "test_y") == "dask/tests/test_delayed.py::test_y"
    assert IDS.from_nodeid(f"{PACKAGE}/array/tests/test_x.py::test_y[1]") == "dask/array/tests/test_x.py::test_y[1]"
    assert short("dask/dataframe/tests/test_shuffle.py") == "dataframe/test_shuffle.py"


def test_imports_of_dask_test_modules_are_switched_to_the_extracted_copies():
    source = "import x\n    from dask.dataframe.tests.test_multi import list_eq\nfrom dask.dataframe.utils import a\n"
    assert rewrite(source, {"dask/dataframe/tests/test_multi.py"}).splitlines() == [
        "import x", f"    from {PACKAGE}.dataframe.tests.test_multi import list_eq", "from dask.dataframe.utils import a"]
    with pytest.raises(Exception, match="add dask/array/tests/test_other.py to HELPERS"):
        rewrite("from dask.array.tests.test_other import f\n", set())


def test_ini_keeps_dask_settings_but_their_ci_tooling():
    text = ini({"tool": {"pytest": {"ini_options": {
        "markers": ["slow: slow"], "addopts": ["-v", "-ra", "--cov-config=pyproject.toml", "--strict-markers"],
        "filterwarnings": ["error", "ignore:x:UserWarning"], "xfail_strict": True, "timeout_method": "thread"}}}},
        rerunfailures=True)
    assert text.splitlines() == [
        "[pytest]", "markers =", "    slow: slow", "addopts =", "    -ra", "    --strict-markers",
        "filterwarnings =", "    error", "    ignore:x:UserWarning", "xfail_strict = true",
        "timeout_method = signal", "junit_family = xunit2"]
    without = ini({"tool": {"pytest": {"ini_options": {"markers": ["slow: slow"]}}}}, rerunfailures=False)
    assert without.splitlines()[:3] == ["[pytest]", "markers =", "    slow: slow"]
    assert without.splitlines()[3].startswith("    flaky: ")


def test_table_rows_are_read_strictly(tmp_path):
    doc = tmp_path / "page.md"
    # Another table in the section (the counts) is not the one read.
    head = (f"# Page\n\n{HEADING}\n\nText.\n\n| file | ours |\n|---|---|\n| a.py | 1 |\n\nMore.\n\n"
            "| test | fails with distributed's Client too? | reason |\n|---|---|---|\n")
    doc.write_text(head + "| `dask/tests/test_delayed.py::test_a` | yes | identity |\n"
                   "| `dask/array/tests/test_x.py::test_b[1-2]` | no: ours alone | slow |\n"
                   "| `dask/array/tests/test_x.py::test_c` | no, deliberately | refused |\n"
                   "| `dask/array/tests/test_x.py::test_d` | varies, deliberately | refused; random there |\n"
                   "\n## Next\n| `x` | y |\n")
    table = known_failures(TABLE, doc)
    assert sorted(table) == ["dask/array/tests/test_x.py::test_b[1-2]", "dask/array/tests/test_x.py::test_c",
                             "dask/array/tests/test_x.py::test_d", "dask/tests/test_delayed.py::test_a"]
    a, b, c, d = (table[f"dask/{t}"] for t in ("tests/test_delayed.py::test_a", "array/tests/test_x.py::test_b[1-2]",
                                               "array/tests/test_x.py::test_c", "array/tests/test_x.py::test_d"))
    assert distributed_fails_too(d) is None and deliberate(d)
    assert distributed_fails_too(a) and not deliberate(a)
    assert distributed_fails_too(b) is False and not deliberate(b)
    assert distributed_fails_too(c) is False and deliberate(c)
    assert row_for(table, "dask/tests/test_delayed.py::test_a[p]").reason == "identity"   # a bare row: every param
    assert row_for(table, "dask/array/tests/test_x.py::test_b[3]") is None                 # a row with one: that one
    assert unknown_rows(table, {"dask/tests/test_delayed.py::test_a[p]"}) == [
        "dask/array/tests/test_x.py::test_b[1-2]", "dask/array/tests/test_x.py::test_c", "dask/array/tests/test_x.py::test_d"]
    assert covers("dask/tests/test_delayed.py::test_a", "dask/tests/test_delayed.py::test_a[p]")
    for bad in ("| dask/tests/test_delayed.py::test_a | yes | no backticks |",
                "| `dask/tests/test_delayed.py::test_a` | maybe | x |",
                "| `dask/tests/test_delayed.py::test_a` | varies | random, but not said to be deliberate |",
                "| `dask/tests/test_delayed.py::test_a` | yes |  |",
                "| `test_delayed.py::test_a` | yes | not a dask path |"):
        doc.write_text(head + bad + "\n")
        with pytest.raises(TableError):
            known_failures(TABLE, doc)
