"""Job arrays (issue 18 point 5), adapter side: each array element is a job of its own.

SLURM on outputs captured from the real SLURM 22.05 here (tests/batch/slurm/capture_array_fixtures.py:
a held array's pending range `2012_[0-7]`, an array whose elements ended differently); PBS and
Grid Engine on outputs in their documented layouts (fixtures/*/SOURCES.md says which). The
job scripts are run by bash with the batch system's array variables set, so the worker's
index and job id are what the job would really compute.
"""

from __future__ import annotations

import dataclasses
import subprocess

import pytest

from hpc_cluster.adapters.base import BatchError, JobSpec
from hpc_cluster.adapters.pbs import PBSAdapter, parse_qsub as parse_pbs_qsub
from hpc_cluster.adapters.sge import SGEAdapter, expand_task_range, parse_qacct, parse_qstat_xml
from hpc_cluster.adapters.sge import parse_qsub as parse_sge_qsub
from hpc_cluster.adapters.slurm import SLURMAdapter
from hpc_cluster.adapters.slurm_text import expand_array_id, parse_sacct, parse_sbatch, parse_squeue
from hpc_cluster.deploy.remote import job_log_names
from hpc_cluster.scheduler.diagnosis import Evidence, diagnose
from hpc_cluster.testing.adapter_conformance import AdapterConformance, Captured, Ending, ReplayRunner
from helpers.fixtures import fixture, manifest

ARRAY = manifest("slurm")["array"]


def cause_of(record, executing=True) -> str:
    ev = Evidence(accounting=dataclasses.asdict(record), registered=True,
                  executing=["task"] if executing else [], job_id=record.job_id)
    return diagnose(ev).cause


# -- SLURM: captured ----------------------------------------------------------------------------
def test_expand_array_id():
    assert expand_array_id("2012_[0-3]") == ["2012_0", "2012_1", "2012_2", "2012_3"]
    assert expand_array_id("2012_[3,5]") == ["2012_3", "2012_5"]
    assert expand_array_id("2012_[0-1,4-5%2]") == ["2012_0", "2012_1", "2012_4", "2012_5"]   # %2: a throttle
    assert expand_array_id("2012_4") == ["2012_4"] and expand_array_id("2012") == ["2012"]
    with pytest.raises(BatchError, match="array range"):
        expand_array_id("2012_[3-]")


def test_squeue_pending_range_is_one_status_per_element():
    held = ARRAY["held"]
    got = parse_squeue(fixture("slurm", "array_squeue_pending.txt"))
    assert sorted(got) == [f"{held}_{i}" for i in range(8)]
    assert {(s.state, s.reason, s.time_limit) for s in got.values()} == {("pending", "JobHeldUser", 120)}
    # squeue -j 2012_3,2012_5 answers with the range form too: both ids are found in it.
    assert sorted(parse_squeue(fixture("slurm", "array_squeue_pending_some.txt"))) == [f"{held}_3", f"{held}_5"]


def test_squeue_elements_each_their_own_state():
    got = {k: v.state for k, v in parse_squeue(fixture("slurm", "array_squeue_elements.txt")).items()}
    assert got == {ARRAY["completed"]: "completed", ARRAY["exit3"]: "failed", ARRAY["oom"]: "out-of-memory",
                   ARRAY["cancelled"]: "cancelled", **{r: "running" for r in ARRAY["running"]}}


def test_sacct_keeps_element_ids_and_their_own_steps():
    records = {r.job_id: r for r in parse_sacct(fixture("slurm", "array_sacct_whole.txt"))}
    array = ARRAY["array"]
    assert sorted(records) == [f"{array}_{i}" for i in range(6)]
    for job_id, r in records.items():
        assert [s.step_id for s in r.steps] == ["batch"], job_id
        assert r.raw.splitlines()[0].startswith(f"{job_id}|") and f"{job_id}.batch|" in r.raw
    assert (records[ARRAY["oom"]].state, records[ARRAY["oom"]].signal) == ("out-of-memory", 125)
    assert records[ARRAY["cancelled"]].cancelled_by == "0"
    assert records[ARRAY["exit3"]].exit_code == 3
    assert {records[r].state for r in ARRAY["running"]} == {"running"}


def test_one_elements_oom_is_that_elements_death_only():
    records = {r.job_id: r for r in parse_sacct(fixture("slurm", "array_sacct_whole.txt"))}
    causes = {job_id: cause_of(r) for job_id, r in records.items() if r.final}
    causes.pop(ARRAY["completed"])      # a job that ended well says nothing of a worker's death
    assert causes == {ARRAY["exit3"]: "crash", ARRAY["oom"]: "memory-batch", ARRAY["cancelled"]: "cancelled"}
    # sacct -j ID_2,ID_4 (what the job manager asks for two elements) answers for those two alone.
    elements = parse_sacct(fixture("slurm", "array_sacct_elements.txt"))
    assert [r.job_id for r in elements] == [ARRAY["oom"], ARRAY["cancelled"]]


