"""The Grid Engine adapter on outputs captured from a real gridengine 8.1.9 (fixtures/sge/,
SOURCES.md; tests/batch/sge/capture_fixtures.py regenerates them): the adapter kit, then the
pure parsers one by one, malformed output included."""

from __future__ import annotations

import dataclasses

import pytest

from hpc_cluster.adapters.base import BatchError
from hpc_cluster.adapters.sge import (SGEAdapter, classify_qacct, map_qstat_state, parse_category, parse_qacct,
                                      parse_qstat_j_error, parse_qstat_xml, parse_qsub, parse_sge_size,
                                      parse_sge_time, sanitize_job_name)
from hpc_cluster.scheduler.diagnosis import Evidence, diagnose
from hpc_cluster.testing.adapter_conformance import AdapterConformance, Captured, Ending, ReplayRunner, kit_spec
from helpers.fixtures import fixture, manifest

JOBS = manifest("sge")["jobs"]
MiB = 2**20


def qacct(name: str) -> Captured:
    return Captured("qacct", fixture("sge", f"qacct_{name}.txt"), match=JOBS[name])


NOT_FOUND = Captured("qacct", "", fixture("sge", "qacct_not_found_stderr.txt"), 1)


class TestSGE(AdapterConformance):
    adapter_class = SGEAdapter
    entry_point = "sge"
    script_must_contain = ("#$ -N kit-job", "#$ -q kit-queue", "#$ -P kit-account", "#$ -l h_rt=01:30:00",
                           "#$ -cwd", "#$ -j y")
    submit_output = Captured("qsub", fixture("sge", "qsub.txt"))
    submitted_job_id = JOBS["completed"]
    status_outputs = [Captured("qstat", fixture("sge", "qstat_j_eqw.txt"), match="-j"),
                      Captured("qstat", fixture("sge", "qstat_xml.txt")),
                      Captured("qdel", f"root has deleted job {JOBS['eqw']}\n")]     # the Eqw job goes
    status_expected = {JOBS["walltime"]: "running", JOBS["qdel_pending"]: "pending", JOBS["eqw"]: "failed",
                       JOBS["exit3"]: "failed", JOBS["completed"]: "completed"}
    # Accounting asks the queue first: by then these jobs had left it (the queue captured
    # while they ran is status_outputs'). The job in error state has a test of its own below.
    accounting_outputs = [Captured("qstat", fixture("sge", "qstat_xml_empty.txt")),
                          *(qacct(n) for n in ("completed", "exit3", "segfault", "walltime", "vmem_kill",
                                               "vmem_alloc", "qdel_running")), NOT_FOUND]
    endings = [
        Ending(JOBS["completed"], "completed", exit_code=0, signal=None),
        Ending(JOBS["exit3"], "failed", cause="crash", exit_code=3, signal=None),
        Ending(JOBS["exit3"], "failed", cause="startup", registered=False),
        Ending(JOBS["segfault"], "failed", cause="crash", exit_code=139, signal=11),
        Ending(JOBS["walltime"], "timeout", cause="walltime", exit_code=137, signal=9),
        Ending(JOBS["vmem_kill"], "out-of-memory", cause="memory-batch", exit_code=137, signal=9),
        Ending(JOBS["vmem_alloc"], "failed", exit_code=1),
        Ending(JOBS["qdel_running"], "cancelled", cause="cancelled", exit_code=137, signal=9),
    ]
    cancel_outputs = [Captured("qdel", fixture("sge", "qdel_finished.txt"), "", 1)]


def test_walltime_kill_is_a_timeout_with_its_limit_and_time():
    (rec,) = parse_qacct(fixture("sge", "qacct_walltime.txt"))
    assert (rec.job_id, rec.state, rec.exit_code, rec.signal) == (JOBS["walltime"], "timeout", 137, 9)
    assert (rec.time_limit, rec.elapsed) == (5, 6)
    assert rec.raw_state == "failed 37  : qmaster enforced h_rt, h_cpu, or h_vmem limit; exit_status 137                  (Killed)"
    assert rec.node == "vm" and rec.start == "Tue Nov 24 20:15:50 2026"


