"""PBS (OpenPBS, PBS Professional, Torque): commands and pure parsers of their outputs.

One data source serves both `status` and `accounting`: `qstat -x -f -F json`, which on
OpenPBS/PBS Pro also lists finished jobs (job history) with their `Exit_status`. Torque
has no `-F json` (and its `-x` means XML), so we fall back to `qstat -f` text, where
Torque keeps completed jobs for `keep_completed` seconds as `job_state = C`.

Exit codes mean different things in the two families (OpenPBS -11 is "rerun", Torque
-11 is "walltime"), so every record is read in its dialect: Torque writes `exit_status`
in lower case and ends jobs in state C; OpenPBS/PBS Pro write `Exit_status` and state F.
See docs/pbs.md for the full table.
"""

from __future__ import annotations

import json
import math
import re
from typing import Sequence

from .base import (RESOURCE_SPEC, AccountingRecord, BatchAdapter, BatchError, JobSpec, JobStatus,
                   check_env_names, fill_resource_spec, kept_directives)
from ..units import WalltimeReading, format_walltime

# -- states ---------------------------------------------------------------------------
_STATE_MAP = {
    "Q": "pending", "H": "pending", "W": "pending", "T": "pending",
    # S/U: suspended jobs still hold their nodes; the worker is alive but frozen.
    "R": "running", "E": "running", "B": "running", "S": "running", "U": "running",
}
_FINAL_LETTERS = {"F", "C", "X"}   # X: a finished subjob of an array job

# OpenPBS / PBS Pro JOB_EXEC_* codes (src/include/job.h). Only the final ones matter:
# the requeue codes (-3 retry, -11 rerun, -15, -16, -18) normally send the job back
# to Q, so seeing one in a finished job means PBS gave up on starting it.
_OPENPBS_CODES = {
    -1: "boot-fail", -2: "boot-fail", -3: "boot-fail",
    -4: "node-fail", -5: "node-fail", -6: "node-fail", -7: "boot-fail",
    -10: "boot-fail", -11: "node-fail", -12: "preempted", -13: "boot-fail",
    -14: "node-fail", -15: "node-fail", -16: "boot-fail", -17: "boot-fail",
    -18: "node-fail", -19: "cancelled", -20: "node-fail", -21: "boot-fail",
    -22: "boot-fail", -23: "boot-fail",
    -24: "failed", -25: "failed",                 # ncpus burst / sum exceeded
    -26: "out-of-memory", -27: "out-of-memory",   # vmem / mem
    -28: "timeout", -29: "timeout",               # cput / walltime: a time limit either way
    -30: "boot-fail",
}
# Torque 6.1 table (Adaptive Computing KB "Explanation of Exit Codes").
_TORQUE_CODES = {
    -1: "boot-fail", -2: "boot-fail", -3: "boot-fail",
    -4: "node-fail", -5: "node-fail", -6: "node-fail", -7: "boot-fail",
    -8: "boot-fail", -9: "boot-fail",
    -10: "out-of-memory", -11: "timeout", -12: "timeout",
    -13: "boot-fail", -14: "boot-fail",
}
_KILL_SIGNALS = {9, 15}           # what the MOM sends to end a job (TERM, then KILL)
_SUBSTATE_TERMINATED = "91"       # OpenPBS history substate of a deleted (qdel) job


# -- small value parsers --------------------------------------------------------------
_SIZE_RE = re.compile(r"^\s*(\d+)\s*([kmgtp]?)([bw]?)\s*$", re.IGNORECASE)
_SIZE_SCALE = {"": 1, "k": 1024, "m": 1024**2, "g": 1024**3, "t": 1024**4, "p": 1024**5}


def parse_pbs_size(text: str | None) -> int | None:
    """Bytes for a PBS size: '16gb', '300mb', '1023456kb', '4b', '2kw' (PBS units are 1024-based)."""
    if text is None:
        return None
    m = _SIZE_RE.match(str(text))
    if not m:
        return None
    word = 8 if m.group(3).lower() == "w" else 1
    return int(m.group(1)) * _SIZE_SCALE[m.group(2).lower()] * word


