"""The HTCondor adapter on outputs captured from public sources (fixtures/htcondor/SOURCES.md):
the adapter kit, then the pure parsers one by one, malformed output included."""

from __future__ import annotations

import dataclasses
import json

import pytest

from hpc_cluster.adapters.base import BatchError
from hpc_cluster.adapters.htcondor import (HTCondorAdapter, ad_accounting, ad_status, classify_ad, environment_string,
                                           parse_ads_json, parse_condor_submit, quote_argument_string)
from hpc_cluster.scheduler.diagnosis import Evidence, diagnose
from hpc_cluster.testing.adapter_conformance import (WORKER_COMMAND, AdapterConformance, Captured, Ending, ReplayRunner,
                                                     kit_spec)
from helpers.fixtures import fixture

MiB = 2**20
HISTORY = "condor_history_endings_assembled.json"


def ads(name: str) -> dict:
    return {f"{a['ClusterId']}.{a['ProcId']}": a for a in json.loads(fixture("htcondor", name))}


class KitHTCondor(HTCondorAdapter):
    """HTCondor needs disk= (as dask-jobqueue's): the kit's job asks for 1 GB."""

    def __init__(self, runner=None):
        super().__init__(runner)
        self.configure({"disk": 10**9})


EMPTY_Q = Captured("condor_q", "")


class TestHTCondor(AdapterConformance):
    adapter_class = HTCondorAdapter
    entry_point = "htcondor"
    script_must_contain = ("batch_name = kit-job", "RequestCpus = 3", "RequestMemory = 2048", "RequestDisk = 976563",
                           "MY.HpcClusterWalltime = 5400", "accounting_group = kit-account", "executable = /bin/sh",
                           "\nqueue\n")
    submit_output = Captured("condor_submit", fixture("htcondor", "condor_submit.txt"))
    submitted_job_id = "19.0"
    status_outputs = [Captured("condor_q", fixture("htcondor", "condor_q_running_clas12.json"), match="3472942.81"),
                      Captured("condor_q", fixture("htcondor", "condor_q_idle_assembled.json"), match="1208.0"),
                      EMPTY_Q, Captured("condor_history", fixture("htcondor", HISTORY))]
    status_expected = {"3472942.81": "running", "1208.0": "pending", "1202.0": "completed", "1206.0": "timeout"}
    accounting_outputs = [Captured("condor_q", fixture("htcondor", "condor_q_held_memory.json"), match="1201.0"),
                          Captured("condor_rm", ""), Captured("condor_history", fixture("htcondor", HISTORY))]
    endings = [
        Ending("1201.0", "out-of-memory", cause="memory-batch", exit_code=None, signal=None),
        Ending("1202.0", "completed", exit_code=0, signal=None),
        Ending("1203.0", "failed", cause="crash", exit_code=None, signal=11),
        Ending("1204.0", "failed", cause="crash", exit_code=1, signal=None),
        Ending("1204.0", "failed", cause="startup", registered=False),
        Ending("1205.0", "cancelled", cause="cancelled"),
        Ending("1206.0", "timeout", cause="walltime"),
        Ending("1207.0", "out-of-memory", cause="memory-batch"),
    ]
    cancel_outputs = [Captured("condor_rm", fixture("htcondor", "condor_rm_finished_stdout.txt"), "", 1)]

    def adapter(self, outputs=()):
        runner = ReplayRunner(outputs)
        return KitHTCondor(runner=runner), runner

    def test_status_maps_states_and_answers_every_id(self):
        # condor_q answers per query; the captures are one job each, so ask each alone.
        adapter = self.adapter([*self.status_outputs])[0]
        for job_id, want in self.status_expected.items():
            assert adapter.status([job_id])[job_id].state == want, job_id
        assert adapter.status(["999999999.0"])["999999999.0"].state == "unknown"

    def test_directives_skip_and_extra(self):
        # A submit description has no directive prefix: an extra is a submit command of its own,
        # after ours (so it overrides ours), and a skip drops our command by its name.
        adapter = self.adapter()[0]
        directives = adapter.template_context(kit_spec())["directives"]
        skipped = adapter.template_context(kit_spec(directives_skip=["RequestDisk"]))["directives"]
        assert any(d.startswith("RequestDisk") for d in directives) and not any(d.startswith("RequestDisk") for d in skipped)
        extra = adapter.template_context(kit_spec(extra_directives=["RequestMemory = 9999"]))["directives"]
        assert extra[-1] == "RequestMemory = 9999" and extra.index("RequestMemory = 2048") < len(extra) - 1