def test_vmem_kill_is_out_of_memory_with_request_and_use():
    (rec,) = parse_qacct(fixture("sge", "qacct_vmem_kill.txt"))
    assert rec.state == "out-of-memory"
    assert rec.requested_memory == 300 * MiB
    assert rec.max_rss == int(307.492 * MiB)          # maxvmem: what h_vmem was checked against
    assert rec.time_limit is None


def test_allocation_refused_under_h_vmem_is_an_ordinary_failure():
    # One process under h_vmem: its own malloc fails (Python MemoryError, exit 1) before execd
    # sees the job over its limit; Grid Engine records no limit kill, and neither do we.
    (rec,) = parse_qacct(fixture("sge", "qacct_vmem_alloc.txt"))
    assert (rec.state, rec.exit_code, rec.signal, rec.requested_memory) == ("failed", 1, None, 200 * MiB)


def test_qdel_and_segfault_both_end_after_job_and_differ_by_signal():
    (deleted,) = parse_qacct(fixture("sge", "qacct_qdel_running.txt"))
    (crashed,) = parse_qacct(fixture("sge", "qacct_segfault.txt"))
    assert (deleted.state, deleted.signal) == ("cancelled", 9)
    assert (crashed.state, crashed.signal) == ("failed", 11)
    assert deleted.time_limit == 600 and deleted.requested_memory == 2**30


@pytest.mark.parametrize("failed, exit_status, numbers, want", [
    (0, 0, {}, ("completed", None)),
    (0, 3, {}, ("failed", None)),
    (100, 139, {}, ("failed", 11)),
    (100, 137, {}, ("cancelled", 9)),
    (100, 143, {}, ("cancelled", 15)),
    (37, 137, {"wallclock": 6, "h_rt": 5, "maxvmem": 100, "h_vmem": 1000}, ("timeout", 9)),
    (37, 137, {"wallclock": 2, "h_rt": 5, "maxvmem": 990, "h_vmem": 1000}, ("out-of-memory", 9)),
    (37, 137, {"wallclock": 2, "h_vmem": 1000}, ("out-of-memory", 9)),      # the only limit asked for
    (37, 137, {"wallclock": 2, "h_rt": 5}, ("timeout", 9)),
    (37, 137, {"wallclock": 2, "h_rt": 5, "maxvmem": 10, "h_vmem": 1000}, ("failed", 9)),   # cannot tell
    (26, 0, {}, ("failed", None)),                                          # opening the output file
    (19, 0, {}, ("node-fail", None)),
])
def test_classify_qacct_table(failed, exit_status, numbers, want):
    assert classify_qacct(failed, exit_status, **numbers) == want


def test_qstat_xml_states_and_hosts():
    by_id = {s.job_id: s for s in parse_qstat_xml(fixture("sge", "qstat_xml.txt"))}
    assert {k: (s.state, s.raw_state) for k, s in by_id.items()} == {
        JOBS["walltime"]: ("running", "r"), JOBS["qdel_running"]: ("running", "r"),
        JOBS["eqw"]: ("failed", "Eqw"), JOBS["qdel_pending"]: ("pending", "hqw")}
    assert by_id[JOBS["walltime"]].node == "vm" and by_id[JOBS["eqw"]].node is None
    deleting = {s.job_id: s.raw_state for s in parse_qstat_xml(fixture("sge", "qstat_xml_deleting.txt"))}
    assert deleting[JOBS["qdel_running"]] == "dr" and map_qstat_state("dr") == "running"
    assert parse_qstat_xml(fixture("sge", "qstat_xml_empty.txt")) == []


