"""PBS parsers, exit-status mapping, commands (with a scripted runner) and the job template.

Fixtures are real captured outputs or built from real formats; see fixtures/pbs/SOURCES.md.
"""

from __future__ import annotations

import json
import subprocess

import pytest

from hpc_cluster.adapters import get_adapter
from hpc_cluster.adapters.base import BatchError, JobSpec
from hpc_cluster.adapters.pbs import (
    PBSAdapter, classify_exit, format_pbs_memory, job_status_from_record, parse_hms,
    parse_pbs_size, parse_qstat_full, parse_qstat_full_attrs, parse_qstat_full_status,
    parse_qstat_json, parse_qstat_json_status, parse_qsub, sanitize_job_name)
from helpers.fakes import ScriptedRunner
from helpers.fixtures import bash_n, fixture

GiB = 1024**3


def by_id(records):
    return {r.job_id: r for r in records}


# -- qsub ----------------------------------------------------------------------------
@pytest.mark.parametrize("name, expected", [
    ("qsub_openpbs.txt", "4101.pbs-head"),
    ("qsub_torque.txt", "522083.barnacle.ucsd.edu"),
    ("qsub_array.txt", "4120[].pbs-head"),
])
def test_parse_qsub(name, expected):
    assert parse_qsub(fixture("pbs", name)) == expected


def test_parse_qsub_skips_warnings_before_the_id():
    assert parse_qsub("qsub: warning: something odd\n77.server\n") == "77.server"


def test_parse_qsub_rejects_an_error_message():
    with pytest.raises(BatchError, match="no job id"):
        parse_qsub(fixture("pbs", "qsub_error_stderr.txt"))


# -- units ---------------------------------------------------------------------------
@pytest.mark.parametrize("text, expected", [
    ("16gb", 16 * GiB), ("300mb", 300 * 1024**2), ("1023456kb", 1023456 * 1024),
    ("4b", 4), ("96GB", 96 * GiB), ("2kw", 2 * 1024 * 8), ("0kb", 0), ("16", 16),
    ("lots", None), (None, None),
])
def test_parse_pbs_size(text, expected):
    assert parse_pbs_size(text) == expected


@pytest.mark.parametrize("text, expected", [
    ("00:41:12", 2472), ("420:16:02", 420 * 3600 + 16 * 60 + 2), ("48:00:00", 172800),
    ("05:00", 300), ("90", 90), ("00:00:00", 0), ("soon", None), (None, None),
])
def test_parse_hms(text, expected):
    assert parse_hms(text) == expected


@pytest.mark.parametrize("nbytes, expected", [
    (16 * GiB, "16GB"), (16_000_000_000, "15GB"), (28_000_000_000, "27GB"), (10**9, "954MB"),
    (1, "1B"), (1024**2 + 1, "1025kB"), (5000, "5000B"), (10 * 1024**2 + 1, "11MB"), (20 * 1024, "20kB"),
])
def test_format_pbs_memory_is_dask_jobqueues_and_never_asks_for_less(nbytes, expected):
    # dask-jobqueue's rounding (whole GB from 10 GiB, MB from 10 MiB, kB from 10 KiB, all up).
    from dask_jobqueue.pbs import pbs_format_bytes_ceil
    text = format_pbs_memory(nbytes)
    assert text == expected == pbs_format_bytes_ceil(nbytes)
    assert parse_pbs_size(text) >= nbytes


# -- qstat -F json ----------------------------------------------------------------------
def test_openpbs_json_finished_jobs_map_to_states():
    recs = by_id(parse_qstat_json(fixture("pbs", "openpbs_qstat_xf_json_finished.json")))
    expected = {
        "4101.pbs-head": ("completed", 0, None),
        "4102.pbs-head": ("failed", 3, None),
        "4103.pbs-head": ("failed", 139, 11),          # shell 128+11: SIGSEGV inside
        "4104.pbs-head": ("timeout", -29, None),
        "4105.pbs-head": ("out-of-memory", -27, None),
        "4106.pbs-head": ("out-of-memory", -26, None),
        "4107.pbs-head": ("timeout", -28, None),
        "4108.pbs-head": ("cancelled", 271, 15),       # qdel of a running job
        "4109.pbs-head": ("cancelled", None, None),    # qdel while queued
    }
    assert {k: (r.state, r.exit_code, r.signal) for k, r in recs.items()} == expected
    assert all(r.final for r in recs.values())