def test_the_job_script_is_one_sh_argument_with_condor_quoting():
    script = KitHTCondor(ReplayRunner()).render(kit_spec(worker_command=WORKER_COMMAND + ' --x "a b" --y \'c\''))
    (arguments,) = [line for line in script.splitlines() if line.startswith("arguments = ")]
    assert arguments.startswith("arguments = \"-c 'export HPC_CLUSTER_JOB_START=$(DOLLAR)(date +%s); ")
    assert "export HPC_CLUSTER_JOB_ID=$(ClusterId).$(ProcId); " in arguments          # condor fills the id in
    assert "; set -e; module load kit-python; set +e; " in arguments
    assert '--x ""a b"" --y \'\'c\'\'' in arguments                                   # quotes doubled
    assert arguments.endswith("; echo kit-epilogue; exit $HPC_CLUSTER_WORKER_STATUS'\"")
    assert 'environment = "KIT_VARIABLE=\'kit value\'"' in script
    assert script.index("universe = vanilla") < script.index("arguments = ") < script.index("\nqueue\n")
    no_epilogue = KitHTCondor(ReplayRunner()).render(kit_spec(epilogue=[]))
    assert f"; exec {WORKER_COMMAND}'\"" in no_epilogue


def test_quoting_helpers():
    assert quote_argument_string("echo \"it's\" $(x)") == "'echo \"\"it''s\"\" $(DOLLAR)(x)'"
    assert environment_string({"A": "x y", "B": "it's"}) == "A='x y' B='it''s'"


def test_held_for_memory_is_out_of_memory_with_request_and_usage_and_is_removed():
    runner = ReplayRunner([Captured("condor_q", fixture("htcondor", "condor_q_held_memory.json")),
                           Captured("condor_rm", "")])
    adapter = KitHTCondor(runner)
    assert adapter.status(["1201.0"])["1201.0"].state == "out-of-memory"
    assert (["condor_rm", "1201.0"], None) in runner.calls               # else it sits held for ever
    rec = adapter.accounting(["1201.0"])["1201.0"]
    assert (rec.requested_memory, rec.max_rss, rec.elapsed, rec.time_limit) == (10624 * MiB, 404 * MiB, 95, 3600)
    assert rec.raw_state.startswith("Held; hold 34: Error from slot1_1@testpool-gpu-20250425144144.novalocal: Job has gone")
    assert rec.node == "testpool-gpu-20250425144144.novalocal"
    assert sum(argv[0] == "condor_rm" for argv, _ in runner.calls) == 1   # removed once


def test_history_endings():
    h = ads(HISTORY)
    rm = ad_accounting(h["1205.0"])
    assert (rm.state, rm.cancelled_by, rm.raw_state) == ("cancelled", "tkadelka", "Removed; removed: via condor_rm (by user tkadelka)")
    wall = ad_accounting(h["1206.0"])
    assert (wall.state, wall.elapsed, wall.time_limit, wall.max_rss) == ("timeout", 3655, 3600, 480 * MiB)
    oom = ad_accounting(h["1207.0"])
    assert (oom.state, oom.requested_memory, oom.cancelled_by) == ("out-of-memory", 2048 * MiB, None)
    seg = ad_accounting(h["1203.0"])
    assert (seg.state, seg.signal, seg.exit_code, seg.raw_state) == ("failed", 11, None, "Completed; signal 11")
    ok = ad_accounting(h["1202.0"])
    assert (ok.state, ok.exit_code, ok.start, ok.end) == ("completed", 0, "1745590000", "1745590120")