def parse_hms(text: str | None) -> int | None:
    """Seconds for a PBS duration: 'HH:MM:SS' (hours may exceed 24), 'MM:SS' or plain seconds."""
    if text is None:
        return None
    parts = str(text).strip().split(":")
    try:
        nums = [int(float(p)) for p in parts]
    except ValueError:
        return None
    if not 1 <= len(nums) <= 3:
        return None
    seconds = 0
    for n in nums:
        seconds = seconds * 60 + n
    return seconds


def format_pbs_memory(nbytes: int) -> str:
    """PBS size for a request, rounded up as dask-jobqueue does (PBS's units are binary):
    whole GB from 10 GiB, MB from 10 MiB, kB from 10 KiB: 28GB -> '27GB', 1GB -> '954MB'."""
    for unit, size in (("GB", 2**30), ("MB", 2**20), ("kB", 2**10)):
        if nbytes >= 10 * size:
            return f"{math.ceil(nbytes / size)}{unit}"
    return f"{max(1, int(nbytes))}B"


def _first_host(exec_host: str | None) -> str | None:
    """'node01/0*4+node02/0*4' -> 'node01' (the mother superior, where the script runs)."""
    if not exec_host:
        return None
    return exec_host.split("+", 1)[0].split("/", 1)[0] or None


def _select_memory(select: str | None) -> int | None:
    """Total mem of a one-kind select statement '2:ncpus=4:mem=8gb' -> 16 GiB."""
    if not select or "+" in select:
        return None
    parts = select.split(":")
    count = int(parts[0]) if parts[0].isdigit() else 1
    for part in parts:
        if part.startswith("mem="):
            size = parse_pbs_size(part[4:])
            return size * count if size is not None else None
    return None


def _int(value) -> int | None:
    try:
        return int(str(value).strip())
    except (TypeError, ValueError):
        return None


# -- exit status ----------------------------------------------------------------------
# Who deleted a job is in the server log ("deleted at request of user@host"); some
# sites copy it into the comment, so take it from there when it is present.
_WHO_RE = re.compile(r"(?:at request of|deleted by|killed by)\s+([^\s,;]+)", re.IGNORECASE)


# The MOM's kill message ("=>> PBS: job killed: walltime 152 exceeded limit 120"), when a
# site copies it into the comment. Plain "mem" would also match "(node:mem=8gb)".
_WALL_TEXT = re.compile(r"killed: (walltime|cput)|(walltime|cput) \S+ exceeded limit")
_MEM_TEXT = re.compile(r"killed: v?mem|v?mem \S+ exceeded limit|memory (limit|exceeded)")


def _reached(used: int | None, limit: int | None) -> bool:
    return used is not None and limit is not None and limit > 0 and used >= limit


def classify_exit(exit_status: int | None, *, torque: bool, deleted: bool = False,
                  elapsed: int | None = None, time_limit: int | None = None,
                  max_rss: int | None = None, mem_limit: int | None = None,
                  comment: str = "") -> tuple[str, int | None]:
    """(state, signal) for a finished job's exit status. Pure; the table is in docs/pbs.md."""
    text = comment.lower()
    if exit_status is None:
        # OpenPBS keeps no exit status for a job deleted before it ran.
        return ("cancelled" if deleted else "failed"), None
    if exit_status == 0:
        return "completed", None
    if exit_status < 0:
        table = _TORQUE_CODES if torque else _OPENPBS_CODES
        return table.get(exit_status, "failed"), None
    if exit_status >= 256:
        # The MOM's own encoding: the top shell died of signal (status - 256). Older PBS
        # Pro and Torque report limit kills this way (271 = SIGTERM), so the limits decide.
        signal = exit_status - 256
        if signal in _KILL_SIGNALS:
            if deleted:
                return "cancelled", signal
            if _WALL_TEXT.search(text) or _reached(elapsed, time_limit):
                return "timeout", signal
            if _MEM_TEXT.search(text) or _reached(max_rss, mem_limit):
                return "out-of-memory", signal
            return "cancelled", signal
        return "failed", signal
    if exit_status > 128 and exit_status - 128 < 65:
        # The shell's 128+n: a command inside the script died of signal n.
        return ("cancelled" if deleted else "failed"), exit_status - 128
    return ("cancelled" if deleted else "failed"), None