def test_openpbs_json_fills_the_accounting_fields():
    rec = by_id(parse_qstat_json(fixture("pbs", "openpbs_qstat_xf_json_finished.json")))["4104.pbs-head"]
    assert rec.raw_state == "F Exit_status=-29"
    assert rec.elapsed == 30 * 60 + 9
    assert rec.time_limit == 30 * 60
    assert rec.requested_memory == 16 * GiB
    assert rec.max_rss == 3032128 * 1024
    assert rec.node == "node019"
    assert rec.start == "Tue Mar 12 13:04:41 2024"
    assert rec.end == "Tue Mar 12 13:34:50 2024"        # obittime, not mtime
    raw = json.loads(rec.raw)
    assert raw["4104.pbs-head"]["Exit_status"] == -29


def test_openpbs_json_active_jobs():
    text = fixture("pbs", "openpbs_qstat_xf_json_active.json")
    states = {r.job_id: (r.state, r.raw_state, r.final) for r in parse_qstat_json(text)}
    assert states == {"4110.pbs-head": ("pending", "Q", False),
                      "4111.pbs-head": ("running", "R", False),
                      "4112.pbs-head": ("pending", "H", False)}
    status = {s.job_id: s for s in parse_qstat_json_status(text)}
    assert status["4110.pbs-head"].reason == "Not Running: Insufficient amount of resource: ncpus "
    assert status["4111.pbs-head"].reason is None
    assert status["4111.pbs-head"].node == "node024"
    assert status["4111.pbs-head"].elapsed == 12 * 60 + 3


def test_real_pbspro_19_json_with_escaped_slashes():
    (rec,) = parse_qstat_json(fixture("pbs", "pbspro1928_qstat_xf_json_real.json"))
    assert (rec.job_id, rec.state, rec.exit_code) == ("4732778.login02", "completed", 0)
    assert rec.elapsed == 24 * 3600 + 5 * 60 + 32
    assert rec.time_limit == 48 * 3600
    assert rec.requested_memory == 96 * GiB
    assert rec.node == "node1299"                     # from "node1299\/0*48"
    assert rec.end == "Wed Mar 13 13:10:13 2024"      # no obittime in 19.2: mtime


def test_real_openpbs_20_json_running_jobs_without_mem_request():
    recs = parse_qstat_json(fixture("pbs", "openpbs2001_qstat_f_json_running_real.json"))
    assert [r.job_id for r in recs] == ["2007.vm-priboy", "2009.vm-priboy", "2010.vm-priboy"]
    assert {r.state for r in recs} == {"running"}
    assert recs[0].requested_memory is None           # select=1:ncpus=1 asks for none
    assert recs[0].time_limit is None
    assert recs[0].max_rss == 6436 * 1024


def test_unescaped_json_from_pbspro_is_repaired():
    text = fixture("pbs", "pbspro_qstat_json_unescaped.json")
    with pytest.raises(json.JSONDecodeError):
        json.loads(text)
    (rec,) = parse_qstat_json(text)
    assert rec.state == "running"
    assert rec.node == "gadi-cpu-clx-0412"
    job = json.loads(rec.raw)["41200311.gadi-pbs"]
    assert job["Submit_arguments"] == '-v MSG="hello world" job.sh'
    # A value that was escaped correctly must not be escaped twice.
    assert job["Variable_List"]["PBS_O_WORKDIR"] == '/scratch/ab12/dan/run "final"'