def test_a_real_running_ad_from_condor_q():
    (ad,) = json.loads(fixture("htcondor", "condor_q_running_clas12.json"))
    st = ad_status(ad)
    assert (st.job_id, st.state, st.node, st.elapsed) == ("3472942.81", "running", "CRUSH-OSG-C7-10-5-219-52", 37327)
    rec = ad_accounting(ad)
    # MemoryUsage is an unevaluated expression in -json output: the RSS (KiB) is used instead.
    assert rec.requested_memory == 1741 * MiB and rec.max_rss == 1750000 * 1024
    # Its LastHoldReason is from an earlier, released hold (OnExitHold): not a memory hold.
    assert rec.state == "running"


@pytest.mark.parametrize("ad, want", [
    ({"JobStatus": 1}, ("pending", None)), ({"JobStatus": 2}, ("running", None)), ({"JobStatus": 7}, ("running", None)),
    ({"JobStatus": 5, "HoldReasonCode": 1, "HoldReason": "via condor_hold (by user alice)"}, ("pending", None)),
    ({"JobStatus": 5, "HoldReasonCode": 14, "HoldReason": "Error from slot1: Failed to open '/x' as initial working directory"}, ("failed", None)),
    ({"JobStatus": 5, "HoldReasonCode": 3, "HoldReason": "The job attribute PeriodicHold expression '(MemoryUsage > RequestMemory)' evaluated to TRUE"}, ("failed", None)),
    ({"JobStatus": 5, "HoldReasonCode": 26, "HoldReason": "Job has gone over memory limit of 2048 megabytes."}, ("out-of-memory", None)),
    ({"JobStatus": 4, "ExitBySignal": False, "ExitCode": 0}, ("completed", None)),
    ({"JobStatus": 4, "ExitBySignal": True, "ExitSignal": 9}, ("failed", 9)),
    ({"JobStatus": 3, "RemoveReason": "The job attribute PeriodicRemove expression 'JobRunCount > 3' evaluated to TRUE"}, ("failed", None)),
    ({"JobStatus": 9}, ("unknown", None)),
])
def test_classify_ad_table(ad, want):
    assert classify_ad(ad) == want


def test_malformed_outputs_are_errors_that_say_what_was_read():
    assert parse_condor_submit(fixture("htcondor", "condor_submit.txt")) == "19.0"
    with pytest.raises(BatchError, match="condor_submit printed no cluster id"):
        parse_condor_submit("ERROR: on Line 3 of submit file: ...\n")
    with pytest.raises(BatchError, match=r"condor_q -json printed something that is not JSON .*first line: \['-- Failed to fetch ads"):
        parse_ads_json("-- Failed to fetch ads from: <127.0.0.1:9618> : schedd\n")
    with pytest.raises(BatchError, match="not a list of job ads"):
        parse_ads_json('{"ClusterId": 1}')
    with pytest.raises(BatchError, match="without ClusterId/ProcId/JobStatus.*-attributes"):
        parse_ads_json('[{"ClusterId": 1}]')
    assert parse_ads_json("\n") == []


def test_command_extras_reach_every_command():
    runner = ReplayRunner([Captured("condor_submit", fixture("htcondor", "condor_submit.txt")), EMPTY_Q, Captured("condor_history", ""),
                           Captured("condor_rm", "")])
    adapter = KitHTCondor(runner)
    adapter.configure({"disk": 10**9, "submit_command_extra": ["-name", "s1"], "cancel_command_extra": ["-name", "s1"]})
    adapter.submit("x")
    adapter.status(["5.0"])
    adapter.cancel(["5.0"])
    assert [argv[:3] for argv, _ in runner.calls] == [["condor_submit", "-name", "s1"], ["condor_q", "-name", "s1"],
                                                      ["condor_history", "-name", "s1"], ["condor_rm", "-name", "s1"]]


def test_render_refusals_name_the_keyword():
    with pytest.raises(BatchError, match="HTCondor needs the disk each job asks for: give disk="):
        HTCondorAdapter(ReplayRunner()).render(kit_spec())
    with pytest.raises(BatchError, match="resource_spec is not an HTCondor setting"):
        KitHTCondor(ReplayRunner()).render(kit_spec(resource_spec="x"))


def test_diagnosis_of_a_held_memory_job_quotes_the_request():
    rec = ad_accounting(ads("condor_q_held_memory.json")["1201.0"])
    verdict = diagnose(Evidence(accounting=dataclasses.asdict(rec), registered=True, executing=["t"]))
    assert verdict.cause == "memory-batch"
