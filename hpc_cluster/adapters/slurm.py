"""SLURM: sbatch, scancel, squeue, sacct (scontrol when accounting is off), sinfo.

The adapter runs the commands; reading their output is slurm_text.py's (pure, tested on
outputs captured from a real SLURM). It batches: one command per call whatever the number
of jobs, because schedulers rate-limit RPCs and admins notice clients that poll per job.
"""

from __future__ import annotations

import math
import re
from typing import Sequence

from .base import AccountingRecord, BatchAdapter, BatchError, JobSpec, JobStatus, check_env_names, kept_directives
from .slurm_text import (ONLY_JOB_STATE_SINCE, SACCT_FIELDS, SINFO_ADDRESS_FORMAT, SQUEUE_FORMAT, SQUEUE_TAGGED_FORMAT,
                         accounting_disabled, check_job_mem, parse_sacct, parse_sbatch, parse_scontrol_job,
                         parse_sinfo_addresses, parse_slurm_version, parse_squeue, parse_squeue_states,
                         parse_squeue_tagged, sacct_starttime, sbatch_value, slurm_memory, status_from_accounting)
from ..units import WalltimeReading, format_walltime
from .options import AdapterOption

COMMAND_TIMEOUT = 60.0


class SLURMAdapter(BatchAdapter):
    name = "slurm"
    # squeue's REASON for jobs that wait on a person, not on the queue (SLURM's
    # job_reason.h / squeue(1) "JOB REASON CODES").
    never_starts = frozenset({"JobHeldUser", "JobHeldAdmin", "DependencyNeverSatisfied", "BadConstraints",
                              "InvalidAccount", "InvalidQOS", "AccountNotAllowed", "QOSNotAllowed",
                              "PartitionTimeLimit", "PartitionNodeLimit", "QOSMaxWallDurationPerJobLimit",
                              "AssocMaxWallDurationPerJobLimit"})
    template_name = "slurm.sh.j2"
    submit_command = "sbatch"
    cancel_command = "scancel"
    cluster_name = "SLURMCluster"
    multi_node = True
    # sbatch -t: a bare number is minutes, 'MM:SS' takes any minutes ('90:00'), days come first.
    walltime_reading = WalltimeReading(
        "SLURM", "SLURM's forms: minutes ('60'), 'MM:SS' ('90:00'), 'HH:MM:SS', 'D-HH', 'D-HH:MM', "
        "'D-HH:MM:SS', or units like '90m', '1h30m', '2d'", bare_minutes=True, days=True)
    # dask-jobqueue's SLURMCluster keywords (JobSpec.job_cpu / job_mem, fields of their own).
    keywords = (
        AdapterOption("job_cpu", "int > 0", "--cpus-per-task, instead of cores", example=8,
                      instead="resource_spec", per_pool=True),
        AdapterOption("job_mem", "str", "--mem as sbatch reads it ('100G'; '2GB' is 2G), instead of memory: the "
                      "workers' memory too, unless memory_limit", check=check_job_mem,
                      example="100G", instead="resource_spec", per_pool=True),
    )

    def template_context(self, spec: JobSpec) -> dict:
        check_env_names(spec.env)
        if spec.resource_spec:
            raise BatchError(f"resource_spec={spec.resource_spec!r} is a PBS/SGE setting; on SLURM add what "
                             "you need with job_extra_directives, e.g. ['--gres=gpu:1']")
        if spec.cores < 1:
            raise BatchError(f"cores={spec.cores!r}: a job needs at least one core")
        # SLURM limits are whole minutes: round up so the job gets at least what was asked.
        minutes = max(1, math.ceil(spec.walltime / 60))
        name = sbatch_value(spec.job_name)
        cpus = spec.job_cpu or spec.cores
        memory = spec.job_mem or slurm_memory(spec.memory)
        # dask-jobqueue's directives, in its order and spelling, each with its other spelling
        # for job_directives_skip; then ours.
        ours = [(f"#SBATCH -J {name}", f"#SBATCH --job-name={name}")]
        if spec.log_directory:
            log_dir = spec.log_directory.rstrip("/") or "/"
            # An array element's %j is a number of its own (its SLURM_JOB_ID), not the element
            # id we know it by: name its logs %A_%a (2013_4), as job_logs looks them up.
            job = "%A_%a" if spec.array_size else "%j"
            err, out = sbatch_value(f"{log_dir}/%x-{job}.err"), sbatch_value(f"{log_dir}/%x-{job}.out")
            ours += [(f"#SBATCH -e {err}", f"#SBATCH --error={err}"),
                     (f"#SBATCH -o {out}", f"#SBATCH --output={out}")]
        if spec.queue:
            ours.append((f"#SBATCH -p {sbatch_value(spec.queue)}", f"#SBATCH --partition={sbatch_value(spec.queue)}"))
        if spec.account:
            ours.append((f"#SBATCH -A {sbatch_value(spec.account)}", f"#SBATCH --account={sbatch_value(spec.account)}"))
        if spec.nodes > 1:
            # One task per node, each a worker set of `processes` (the template's srun loop);
            # --cpus-per-task and --mem are per node. --no-kill: a node that fails ends its own
            # step and workers, not the whole job (SLURM's default kills the job).
            ours += [(f"#SBATCH --nodes={spec.nodes}", f"#SBATCH -N {spec.nodes}"),
                     ("#SBATCH --ntasks-per-node=1",),
                     ("#SBATCH --no-kill", "#SBATCH -k")]
        else:
            ours.append(("#SBATCH -n 1", "#SBATCH --ntasks=1"))
        ours += [
            (f"#SBATCH --cpus-per-task={cpus}", f"#SBATCH -c {cpus}"),
            (f"#SBATCH --mem={memory}",),
            (f"#SBATCH -t {format_walltime(minutes * 60)}", f"#SBATCH --time={format_walltime(minutes * 60)}"),
            # A requeued job would come back under the same id with a stale worker; the job
            # manager submits its own replacements, and sacct keeps the real end (NODE_FAIL).
            ("#SBATCH --no-requeue",),
        ]

        if spec.working_directory:
            wd = sbatch_value(spec.working_directory)
            ours.append((f"#SBATCH --chdir={wd}", f"#SBATCH -D {wd}"))
        extra = [d if d.lstrip().startswith("#SBATCH") else f"#SBATCH {d.strip()}"
                 for d in spec.extra_directives]
        kept = kept_directives(ours, spec.directives_skip)
        if spec.array_size:
            # Never skipped: the job manager counts on one element per index it handed out.
            kept.append(f"#SBATCH --array=0-{spec.array_size - 1}")
        return {"directives": kept + extra,
                "slurm_walltime_seconds": minutes * 60,
                "srun_per_node": spec.nodes > 1, "node_cpus": cpus}

    # -- commands ------------------------------------------------------------------
    def _run(self, argv: list[str], input: str | None = None):
        return self.runner.run(argv, input=input, timeout=COMMAND_TIMEOUT, check=False)

    def submit(self, script: str, tag: str | None = None) -> str:
        """The job's id. `tag`: its comment (sbatch --comment; it wins over a --comment in the
        script), by which `tagged_jobs` finds it when sbatch's answer is lost."""
        result = self._run(["sbatch", "--parsable", *([f"--comment={tag}"] if tag else [])], input=script)
        if result.returncode != 0:
            raise BatchError(f"sbatch refused the job (exit {result.returncode}): "
                             f"{(result.stderr or result.stdout).strip()}")
        return parse_sbatch(result.stdout)

    def tagged_jobs(self, prefix: str) -> dict[str, tuple[JobStatus, str]]:
        """Our jobs in the queue (pending, running, completing) whose comment starts with
        `prefix`, with their comments: {id: (JobStatus, comment)}. One squeue of the user's
        jobs (--me: SLURM 20.11 and later)."""
        result = self._run(["squeue", "-h", "--me", "-o", SQUEUE_TAGGED_FORMAT])
        if result.returncode != 0:
            raise BatchError(f"squeue failed (exit {result.returncode}): {result.stderr.strip()}")
        return parse_squeue_tagged(result.stdout, prefix)

    supports_arrays = True
    array_index_variable = "SLURM_ARRAY_TASK_ID"

    def array_element_ids(self, array_id: str, count: int) -> list[str]:
        """sbatch --parsable prints the array's id (2013); its elements are 2013_0 .. 2013_<count-1>,
        names squeue, sacct and scancel all take."""
        return [f"{array_id}_{i}" for i in range(count)]

    def cancel(self, job_ids: Sequence[str]) -> None:
        if not job_ids:
            return
        result = self._run(["scancel", *job_ids])
        if result.returncode == 0:
            return
        # Jobs that already ended are not an error for us: the goal was that they stop.
        problems = [line for line in result.stderr.splitlines()
                    if line.strip() and not re.search(
                        r"Invalid job id|already completing or completed|Job/step already", line)]
        if problems:
            raise BatchError(f"scancel {' '.join(job_ids)} failed (exit {result.returncode}): "
                             + "; ".join(problems))

    def version(self) -> tuple[int, int, int] | None:
        """This SLURM's version, asked once (`squeue --version`); None when unreadable."""
        if not hasattr(self, "_version"):
            result = self._run(["squeue", "--version"])
            self._version = parse_slurm_version(result.stdout) if result.returncode == 0 else None
        return self._version

    def node_addresses(self, partition: str | None = None) -> list[str]:
        """The compute nodes' addresses (of `partition` when given), for the scheduler's choice
        of address (deploy/address.py); [] when sinfo fails."""
        argv = ["sinfo", "-h", "-N", "-o", SINFO_ADDRESS_FORMAT] + (["-p", partition] if partition else [])
        result = self._run(argv)
        return parse_sinfo_addresses(result.stdout) if result.returncode == 0 else []

    def _squeue(self, ids: list[str]):
        """One squeue for `ids`: --only-job-state where this SLURM has it (a lighter RPC, but
        states only: nodes, reasons and times then come from the registrations and sacct)."""
        argv = ["squeue", "-h", "-t", "all", "-j", ",".join(ids), "-o", SQUEUE_FORMAT]
        version = self.version() if getattr(self, "only_job_state", True) else None
        if version is not None and version >= ONLY_JOB_STATE_SINCE:
            result = self._run(["squeue", "--only-job-state", "-h", "-j", ",".join(ids), "-o", "%i|%T"])
            if result.returncode == 0 or "Invalid job id" in result.stderr:
                return result, parse_squeue_states
            self.only_job_state = False       # refused here after all: the full form from now on
        return self._run(argv), parse_squeue

    def status(self, job_ids: Sequence[str], within: float | None = None) -> dict[str, JobStatus]:
        """{id: JobStatus} from one squeue call; jobs squeue forgot come from one sacct call
        (`within`: seconds since the earliest of them was submitted, when known)."""
        if not job_ids:
            return {}
        ids = list(dict.fromkeys(job_ids))
        result, parse = self._squeue(ids)
        if result.returncode == 0:
            found = parse(result.stdout)
        elif "Invalid job id" in result.stderr:
            found = {}  # every id has left the controller (older SLURMs fail instead of omitting)
        else:
            raise BatchError(f"squeue failed (exit {result.returncode}): {result.stderr.strip()}")
        out = {i: found[i] for i in ids if i in found}
        missing = [i for i in ids if i not in found]
        if missing:
            for job_id, record in self.accounting(missing, within=within).items():
                out[job_id] = status_from_accounting(record)
        for job_id in ids:
            out.setdefault(job_id, JobStatus(job_id=job_id, state="unknown", raw_state=""))
        return out

    def accounting(self, job_ids: Sequence[str], within: float | None = None) -> dict[str, AccountingRecord]:
        """{id: AccountingRecord} from one sacct call (steps included); scontrol if sacct is off.
        `within` (seconds since the earliest was submitted) bounds what slurmdbd scans."""
        if not job_ids:
            return {}
        ids = list(dict.fromkeys(job_ids))
        window = ["--starttime", sacct_starttime(within)] if within is not None else []
        result = self._run(["sacct", "-P", *window, "-j", ",".join(ids), "--format=" + ",".join(SACCT_FIELDS)])
        if result.returncode == 0:
            records = parse_sacct(result.stdout)
        elif accounting_disabled(result.stderr):
            result = self._run(["scontrol", "-o", "show", "job", *([] if len(ids) > 1 else ids)])
            if result.returncode != 0 and "Invalid job id" not in result.stderr:
                raise BatchError(f"scontrol show job failed (exit {result.returncode}): "
                                 f"{result.stderr.strip()}")
            records = parse_scontrol_job(result.stdout)
        else:
            raise BatchError(f"sacct failed (exit {result.returncode}): {result.stderr.strip()}")
        return {r.job_id: r for r in records if r.job_id in ids}