def test_json_without_jobs_is_empty_and_garbage_is_an_error():
    empty = '{\n    "timestamp":1750053827,\n    "pbs_version":"22.05.11",\n    "pbs_server":"x"\n}\n'
    assert parse_qstat_json(empty) == []
    assert parse_qstat_json("") == []
    with pytest.raises(BatchError, match="not JSON"):
        parse_qstat_json("qstat: cannot connect to server pbs (errno=15010)")


def test_select_memory_counts_chunks():
    doc = {"Jobs": {"1.s": {"job_state": "Q", "Resource_List": {"select": "2:ncpus=4:mem=8gb"}}}}
    (rec,) = parse_qstat_json(json.dumps(doc))
    assert rec.requested_memory == 16 * GiB


# -- qstat -f text ----------------------------------------------------------------------
def test_real_torque_outputs():
    recs = by_id(parse_qstat_full(fixture("pbs", "torque428_qstat_f_real.txt")))
    done = recs["522081.barnacle.ucsd.edu"]
    assert (done.state, done.raw_state, done.exit_code) == ("completed", "C exit_status=0", 0)
    assert done.start == "Fri Oct 20 04:27:38 2017"   # start_time
    assert done.end == "Fri Oct 20 04:28:05 2017"     # comp_time
    assert done.requested_memory == 4                 # "-l mem=4" really means 4 bytes
    late = recs["522083.barnacle.ucsd.edu"]
    assert (late.state, late.exit_code, late.elapsed, late.time_limit) == ("timeout", -11, 14, 1)
    assert late.max_rss == 3500 * 1024
    queued = recs["515916.barnacle.ucsd.edu"]
    assert (queued.state, queued.requested_memory, queued.node) == ("pending", 250 * GiB, None)
    running = recs["522059.barnacle.ucsd.edu"]
    assert (running.state, running.node, running.elapsed) == ("running", "brncl-31", 184)


def test_continuation_lines_join_without_separator():
    attrs = parse_qstat_full_attrs(fixture("pbs", "torque428_qstat_f_real.txt"))
    queued = attrs["515916.barnacle.ucsd.edu"]
    # The break falls inside words ("pita.deblu" + "r.error"): nothing may be added.
    assert queued["Output_Path"] == "barnacle.ucsd.edu:/home/amam7564/data/mice-quinoa/pita.deblur.error"
    assert queued["submit_args"].endswith("-l walltime=48:00:00,nodes=1:ppn=32,mem=250gb -N pita.deblur")
    path = attrs["522083.barnacle.ucsd.edu"]["Variable_List"]
    assert "/usr/local/bin:/bin:/usr/bin" in path and "/opt/gold/2.2.0.5/sbin" in path
    assert "\t" not in path


def test_constructed_torque_codes():
    recs = by_id(parse_qstat_full(fixture("pbs", "torque_qstat_f.txt")))
    got = {k.split(".")[0]: (r.state, r.exit_code, r.signal) for k, r in recs.items()}
    assert got == {"523101": ("out-of-memory", -10, None),
                   "523102": ("cancelled", 271, 15),
                   "523103": ("failed", 139, 11),
                   "523104": ("pending", None, None),
                   "523105": ("completed", 0, None)}
    assert recs["523105.barnacle.ucsd.edu"].node == "brncl-20"   # first of a multi-host job


def test_pbspro_text_with_older_271_kills():
    recs = by_id(parse_qstat_full(fixture("pbs", "pbspro_qstat_xf.txt")))
    failed = recs["10.pbsworks"]
    assert (failed.state, failed.exit_code, failed.signal) == ("failed", 127, None)
    assert failed.raw_state == "F Exit_status=127"
    assert "Job Id: 10.pbsworks" in failed.raw and "run_version = 1" in failed.raw
    assert "Job Id: 2201" not in failed.raw
    # 271 = 256 + SIGTERM: the limits decide what killed it.
    assert recs["2201.pbs01"].state == "timeout"           # 02:00:09 used of 02:00:00
    assert recs["2202.pbs01"].state == "out-of-memory"     # 8561432kb used of 8gb
    assert recs["2203.pbs01"].state == "cancelled"         # substate 91: deleted
    assert recs["2201.pbs01"].signal == 15