# -- records from attribute dicts -------------------------------------------------------
def _record(job_id: str, attrs: dict[str, str], raw: str) -> AccountingRecord:
    letter = attrs.get("job_state", "").strip()
    torque = letter == "C" or ("exit_status" in attrs and "Exit_status" not in attrs)
    exit_text = attrs.get("Exit_status", attrs.get("exit_status"))
    exit_status = _int(exit_text)
    elapsed = parse_hms(attrs.get("resources_used.walltime"))
    time_limit = parse_hms(attrs.get("Resource_List.walltime"))
    max_rss = parse_pbs_size(attrs.get("resources_used.mem"))
    requested = parse_pbs_size(attrs.get("Resource_List.mem"))
    if requested is None:
        requested = _select_memory(attrs.get("Resource_List.select"))
    comment = attrs.get("comment", "")
    deleted = attrs.get("substate", "").strip() == _SUBSTATE_TERMINATED
    signal = cancelled_by = end = None
    if letter in _FINAL_LETTERS:
        state, signal = classify_exit(exit_status, torque=torque, deleted=deleted,
                                      elapsed=elapsed, time_limit=time_limit,
                                      max_rss=max_rss, mem_limit=requested, comment=comment)
        end = attrs.get("obittime") or attrs.get("comp_time") or attrs.get("mtime")
        if state == "cancelled":
            m = _WHO_RE.search(comment)
            cancelled_by = m.group(1).rstrip(".") if m else None
    else:
        state = _STATE_MAP.get(letter, "unknown")
    raw_state = letter
    if exit_text is not None:
        raw_state += f" {'exit_status' if torque else 'Exit_status'}={exit_text.strip()}"
    return AccountingRecord(
        job_id=job_id, state=state, raw_state=raw_state,
        exit_code=exit_status, signal=signal, cancelled_by=cancelled_by,
        elapsed=elapsed, time_limit=time_limit, requested_memory=requested,
        max_rss=max_rss, node=_first_host(attrs.get("exec_host")),
        start=attrs.get("stime") or attrs.get("start_time"), end=end, raw=raw,
    )


def _status(job_id: str, attrs: dict[str, str]) -> JobStatus:
    record = _record(job_id, attrs, "")
    reason = attrs.get("comment") if record.state == "pending" else None
    return job_status_from_record(record, reason=reason)


def job_status_from_record(record: AccountingRecord, reason: str | None = None) -> JobStatus:
    """The queue view of a record: same state, without the accounting detail."""
    return JobStatus(job_id=record.job_id, state=record.state,
                     raw_state=record.raw_state.split(" ", 1)[0], node=record.node,
                     reason=reason, elapsed=record.elapsed, time_limit=record.time_limit)


# -- qstat -F json ---------------------------------------------------------------------
_JSON_STRING_LINE = re.compile(r'^(\s*"[^"]+":)"(.*)"(,?)\s*$')


def _load_qstat_json(text: str) -> dict:
    try:
        return json.loads(text, strict=False)
    except json.JSONDecodeError:
        pass
    # Some PBS Pro releases print string values unescaped (a quote or backslash in a
    # Variable_List value breaks the document); re-escape line by line and try again.
    lines = []
    for line in text.splitlines():
        m = _JSON_STRING_LINE.match(line)
        if m:
            try:
                json.loads(f'"{m.group(2)}"', strict=False)
            except json.JSONDecodeError:
                line = f"{m.group(1)}{json.dumps(m.group(2))}{m.group(3)}"
        lines.append(line)
    try:
        return json.loads("\n".join(lines), strict=False)
    except json.JSONDecodeError as exc:
        raise BatchError(f"qstat -F json printed something that is not JSON ({exc}); "
                         f"first line: {text.strip().splitlines()[:1]}") from None