def test_a_pending_range_line_in_sacct_gives_each_element_a_record():
    text = ("JobID|JobName|State|ExitCode|ReqMem|AllocCPUS|MaxRSS|Elapsed|Timelimit|NodeList|Start|End\n"
            "77_[2-3]|w|PENDING|0:0|1G|1||00:00:00|00:10:00|None assigned|Unknown|Unknown\n")
    assert {r.job_id: r.state for r in parse_sacct(text)} == {"77_2": "pending", "77_3": "pending"}


def test_slurm_status_of_elements_reads_the_range_form():
    runner = ReplayRunner([Captured("squeue", fixture("slurm", "array_squeue_pending_some.txt")),
                           Captured("sacct", fixture("slurm", "array_sacct_elements.txt"))])
    held = ARRAY["held"]
    got = SLURMAdapter(runner).status([f"{held}_3", f"{held}_5"])
    assert {k: v.state for k, v in got.items()} == {f"{held}_3": "pending", f"{held}_5": "pending"}
    calls = [c for c in runner.calls if "--version" not in c[0]]     # the once-only version probe aside
    assert len(calls) == 1 and calls[0][0][:2] == ["squeue", "-h"]                 # no sacct needed


class TestSLURMArrayElements(AdapterConformance):
    """The test kit on the captured array: status, accounting and diagnosis per element."""

    adapter_class = SLURMAdapter
    entry_point = "slurm"
    script_must_contain = ("#SBATCH -J kit-job", "#SBATCH --mem=2G", "#SBATCH -t 01:30:00")
    submit_output = Captured("sbatch", fixture("slurm", "array_sbatch_parsable.txt"))
    submitted_job_id = ARRAY["held"]
    status_outputs = [Captured("squeue", fixture("slurm", "array_squeue_pending_some.txt")
                               + fixture("slurm", "array_squeue_elements.txt"))]
    status_expected = {f"{ARRAY['held']}_3": "pending", f"{ARRAY['held']}_5": "pending",
                       ARRAY["completed"]: "completed", ARRAY["oom"]: "out-of-memory",
                       ARRAY["cancelled"]: "cancelled", ARRAY["running"][0]: "running"}
    accounting_outputs = [Captured("sacct", fixture("slurm", "array_sacct_whole.txt"))]
    endings = [Ending(ARRAY["completed"], "completed", exit_code=0),
               Ending(ARRAY["exit3"], "failed", cause="crash", exit_code=3),
               Ending(ARRAY["oom"], "out-of-memory", cause="memory-batch", signal=125),
               Ending(ARRAY["cancelled"], "cancelled", cause="cancelled")]
    cancel_outputs = [Captured("scancel", "", "scancel: error: Kill job error on job id 2013_0: Job/step already "
                               "completing or completed\n", 1)]