def test_text_status():
    status = {s.job_id: s for s in parse_qstat_full_status(fixture("pbs", "torque428_qstat_f_real.txt"))}
    assert status["515916.barnacle.ucsd.edu"].state == "pending"
    assert status["522083.barnacle.ucsd.edu"].raw_state == "C"
    assert status["522083.barnacle.ucsd.edu"].state == "timeout"


def test_the_same_job_reads_the_same_from_json_and_text():
    """The simulator prints both; a real OpenPBS does too. One job, two formats, one record."""
    job = json.loads(fixture("pbs", "openpbs_qstat_xf_json_finished.json"))["Jobs"]["4105.pbs-head"]
    lines = ["Job Id: 4105.pbs-head"]
    for key, value in job.items():
        if key == "Variable_List":
            lines.append(f"    {key} = " + ",".join(f"{k}={v}" for k, v in value.items()))
        elif isinstance(value, dict):
            lines += [f"    {key}.{k} = {v}" for k, v in value.items()]
        else:
            lines.append(f"    {key} = {value}")
    (from_text,) = parse_qstat_full("\n".join(lines) + "\n")
    (from_json,) = [r for r in parse_qstat_json(fixture("pbs", "openpbs_qstat_xf_json_finished.json"))
                    if r.job_id == "4105.pbs-head"]
    from_text.raw = from_json.raw = ""
    assert from_text == from_json


# -- the exit-status table ----------------------------------------------------------------
@pytest.mark.parametrize("status, torque, kw, expected", [
    (0, False, {}, ("completed", None)),
    (1, False, {}, ("failed", None)),
    (134, False, {}, ("failed", 6)),                  # SIGABRT through the shell
    (137, True, {}, ("failed", 9)),
    (-29, False, {}, ("timeout", None)),
    (-11, False, {}, ("node-fail", None)),            # OpenPBS: JOB_EXEC_RERUN
    (-11, True, {}, ("timeout", None)),               # Torque: walltime
    (-10, False, {}, ("boot-fail", None)),            # OpenPBS: bad uid
    (-10, True, {}, ("out-of-memory", None)),         # Torque: memory
    (-1, False, {}, ("boot-fail", None)),
    (-12, False, {}, ("preempted", None)),            # checkpointed and killed
    (-99, False, {}, ("failed", None)),
    (271, False, {"elapsed": 130, "time_limit": 120}, ("timeout", 15)),
    (271, False, {"max_rss": 9 * GiB, "mem_limit": 8 * GiB}, ("out-of-memory", 15)),
    (271, False, {"comment": "=>> PBS: job killed: walltime 152 exceeded limit 120"}, ("timeout", 15)),
    (271, False, {"comment": "Job run at Mon on (n1:ncpus=8:mem=8388608kb) and failed"},
     ("cancelled", 15)),
    (271, False, {"deleted": True, "elapsed": 500, "time_limit": 120}, ("cancelled", 15)),
    (265, False, {}, ("cancelled", 9)),
    (267, False, {}, ("failed", 11)),                 # the top shell itself segfaulted
    (None, False, {"deleted": True}, ("cancelled", None)),
    (None, False, {}, ("failed", None)),
])
def test_classify_exit(status, torque, kw, expected):
    assert classify_exit(status, torque=torque, **kw) == expected


def test_cancelled_by_is_taken_from_the_comment_when_present():
    doc = {"Jobs": {"9.s": {"job_state": "F", "substate": 91, "Exit_status": 271,
                            "comment": "Job deleted at request of root@pbs-head"}}}
    (rec,) = parse_qstat_json(json.dumps(doc))
    assert (rec.state, rec.cancelled_by) == ("cancelled", "root@pbs-head")