def _flatten(job: dict) -> dict[str, str]:
    flat: dict[str, str] = {}
    for key, value in job.items():
        if isinstance(value, dict) and key != "Variable_List":
            for sub, subvalue in value.items():
                flat[f"{key}.{sub}"] = str(subvalue)
        elif value is not None and not isinstance(value, dict):
            flat[key] = str(value)
    return flat


def _json_jobs(text: str) -> list[tuple[str, dict[str, str], str]]:
    if not text.strip():
        return []
    doc = _load_qstat_json(text)
    jobs = doc.get("Jobs") or {}
    return [(job_id, _flatten(job), json.dumps({job_id: job}, indent=4))
            for job_id, job in jobs.items()]


def parse_qstat_json(text: str) -> list[AccountingRecord]:
    """Records from `qstat [-x] -f -F json` (OpenPBS / PBS Pro 14+)."""
    return [_record(job_id, attrs, raw) for job_id, attrs, raw in _json_jobs(text)]


def parse_qstat_json_status(text: str) -> list[JobStatus]:
    return [_status(job_id, attrs) for job_id, attrs, _ in _json_jobs(text)]


# -- qstat -f (text) -------------------------------------------------------------------
_JOB_ID_RE = re.compile(r"^Job Id:\s*(\S+)")
_ATTR_RE = re.compile(r"^\s+([A-Za-z_][\w.]*)\s*=\s?(.*)$")


def _full_jobs(text: str) -> list[tuple[str, dict[str, str], str]]:
    jobs: list[tuple[str, dict[str, str], str]] = []
    job_id: str | None = None
    attrs: dict[str, str] = {}
    lines: list[str] = []
    key: str | None = None

    def flush():
        if job_id is not None:
            jobs.append((job_id, attrs, "\n".join(lines).rstrip() + "\n"))

    for line in text.splitlines():
        m = _JOB_ID_RE.match(line)
        if m:
            flush()
            job_id, attrs, lines, key = m.group(1), {}, [line], None
            continue
        if job_id is None:
            continue
        lines.append(line)
        if not line.strip():
            key = None
            continue
        # qstat wraps long values at ~80 columns and indents the rest with a tab; the
        # break can fall inside a word, so the pieces join with nothing between them.
        if line.startswith("\t") and key is not None:
            attrs[key] += line[1:].rstrip("\n")
            continue
        m = _ATTR_RE.match(line)
        if m:
            key = m.group(1)
            attrs[key] = m.group(2).rstrip()
        elif key is not None:
            attrs[key] += line.strip()
    flush()
    return jobs


def parse_qstat_full(text: str) -> list[AccountingRecord]:
    """Records from `qstat -f` / `qstat -x -f` text (OpenPBS, PBS Pro and Torque)."""
    return [_record(job_id, attrs, raw) for job_id, attrs, raw in _full_jobs(text)]


def parse_qstat_full_status(text: str) -> list[JobStatus]:
    return [_status(job_id, attrs) for job_id, attrs, _ in _full_jobs(text)]


def parse_qstat_full_attrs(text: str) -> dict[str, dict[str, str]]:
    """job id -> attributes exactly as printed (continuations joined); for tools and tests."""
    return {job_id: attrs for job_id, attrs, _ in _full_jobs(text)}


# -- qsub ------------------------------------------------------------------------------
_ARRAY_ID = re.compile(r"^(\d+)\[\](.*)$")
_QSUB_RE = re.compile(r"^(\d+(?:\[\d*\])?(?:\.[\w.-]+)?)\s*$")


def parse_qsub(text: str) -> str:
    """The job id qsub printed: '1234.server' (the last line that looks like one)."""
    for line in reversed(text.strip().splitlines()):
        m = _QSUB_RE.match(line.strip())
        if m:
            return m.group(1)
    raise BatchError(f"qsub printed no job id: {text.strip()!r}")


# -- the adapter -----------------------------------------------------------------------
_NAME_BAD = re.compile(r"[^A-Za-z0-9_.-]+")
_GONE_RE = re.compile(r"Unknown Job Id|Job has finished|has finished|"
                      r"Request invalid for state of job|job already finished", re.IGNORECASE)
