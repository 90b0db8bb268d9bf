"""The LSF adapter on outputs captured from public sources (fixtures/lsf/SOURCES.md): the
adapter kit, then the pure parsers one by one, malformed output included."""

from __future__ import annotations

import dataclasses

import pytest

from hpc_cluster.adapters.base import BatchError
from hpc_cluster.adapters.lsf import (LSFAdapter, bjobs_accounting, bjobs_status, classify_bjobs,
                                      lsf_memory, lsf_walltime, parse_bjobs_json, parse_bsub, parse_lsf_duration,
                                      parse_lsf_memory)
from hpc_cluster.scheduler.diagnosis import Evidence, diagnose
from hpc_cluster.testing.adapter_conformance import AdapterConformance, Captured, Ending, ReplayRunner, kit_spec
from helpers.fixtures import fixture

MiB, GiB = 2**20, 2**30


def bjobs_output(name: str, match: str | None = None) -> Captured:
    return Captured("bjobs", fixture("lsf", name), match=match)


ENDINGS = "bjobs_endings_assembled.json"


class KitLSF(LSFAdapter):
    """The kit renders with no lsf.conf around: LSF's default unit, KB, as dask-jobqueue falls back to."""

    def __init__(self, runner=None):
        super().__init__(runner)
        self.configure({"lsf_units": "kb"})


class TestLSF(AdapterConformance):
    adapter_class = LSFAdapter
    entry_point = "lsf"
    script_must_contain = ("#BSUB -J kit-job", "#BSUB -q kit-queue", '#BSUB -P "kit-account"', "#BSUB -n 3",
                           '#BSUB -R "span[hosts=1]"', "#BSUB -W 01:30")
    submit_output = Captured("bsub", fixture("lsf", "bsub.txt"))
    submitted_job_id = "771278"
    status_outputs = [bjobs_output("bjobs_running_balsam.json", match="806290"),
                      bjobs_output("bjobs_pend_lsfclient.json", "12345679"),
                      bjobs_output("bjobs_done_batcheuphoria.json", match="22005"),
                      Captured("bjobs", "", fixture("lsf", "bjobs_not_found_stderr.txt"), 255)]
    status_expected = {"806290": "running", "12345679": "pending", "22005": "completed"}
    accounting_outputs = [bjobs_output(ENDINGS)]
    endings = [
        Ending("8254049", "timeout", cause="walltime", exit_code=140, signal=12),
        Ending("30102", "out-of-memory", cause="memory-batch", exit_code=130, signal=2),
        Ending("30103", "failed", cause="crash", exit_code=139, signal=11),
        Ending("30104", "failed", cause="crash", exit_code=1, signal=None),
        Ending("30104", "failed", cause="startup", registered=False),
        Ending("30105", "cancelled", cause="cancelled", exit_code=130),
    ]
    cancel_outputs = [Captured("bkill", "", fixture("lsf", "bkill_finished_stderr.txt"), 255)]

    def adapter(self, outputs=()):
        runner = ReplayRunner(outputs)
        return KitLSF(runner=runner), runner

    def test_status_maps_states_and_answers_every_id(self):
        # bjobs answers one query for all ids; the captures are one job each, so ask each alone.
        adapter = self.adapter([*self.status_outputs])[0]
        for job_id, want in self.status_expected.items():
            assert adapter.status([job_id])[job_id].state == want
        assert adapter.status(["999"])["999"].state == "unknown"


def records(name: str) -> dict:
    return {r["JOBID"]: r for r in parse_bjobs_json(fixture("lsf", name))}


def test_walltime_kill_has_its_limit_time_and_signal():
    rec = bjobs_accounting(records(ENDINGS)["8254049"])
    assert (rec.state, rec.exit_code, rec.signal) == ("timeout", 140, 12)
    assert (rec.time_limit, rec.elapsed) == (1000 * 60, 60130)
    assert rec.max_rss == 13062 * MiB and rec.requested_memory is None and rec.node == "n-62-20-2"
    assert rec.raw_state == "EXIT (TERM_RUNLIMIT: job killed after reaching LSF run time limit)"
    assert "EXIT_CODE: 140" in rec.raw


def test_memory_kill_has_request_and_peak():
    rec = bjobs_accounting(records(ENDINGS)["30102"])
    assert (rec.state, rec.requested_memory, rec.max_rss, rec.signal) == ("out-of-memory", 2 * GiB, 2 * GiB, 2)
    verdict = diagnose(Evidence(accounting=dataclasses.asdict(rec), registered=True, executing=["t"]))
    assert verdict.cause == "memory-batch"