def test_job_status_from_record_keeps_the_letter():
    (rec,) = [r for r in parse_qstat_json(fixture("pbs", "openpbs_qstat_xf_json_finished.json"))
              if r.job_id == "4104.pbs-head"]
    status = job_status_from_record(rec)
    assert (status.state, status.raw_state, status.time_limit) == ("timeout", "F", 1800)


# -- commands through a scripted runner ------------------------------------------------
def test_submit_pipes_the_script_to_qsub():
    runner = ScriptedRunner([(["qsub"], (0, "4101.pbs-head\n", ""))])
    assert PBSAdapter(runner).submit("#!/bin/bash\necho hi\n") == "4101.pbs-head"
    assert runner.calls == [(["qsub"], "#!/bin/bash\necho hi\n")]


def test_submit_error_names_qsubs_complaint():
    runner = ScriptedRunner([(["qsub"], (2, "", fixture("pbs", "qsub_error_stderr.txt")))])
    with pytest.raises(BatchError, match="Resource_List.walltime"):
        PBSAdapter(runner).submit("x")


def test_status_is_one_json_call_and_unknown_ids_are_unknown():
    out = fixture("pbs", "openpbs_qstat_xf_json_active.json")
    runner = ScriptedRunner([(["qstat"], (153, out, "qstat: Unknown Job Id 9999.pbs-head\n"))])
    got = PBSAdapter(runner).status(["4110.pbs-head", "4111", "9999.pbs-head"])
    assert len(runner.calls) == 1
    assert runner.calls[0][0] == ["qstat", "-x", "-f", "-F", "json",
                                  "4110.pbs-head", "4111", "9999.pbs-head"]
    assert got["4110.pbs-head"].state == "pending"
    assert got["4111"].state == "running"          # matched on the sequence number
    assert got["9999.pbs-head"].state == "unknown"


def test_falls_back_to_text_when_json_is_not_supported_and_remembers():
    usage = "qstat: invalid option -- 'F'\nusage: qstat [-f [-1]] [-W site_specific] [-x]\n"
    runner = ScriptedRunner([
        (["qstat", "-x", "-f", "-F", "json"], (2, "", usage)),
        (["qstat", "-f"], (0, fixture("pbs", "torque428_qstat_f_real.txt"), "")),
    ])
    adapter = PBSAdapter(runner)
    recs = adapter.accounting(["522083.barnacle.ucsd.edu", "522081.barnacle.ucsd.edu"])
    assert recs["522083.barnacle.ucsd.edu"].state == "timeout"
    assert recs["522081.barnacle.ucsd.edu"].state == "completed"
    adapter.status(["522059.barnacle.ucsd.edu"])
    assert [c[0][:3] for c in runner.calls] == [["qstat", "-x", "-f"], ["qstat", "-f",
                                                "522083.barnacle.ucsd.edu"], ["qstat", "-f",
                                                "522059.barnacle.ucsd.edu"]]


def test_qstat_connection_error_raises():
    runner = ScriptedRunner([(["qstat"], (255, "", "qstat: cannot connect to server pbs (errno=15010)\n"))])
    with pytest.raises(BatchError, match="cannot connect"):
        PBSAdapter(runner).accounting(["1.pbs"])


def test_cancel_is_one_qdel_and_ignores_finished_jobs():
    runner = ScriptedRunner([(["qdel"], (35, "", "qdel: Job has finished 3.s\n"))])
    PBSAdapter(runner).cancel(["1.s", "2.s", "3.s"])
    assert runner.calls == [(["qdel", "1.s", "2.s", "3.s"], None)]
    bad = ScriptedRunner([(["qdel"], (159, "", "qdel: Unauthorized Request  1.s\n"))])
    with pytest.raises(BatchError, match="Unauthorized"):
        PBSAdapter(bad).cancel(["1.s"])