_NO_JSON_RE = re.compile(r"invalid option|illegal option|unknown option|usage:", re.IGNORECASE)
# qstat and friends block for minutes when the server is unreachable; don't hang with them.
COMMAND_TIMEOUT = 120


def sanitize_job_name(name: str) -> str:
    """PBS job names: at most 15 characters (older PBS Pro, Torque), starting with a letter."""
    clean = _NAME_BAD.sub("-", name.strip()) or "hpc-cluster"
    if not clean[0].isalpha():
        clean = "j" + clean
    return clean[:15].rstrip("-.")


class PBSAdapter(BatchAdapter):
    name = "pbs"
    running_state = "R"
    template_name = "pbs.sh.j2"
    submit_command = "qsub"
    cancel_command = "qdel"
    cluster_name = "PBSCluster"
    # qsub -l walltime=: [[hours:]minutes:]seconds, a bare number is seconds, no day form.
    walltime_reading = WalltimeReading(
        "PBS", "PBS's forms: seconds ('3600'), 'MM:SS' ('90:00'), 'HH:MM:SS' (hours may pass 24), "
        "or units like '90m', '1h30m', '2d'")
    keywords = (RESOURCE_SPEC,)

    @classmethod
    def resolve_options(cls, values: dict, environ: dict) -> dict:
        # dask-jobqueue's PBSCluster charges $PBS_ACCOUNT when no account is set.
        if values.get("account") is None and environ.get("PBS_ACCOUNT"):
            return {"account": (environ["PBS_ACCOUNT"], "env:PBS_ACCOUNT")}
        return {}

    def __init__(self, runner=None):
        super().__init__(runner)
        self._json = True   # cleared after the first qstat that rejects -F json

    # -- rendering -----------------------------------------------------------------
    def template_context(self, spec: JobSpec) -> dict:
        check_env_names(spec.env)
        if spec.job_cpu or spec.job_mem:
            raise BatchError("job_cpu and job_mem are SLURM settings; on PBS ask for cores and memory "
                             "with resource_spec, e.g. 'select=1:ncpus=8:mem=64GB'")
        memory = format_pbs_memory(spec.memory)
        if spec.resource_spec:
            # Replaces our select=... request, e.g. Torque's 'nodes=1:ppn={cores},mem={memory}'.
            resources = fill_resource_spec(spec, memory, "nodes=1:ppn={cores},mem={memory}")
        else:
            resources = f"select=1:ncpus={spec.cores}:mem={memory}"
        # dask-jobqueue's directives, in its order and spelling (PBS has one spelling each).
        ours = [(f"#PBS -N {sanitize_job_name(spec.job_name)}",)]
        if spec.queue:
            ours.append((f"#PBS -q {spec.queue}",))
        if spec.account:
            ours.append((f"#PBS -A {spec.account}",))
        ours += [(f"#PBS -l {resources}",), (f"#PBS -l walltime={format_walltime(spec.walltime)}",)]
        if spec.log_directory:
            # A directory (trailing slash) makes PBS name the files <name>.o<seq> and
            # <name>.e<seq>, one pair per job; directives cannot expand $PBS_JOBID.
            log_dir = spec.log_directory.rstrip("/")
            ours += [(f"#PBS -e {log_dir}/",), (f"#PBS -o {log_dir}/",)]
        kept = kept_directives(ours, spec.directives_skip)
        if spec.array_size:
            # PBS Pro / OpenPBS's array range (Torque spells it -t and is not covered: docs/pbs.md).
            kept.append(f"#PBS -J 0-{spec.array_size - 1}")
        extra = [d if d.lstrip().startswith("#PBS") else f"#PBS {d.strip()}"
                 for d in spec.extra_directives]
        return {"directives": kept + extra, "pbs_job_name": sanitize_job_name(spec.job_name)}

    # -- commands ------------------------------------------------------------------
    supports_arrays = True
    array_index_variable = "PBS_ARRAY_INDEX"

    def array_element_ids(self, array_id: str, count: int) -> list[str]:
        """qsub prints an array as '4120[].server'; its subjobs are '4120[0].server' ..., the ids
        qstat, qdel and the subjob's own $PBS_JOBID use."""
        m = _ARRAY_ID.match(array_id)
        if not m:
            raise BatchError(f"qsub printed {array_id!r} for a job array; expected '<number>[].<server>'")
        return [f"{m.group(1)}[{i}]{m.group(2)}" for i in range(count)]

    def submit(self, script: str) -> str:
        result = self.runner.run(["qsub"], input=script, timeout=COMMAND_TIMEOUT, check=False)
        if result.returncode != 0:
            said = (result.stderr or result.stdout).strip()
            if "\n#PBS -J " in script and _NO_JSON_RE.search(said):
                # Torque's qsub has no -J (its arrays are -t, which we do not write).
                raise BatchError(f"qsub refused the job array's -J ({said}): this looks like Torque, whose "
                                 "arrays hpc-cluster does not submit; remove job_array from the site")
            raise BatchError(f"qsub failed (exit {result.returncode}): {said}")
        return parse_qsub(result.stdout)

    def cancel(self, job_ids: Sequence[str]) -> None:
        if not job_ids:
            return
        result = self.runner.run(["qdel", *job_ids], timeout=COMMAND_TIMEOUT, check=False)
        if result.returncode == 0:
            return
        problems = [line for line in (result.stderr + "\n" + result.stdout).splitlines()
                    if line.strip() and not _GONE_RE.search(line)]
        if problems:
            raise BatchError(f"qdel failed (exit {result.returncode}): {' | '.join(problems)}")

    def _qstat(self, job_ids: Sequence[str]) -> tuple[str, str]:
        """('json' | 'text', stdout) for one qstat call over all ids."""
        if self._json:
            result = self.runner.run(["qstat", "-x", "-f", "-F", "json", *job_ids],
                                     timeout=COMMAND_TIMEOUT, check=False)
            if result.stdout.lstrip().startswith("{"):
                return "json", result.stdout
            if result.returncode != 0 and _NO_JSON_RE.search(result.stderr + result.stdout):
                self._json = False
            else:
                self._check_qstat(result)
                return "json", result.stdout
        result = self.runner.run(["qstat", "-f", *job_ids], timeout=COMMAND_TIMEOUT, check=False)
        self._check_qstat(result)
        return "text", result.stdout

    @staticmethod
    def _check_qstat(result) -> None:
        # qstat exits non-zero when any id is unknown (history expired, keep_completed
        # passed) yet still prints the others; only other complaints are errors.
        if result.returncode == 0:
            return
        problems = [line for line in result.stderr.splitlines()
                    if line.strip() and not _GONE_RE.search(line)]
        if problems:
            raise BatchError(f"qstat failed (exit {result.returncode}): {' | '.join(problems)}")

    def status(self, job_ids: Sequence[str]) -> dict[str, JobStatus]:
        """Every asked id; ones qstat no longer knows come back 'unknown'."""
        if not job_ids:
            return {}
        kind, out = self._qstat(job_ids)
        found = parse_qstat_json_status(out) if kind == "json" else parse_qstat_full_status(out)
        by_id = {s.job_id: s for s in found}
        return {job_id: _match(job_id, by_id) or JobStatus(job_id, "unknown", "")
                for job_id in job_ids}

    def accounting(self, job_ids: Sequence[str]) -> dict[str, AccountingRecord]:
        """Records for the asked ids that qstat still knows (history or keep_completed)."""
        if not job_ids:
            return {}
        kind, out = self._qstat(job_ids)
        found = parse_qstat_json(out) if kind == "json" else parse_qstat_full(out)
        by_id = {r.job_id: r for r in found}
        records = {}
        for job_id in job_ids:
            record = _match(job_id, by_id)
            if record is not None:
                records[job_id] = record
        return records


def _match(job_id: str, by_id: dict):
    """qstat may print '123.server.domain' for '123.server' or '123': match on the number too."""
    if job_id in by_id:
        return by_id[job_id]
    seq = job_id.split(".", 1)[0]
    for other, value in by_id.items():
        if other.split(".", 1)[0] == seq:
            return value
    return None