def test_error_state_job_is_failed_with_its_reason_and_deleted():
    reason = parse_qstat_j_error(fixture("sge", "qstat_j_eqw.txt"))
    assert "can't open output file \"/nonexistent/dir/\"" in reason
    runner = ReplayRunner([Captured("qstat", fixture("sge", "qstat_j_eqw.txt"), match="-j"),
                           Captured("qstat", fixture("sge", "qstat_xml.txt")),
                           Captured("qdel", "root has deleted job 9\n")])
    adapter = SGEAdapter(runner)
    assert adapter.status([JOBS["eqw"]])[JOBS["eqw"]].state == "failed"
    # It would sit in the queue for ever: reported failed, it is deleted, its reason kept.
    assert (["qdel", JOBS["eqw"]], None) in runner.calls
    runner.outputs.insert(0, Captured("qstat", fixture("sge", "qstat_xml_empty.txt"), match="-xml"))
    rec = adapter.accounting([JOBS["eqw"]])[JOBS["eqw"]]
    assert rec.state == "failed" and rec.raw_state.startswith("Eqw: ") and "can't open output file" in rec.raw_state
    assert not any(argv[0] == "qacct" for argv, _ in runner.calls)          # it never ran: nothing to ask
    assert diagnose(Evidence(accounting=dataclasses.asdict(rec), registered=False)).cause == "startup"


def test_a_job_deleted_before_it_ran_is_cancelled_though_qacct_never_heard_of_it():
    runner = ReplayRunner([Captured("qdel", "root has deleted job 8\n"),
                           Captured("qstat", fixture("sge", "qstat_xml_empty.txt")), NOT_FOUND])
    adapter = SGEAdapter(runner)
    assert adapter.status(["8"])["8"].state == "unknown"          # not ours to judge: someone else's qdel?
    adapter.cancel(["8"])
    assert adapter.status(["8"])["8"].state == "cancelled"


def test_values():
    assert parse_sge_size("300M") == 300 * MiB and parse_sge_size("1G") == 2**30
    assert parse_sge_size("2g") == 2 * 10**9 and parse_sge_size("0.000B") == 0
    assert parse_sge_size("11.781MBs") is None and parse_sge_size("") is None
    assert parse_sge_time("6s") == 6 and parse_sge_time("0:10:0") == 600 and parse_sge_time("600") == 600
    assert parse_sge_time("6.7s") == 7 and parse_sge_time("x") is None
    assert parse_category("-q all.q -l h_rt=600,h_vmem=1G -soft -l h_vmem=2G") == {"h_rt": "600", "h_vmem": "1G"}
    assert parse_category("NONE") == {}
    assert parse_qsub(fixture("sge", "qsub.txt")) == JOBS["completed"]
    assert parse_qsub("17\n") == "17" and parse_qsub('Your job-array 18.1-10:1 ("a") has been submitted') == "18"
    assert sanitize_job_name("1st job/x") == "j1st-job-x"


def test_malformed_outputs_are_errors_that_say_what_was_read():
    with pytest.raises(BatchError, match="qstat -xml printed something that is not XML.*first line: \\['error: commlib"):
        parse_qstat_xml("error: commlib error: got select error (Connection refused)\n")
    with pytest.raises(BatchError, match="printed <html>, not <job_info>"):
        parse_qstat_xml("<html></html>")
    with pytest.raises(BatchError, match="before any '=====' record separator"):
        parse_qacct("jobnumber 5\nfailed 0\n")
    with pytest.raises(BatchError, match="without jobnumber/failed"):
        parse_qacct("=====\nqname all.q\n")
    with pytest.raises(BatchError, match="qsub printed no job id"):
        parse_qsub("Unable to run job: no\n")


def test_render_with_resource_spec_memory_and_refusals():
    adapter = SGEAdapter(ReplayRunner())
    script = adapter.render(kit_spec(resource_spec="h_vmem={memory},mem_free={memory}", log_directory="/logs",
                                     working_directory="/work/x"))
    assert "#$ -l h_vmem=2048M,mem_free=2048M\n#$ -l h_rt=01:30:00\n#$ -e /logs/\n#$ -o /logs/\n#$ -wd /work/x\n" in script
    assert "#$ -cwd" not in script
    with pytest.raises(BatchError, match=r"resource_spec='h_vmem=\{mem\}'.*may use \{cores\}, \{memory\}"):
        adapter.render(kit_spec(resource_spec="h_vmem={mem}"))
    with pytest.raises(BatchError, match="SLURM settings; on Grid Engine ask for slots"):
        adapter.render(kit_spec(job_cpu=4))