def test_get_adapter_returns_pbs():
    adapter = get_adapter("PBS", runner=ScriptedRunner([]))
    assert isinstance(adapter, PBSAdapter) and adapter.name == "pbs"


# -- the job template ------------------------------------------------------------------
def render(spec: JobSpec, **adapter_kw) -> str:
    return PBSAdapter(ScriptedRunner([]), **adapter_kw).render(spec)


def pbs_lines(script: str) -> list[str]:
    return [line for line in script.splitlines() if line.startswith("#PBS")]


SPECS = [
    JobSpec(worker_command="python3 -m hpc_cluster.worker tcp://10.0.0.1:8786"),
    JobSpec(worker_command="python3 -m hpc_cluster.worker tcp://h:1 --name 'w 1'",
            job_name="dask worker #1", cores=8, memory=16 * GiB, walltime=90 * 60,
            queue="workq", account="proj01", log_directory="/scratch/logs/",
            env={"MSG": "it's \"quoted\" $HOME", "OMP_NUM_THREADS": "1"},
            prologue=["module load python/3.11", "source activate env"],
            epilogue=["echo done"], working_directory="/scratch/my dir",
            extra_directives=["-l place=excl", "#PBS -m n"]),
    JobSpec(worker_command="run", job_name="x", memory=16_000_000_000, walltime=3 * 86400),
]


@pytest.mark.parametrize("spec", SPECS)
def test_rendered_scripts_pass_bash_n(spec):
    script = render(spec)
    assert script.startswith("#!/usr/bin/env bash\n")
    bash_n(script)
    assert spec.worker_command in script
    assert 'export HPC_CLUSTER_JOB_ID="$PBS_JOBID"' in script
    assert f"export HPC_CLUSTER_JOB_WALLTIME={spec.walltime}" in script


def test_directives_come_from_the_spec():
    lines = pbs_lines(render(SPECS[1]))
    # dask-jobqueue's order and spelling, then the user's extra directives.
    assert lines == ["#PBS -N dask-worker-1",
                     "#PBS -q workq",
                     "#PBS -A proj01",
                     "#PBS -l select=1:ncpus=8:mem=16GB",
                     "#PBS -l walltime=01:30:00",
                     "#PBS -e /scratch/logs/",
                     "#PBS -o /scratch/logs/",
                     "#PBS -l place=excl",
                     "#PBS -m n"]
    assert pbs_lines(render(SPECS[2]))[1:3] == ["#PBS -l select=1:ncpus=1:mem=15GB",
                                                "#PBS -l walltime=72:00:00"]


def test_env_and_working_directory_are_quoted():
    script = render(SPECS[1])
    assert "cd '/scratch/my dir' || exit 1" in script
    out = subprocess.run(["bash", "-c", "\n".join(l for l in script.splitlines()
                                                  if l.startswith("export MSG")) + '\nprintf %s "$MSG"'],
                         capture_output=True, text=True, env={"HOME": "/h", "PATH": "/usr/bin:/bin"})
    assert out.stdout == "it's \"quoted\" $HOME"
    assert script.index("module load python/3.11") < script.index(SPECS[1].worker_command) \
        < script.index("echo done")


def test_default_working_directory_is_the_submit_directory():
    assert 'cd "${PBS_O_WORKDIR:-$PWD}"' in render(SPECS[0])


def test_directives_skip_removes_only_matching_built_in_lines():
    spec = SPECS[1].replace(directives_skip=["select=", "-A "])
    lines = pbs_lines(render(spec))
    assert not any("select=" in l or l.startswith("#PBS -A") for l in lines)
    assert "#PBS -l walltime=01:30:00" in lines and "#PBS -l place=excl" in lines
    # Extra directives are the user's own: a skip never removes them.
    spec = SPECS[1].replace(directives_skip=["place"])
    assert "#PBS -l place=excl" in pbs_lines(render(spec))