# -- rendering: the element's worker index and id, computed by the job itself --------------------
def run_header(script: str, env: dict, tmp_path) -> str:
    """The script with its worker replaced by an echo of what it would start with, run by bash."""
    path = tmp_path / "job.sh"
    path.write_text(script)
    out = subprocess.run(["bash", str(path)], env={"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), **env},
                         capture_output=True, text=True, timeout=10, cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    return out.stdout.strip()


ECHO = 'echo "$HPC_CLUSTER_WORKER_INDEX $HPC_CLUSTER_JOB_ID"'


@pytest.mark.parametrize("adapter, env, directive, expected", [
    (SLURMAdapter(), {"SLURM_JOB_ID": "2019", "SLURM_ARRAY_JOB_ID": "2013", "SLURM_ARRAY_TASK_ID": "2"},
     "#SBATCH --array=0-3", "9 2013_2"),
    (PBSAdapter(), {"PBS_JOBID": "4120[2].pbs-head", "PBS_ARRAY_INDEX": "2"}, "#PBS -J 0-3", "9 4120[2].pbs-head"),
    (SGEAdapter(), {"JOB_ID": "12", "SGE_TASK_ID": "3"}, "#$ -t 1-4", "9 12.3"),
])
def test_an_array_element_computes_its_worker_index_and_id(adapter, env, directive, expected, tmp_path):
    spec = JobSpec(worker_command=ECHO, worker_index=7, array_size=4, job_array=True, working_directory=str(tmp_path))
    script = adapter.render(spec)
    assert script.count(directive) == 1 and adapter.array_index_variable in script
    assert run_header(script, env, tmp_path) == expected
    # job_directives_skip cannot drop the array directive: the elements would all be one job.
    skipped = adapter.render(spec.replace(directives_skip=["-J", "--array", "-t"]))
    assert directive in skipped
    # A single job renders as before: its index written in, no array directive.
    single = adapter.render(spec.replace(array_size=0))
    assert directive.split()[1] not in [line.split()[1] for line in single.splitlines()
                                        if line.startswith(("#SBATCH", "#PBS", "#$"))]
    assert "HPC_CLUSTER_WORKER_INDEX=7" in single


def test_slurm_array_logs_are_named_by_element():
    script = SLURMAdapter().render(JobSpec(worker_command="w", array_size=2, log_directory="/logs"))
    assert "#SBATCH -e /logs/%x-%A_%a.err" in script and "#SBATCH -o /logs/%x-%A_%a.out" in script
    names = ["dask-worker-2013_4.err", "dask-worker-2013_4.out", "dask-worker-2013_41.err", "dask-worker-2013.err"]
    assert job_log_names(names, "2013_4") == ["dask-worker-2013_4.err", "dask-worker-2013_4.out"]


def test_pbs_and_sge_element_logs():
    assert job_log_names(["w.o4120.3", "w.e4120.3", "w.o4120.31", "w.o4121.3"], "4120[3].pbs-head") == \
        ["w.e4120.3", "w.o4120.3"]
    assert job_log_names(["w.o12.3", "w.o12.31", "w.o13.3"], "12.3") == ["w.o12.3"]


def test_element_ids():
    assert SLURMAdapter().array_element_ids(parse_sbatch(fixture("slurm", "array_sbatch_parsable.txt")), 3) == \
        [f"{ARRAY['held']}_{i}" for i in range(3)]
    pbs_id = parse_pbs_qsub(fixture("pbs", "qsub_array.txt"))
    assert pbs_id == "4120[].pbs-head"
    assert PBSAdapter().array_element_ids(pbs_id, 2) == ["4120[0].pbs-head", "4120[1].pbs-head"]
    with pytest.raises(BatchError, match=r"<number>\[\]"):
        PBSAdapter().array_element_ids("4120.pbs-head", 2)
    sge_id = parse_sge_qsub(fixture("sge", "qsub_array.txt"))
    assert SGEAdapter().array_element_ids(sge_id, 4) == ["12.1", "12.2", "12.3", "12.4"]


# -- PBS: subjobs in qstat -x -f -F json (layout of real captures; fixtures/pbs/SOURCES.md) -------
def test_pbs_subjobs_status_and_accounting_per_element():
    runner = ReplayRunner([Captured("qstat", fixture("pbs", "openpbs_qstat_xf_json_subjobs.json")),
                           Captured("qdel", "")])
    ids = [f"4120[{i}].pbs-head" for i in range(4)]
    adapter = PBSAdapter(runner)
    assert {k: v.state for k, v in adapter.status(ids).items()} == dict(zip(ids, ["completed", "timeout",
                                                                                   "out-of-memory", "running"]))
    records = adapter.accounting(ids[:3])
    assert [cause_of(records[i]) for i in ids[1:3]] == ["walltime", "memory-batch"]
    assert records[ids[0]].exit_code == 0 and all(r.raw for r in records.values())
    assert runner.calls[0][0][:5] == ["qstat", "-x", "-f", "-F", "json"] and runner.calls[0][0][5:] == ids
    adapter.cancel([ids[3]])     # qdel takes a subjob's id: one element goes, not the array
    assert runner.calls[-1][0] == ["qdel", ids[3]]


# -- Grid Engine: tasks in qstat -xml and qacct -------------------------------------------------
def test_expand_task_range():
    assert expand_task_range("2-10:1") == list(range(2, 11))
    assert expand_task_range("1-7:2") == [1, 3, 5, 7]
    assert expand_task_range("8,9") == [8, 9] and expand_task_range("3") == [3]
    with pytest.raises(BatchError, match="array tasks"):
        expand_task_range("x-3")


def test_sge_qstat_xml_tasks_are_jobs_of_their_own():
    # (This capture is `qstat -xml -f`: the host is its Queue-List's, not in the job_list.)
    got = {s.job_id: s.state for s in parse_qstat_xml(fixture("sge", "qstat_xml_array_epam.txt"))}
    assert got["1"] == "running"                                          # no tasks: a plain job
    assert got["2.1"] == "running"                                        # a running task
    assert [got[f"2.{i}"] for i in range(2, 11)] == ["pending"] * 9
    assert sorted(k for k in got if k.startswith("3.")) == [f"3.{i}" for i in range(1, 6)]
    assert sorted(k for k in got if k.startswith("4.")) == ["4.8", "4.9"]
    assert "2" not in got and len(got) == 1 + 10 + 5 + 2


def test_sge_accounting_asks_qacct_for_the_task_and_judges_it_alone():
    text = fixture("sge", "qacct_array_tasks.txt")
    records = {r.job_id: r for r in parse_qacct(text)}
    assert sorted(records) == ["12.1", "12.3"]
    assert records["12.1"].state == "completed" and cause_of(records["12.3"]) == "walltime"
    runner = ReplayRunner([Captured("qstat", fixture("sge", "qstat_xml_empty.txt")), Captured("qacct", text)])
    got = SGEAdapter(runner).accounting(["12.3"])
    assert list(got) == ["12.3"] and got["12.3"].state == "timeout"
    assert ["qacct", "-j", "12", "-t", "3"] in [argv for argv, _ in runner.calls]


def test_torques_refusal_of_minus_J_names_the_setting():
    script = PBSAdapter().render(JobSpec(worker_command="w", array_size=2))
    runner = ReplayRunner([Captured("qsub", "", "qsub: invalid option -- 'J'\nusage: qsub [-a date_time] ...", 2)])
    with pytest.raises(BatchError, match="looks like Torque.*remove job_array"):
        PBSAdapter(runner).submit(script)