def test_bkill_is_cancelled_by_the_owner():
    rec = bjobs_accounting(records("bjobs_exit_owner_lsfclient.json")["12345678"])
    assert (rec.state, rec.cancelled_by, rec.exit_code) == ("cancelled", "the job's owner", None)


def test_done_job_is_completed_with_exit_0_and_its_numbers():
    rec = bjobs_accounting(records("bjobs_done_batcheuphoria.json")["22005"])
    assert (rec.state, rec.exit_code, rec.signal) == ("completed", 0, None)
    assert rec.max_rss == int(5.2 * GiB) and rec.time_limit == 600 and rec.elapsed == 1
    assert rec.node == "tbi-cn019" and rec.end == "Dec 28 19:56 L"


def test_status_reads_pending_reason_and_both_time_spellings():
    pend = bjobs_status(records("bjobs_pend_lsfclient.json")["12345679"])
    assert (pend.state, pend.reason) == ("pending", "New job is waiting for scheduling")
    run = bjobs_status(records("bjobs_running_balsam.json")["806290"])
    assert (run.state, run.elapsed, run.time_limit) == ("running", 16038, 1440 * 60)


@pytest.mark.parametrize("stat, reason, want", [
    ("PEND", "", "pending"), ("PSUSP", "", "pending"), ("RUN", "", "running"), ("SSUSP", "", "running"),
    ("DONE", "", "completed"), ("EXIT", "", "failed"), ("EXIT", "TERM_RUNLIMIT: job killed", "timeout"),
    ("EXIT", "TERM_MEMLIMIT: job killed", "out-of-memory"), ("EXIT", "TERM_SWAP: x", "out-of-memory"),
    ("EXIT", "TERM_ADMIN: job killed by root or LSF administrator", "cancelled"),
    ("EXIT", "TERM_PREEMPT: job killed after preemption", "preempted"), ("EXIT", "TERM_ZOMBIE: x", "node-fail"),
    ("EXIT", "TERM_CWD_NOTEXIST: x", "failed"), ("ZOMBI", "", "node-fail"), ("UNKWN", "", "unknown"),
    ("what", "", "unknown"),
])
def test_classify_bjobs_table(stat, reason, want):
    assert classify_bjobs(stat, reason) == want


def test_values():
    assert parse_lsf_memory("5.2 Gbytes") == int(5.2 * GiB) and parse_lsf_memory("522 MBytes") == 522 * MiB
    assert parse_lsf_memory("0 Mbytes") == 0 and parse_lsf_memory("2 G") == 2 * GiB and parse_lsf_memory("") is None
    assert parse_lsf_memory("4000") is None and parse_lsf_memory("4000", "mb") == 4000 * MiB
    assert parse_lsf_memory("lots") is None
    assert parse_lsf_duration("16038 second(s)") == 16038 and parse_lsf_duration("00:10:00") == 600
    assert parse_lsf_duration("1440.0", bare="minutes") == 86400 and parse_lsf_duration("600.0/hostA", bare="minutes") == 36000
    assert parse_lsf_duration("x:y") is None and parse_lsf_duration("") is None
    assert lsf_walltime(5400) == "01:30" and lsf_walltime(59) == "00:01" and lsf_walltime(86400 * 2) == "48:00"
    assert lsf_memory(1234567890, "mb") == "1235" and lsf_memory(2 * GiB, "kb") == "2147484"
    assert lsf_memory(2 * GiB, "GB") == "3"
    with pytest.raises(BatchError, match="lsf_units='mib': use one of kb, mb"):
        lsf_memory(1, "mib")
    assert parse_bsub(fixture("lsf", "bsub.txt")) == "771278"
    assert parse_bsub("Job <5> is submitted to queue <normal>.\n") == "5"


def test_lsf_units_from_lsf_conf(tmp_path):
    # The adapter reads lsf.conf's text through the reader deploy hands it (it stays pure).
    from hpc_cluster.adapters.lsf import LSFAdapter
    from hpc_cluster.deploy.batch_options import batch_options, read_text
    (tmp_path / "lsf.conf").write_text("LSF_UNIT_FOR_LIMITS=KB\n# later wins\nLSF_UNIT_FOR_LIMITS=MB\n")
    units = lambda env: LSFAdapter.job_options({}, read_text, env)["lsf_units"]  # noqa: E731
    assert units({"LSF_ENVDIR": str(tmp_path)}) == "mb"
    assert units({"LSF_ENVDIR": str(tmp_path / "none")}) == "kb"
    assert units({"LSF_CONFDIR": str(tmp_path)}) == "mb"
    assert LSFAdapter.job_options({"lsf_units": "gb"}, read_text, {"LSF_ENVDIR": str(tmp_path)}) == {"lsf_units": "gb"}
    # deploy asks the adapter: an LSF site's batch_options get the units, others' nothing of LSF's.
    v = {"batch": "lsf", "ncpus": 4, "mem": None, "lsf_units": None, "use_stdin": True, "job_cpu": None}
    assert batch_options(v, {"LSF_ENVDIR": str(tmp_path)}) == {"ncpus": 4, "use_stdin": True, "lsf_units": "mb"}
    assert batch_options({**v, "batch": "slurm", "job_cpu": 2}, {"LSF_ENVDIR": str(tmp_path)}) == {}