@pytest.mark.parametrize("name, expected", [
    ("hpc-cluster", "hpc-cluster"),
    ("a-very-long-job-name-indeed", "a-very-long-job"),
    ("1st job", "j1st-job"),
    ("dask worker #1", "dask-worker-1"),
    ("", "hpc-cluster"),
])
def test_job_names_are_sanitized(name, expected):
    got = sanitize_job_name(name)
    assert got == expected
    assert len(got) <= 15 and got[0].isalpha()


def test_resource_spec_override_for_torque():
    spec = JobSpec(worker_command="w", cores=4, memory=16 * GiB, resource_spec="nodes=1:ppn={cores},mem={memory}")
    lines = pbs_lines(render(spec))
    assert "#PBS -l nodes=1:ppn=4,mem=16GB" in lines
    assert not any("select=" in line for line in lines)
    with pytest.raises(BatchError, match=r"resource_spec='nodes=1:ppn=\{ncpus\}'.*\{cores\}, \{memory\}"):
        render(spec.replace(resource_spec="nodes=1:ppn={ncpus}"))


def test_bad_env_name_is_refused():
    with pytest.raises(BatchError, match="not a valid environment variable"):
        render(JobSpec(worker_command="w", env={"BAD-NAME": "1"}))


def test_site_template_file(tmp_path):
    site = tmp_path / "site.sh.j2"
    site.write_text("#!/bin/bash\n{% for d in directives %}{{ d }}\n{% endfor %}"
                    "#PBS -W group_list=site\nexec {{ worker_command }}\n")
    script = render(JobSpec(worker_command="python3 -m w", template=str(site)))
    bash_n(script)
    assert pbs_lines(script)[-1] == "#PBS -W group_list=site"
    assert script.rstrip().endswith("exec python3 -m w")
    with pytest.raises(BatchError, match="no such file"):
        render(JobSpec(worker_command="w", template=str(tmp_path / "missing.j2")))


# The body behaves as SLURM's does (tests/unit/adapters/test_slurm_template.py): run it with bash.
def run_script(script: str, cwd) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", "-c", script], capture_output=True, text=True, cwd=cwd,
                          env={"PATH": "/usr/bin:/bin", "PBS_JOBID": "77.pbs-head"})


def test_without_an_epilogue_the_worker_is_execed():
    script = render(SPECS[0])
    assert f"exec {SPECS[0].worker_command}\n" in script
    assert script.rstrip().endswith(f"exec {SPECS[0].worker_command}")


def test_epilogue_runs_and_keeps_worker_status(tmp_path):
    marker = tmp_path / "epilogue-ran"
    spec = JobSpec(worker_command="bash -c 'exit 7'", prologue=["echo prologue"],
                   epilogue=[f"touch {marker}"])
    script = render(spec)
    assert "exec " not in script
    bash_n(script)
    proc = run_script(script, tmp_path)
    assert proc.returncode == 7 and marker.exists() and "prologue" in proc.stdout


def test_failing_prologue_stops_the_job(tmp_path):
    marker = tmp_path / "worker-ran"
    epilogue = tmp_path / "epilogue-ran"
    for epi in ([], [f"touch {epilogue}"]):
        script = render(JobSpec(worker_command=f"touch {marker}", prologue=["true", "false", "echo after"],
                                epilogue=epi))
        proc = run_script(script, tmp_path)
        assert proc.returncode != 0 and not marker.exists() and not epilogue.exists()
        assert "after" not in proc.stdout


def test_deadline_variables_are_set_before_the_prologue(tmp_path):
    # The prologue sees them (the clock started before it) and so does the worker.
    script = render(JobSpec(worker_command='echo "worker $HPC_CLUSTER_JOB_ID $HPC_CLUSTER_JOB_WALLTIME"',
                            walltime=61, prologue=['echo "prologue $HPC_CLUSTER_JOB_START"']))
    lines = run_script(script, tmp_path).stdout.split("\n")
    assert int(lines[0].split()[1]) > 1_600_000_000
    assert lines[1] == "worker 77.pbs-head 61"