def test_malformed_outputs_are_errors_that_say_what_was_read():
    with pytest.raises(BatchError, match=r"not JSON .*first line: \['LSF is down.*LSF 10.1 or later"):
        parse_bjobs_json("LSF is down. Please wait ...\n")
    with pytest.raises(BatchError, match="no RECORDS list"):
        parse_bjobs_json('{"COMMAND": "bjobs"}')
    with pytest.raises(BatchError, match="without JOBID"):
        parse_bjobs_json('{"RECORDS": [{"STAT": "RUN"}]}')
    with pytest.raises(BatchError, match=r"bsub printed no job id \(expected 'Job <N> is submitted"):
        parse_bsub("Request aborted by esub. Job not submitted.\n")


def lsf_adapter(runner, **options) -> LSFAdapter:
    adapter = LSFAdapter(runner)
    adapter.configure({"lsf_units": "kb", **options})
    return adapter


def test_unknown_id_as_a_json_error_record_is_unknown():
    text = '{"COMMAND":"bjobs","JOBS":1,"RECORDS":[{"JOBID":"999","ERROR":"Job <999> is not found"}]}'
    adapter = lsf_adapter(ReplayRunner([Captured("bjobs", text, "", 255)]))
    assert adapter.status(["999"])["999"].state == "unknown" and adapter.accounting(["999"]) == {}


def test_bjobs_failing_for_another_reason_is_an_error():
    adapter = LSFAdapter(ReplayRunner([Captured("bjobs", "", "LSF daemon (LIM) not responding ... still trying", 255)]))
    with pytest.raises(BatchError, match=r"bjobs failed \(exit 255\): LSF daemon"):
        adapter.status(["5"])


def test_one_bjobs_call_for_all_ids_with_our_fields():
    runner = ReplayRunner([bjobs_output(ENDINGS)])
    lsf_adapter(runner).accounting(["8254049", "30102", "8254049"])
    (argv, _), = runner.calls
    assert argv[:3] == ["bjobs", "-a", "-o"] and "exit_reason" in argv[3] and argv[4:] == ["-json", "8254049", "30102"]


def test_render_memory_units_logs_and_refusals():
    script = lsf_adapter(ReplayRunner()).render(kit_spec(log_directory="/logs", working_directory="/w",
                                                 batch_options={"lsf_units": "mb"}))
    assert "#BSUB -e /logs/kit-job-%J.err\n#BSUB -o /logs/kit-job-%J.out\n#BSUB -q kit-queue\n" in script
    assert "#BSUB -M 2148\n#BSUB -W 01:30\n#BSUB -cwd /w\n" in script
    assert 'export HPC_CLUSTER_JOB_ID="$LSB_JOBID"' in script
    one = lsf_adapter(ReplayRunner()).render(kit_spec(cores=1))
    assert "#BSUB -n 1\n" in one and "span[hosts=1]" not in one
    # dask-jobqueue's ncpus and mem replace cores and memory in the request.
    own = lsf_adapter(ReplayRunner()).render(kit_spec(batch_options={"ncpus": 8, "mem": 10**9, "lsf_units": "gb"}))
    assert "#BSUB -n 8\n" in own and "#BSUB -M 1\n" in own
    with pytest.raises(BatchError, match="resource_spec is a PBS/SGE setting; on LSF"):
        lsf_adapter(ReplayRunner()).render(kit_spec(resource_spec="x"))
    with pytest.raises(BatchError, match="on LSF use ncpus="):
        lsf_adapter(ReplayRunner()).render(kit_spec(job_cpu=2))


def test_submit_through_a_file_when_not_on_stdin():
    runner = ReplayRunner([Captured("mktemp", "/tmp/hpc-cluster-abc.sh\n"), Captured("sh", ""), Captured("rm", ""),
                           Captured("bsub", fixture("lsf", "bsub.txt"))])
    adapter = lsf_adapter(runner, use_stdin=False)
    assert adapter.submit("#!/bin/sh\n") == "771278"
    assert [a[0] for a, _ in runner.calls] == ["mktemp", "sh", "bsub", "rm"]
    assert runner.calls[2] == (["bsub", "/tmp/hpc-cluster-abc.sh"], None)
