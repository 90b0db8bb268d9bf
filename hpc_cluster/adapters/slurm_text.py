"""SLURM's commands as text: what sbatch, squeue, sacct, scontrol and sinfo print, read into
records, and the sizes and names we hand them. Pure (text in, records out), tested on outputs
captured from a real SLURM (tests/unit/adapters/fixtures/slurm/); the adapter that runs the
commands is slurm.py.
"""

from __future__ import annotations

import math
import re
import shlex
from typing import Iterable, Sequence

from .base import FINAL_STATES, AccountingRecord, BatchError, JobStatus, StepRecord

# SLURM's long state names -> our closed set (base.JOB_STATES). Names not here map to
# "unknown" rather than raising: a newer SLURM adding a state must not break polling.
STATE_MAP = {
    "COMPLETED": "completed",
    "FAILED": "failed",
    "SPECIAL_EXIT": "failed",
    "TIMEOUT": "timeout",
    "OUT_OF_MEMORY": "out-of-memory",
    "CANCELLED": "cancelled",
    "REVOKED": "cancelled",
    "PREEMPTED": "preempted",
    "NODE_FAIL": "node-fail",
    "BOOT_FAIL": "boot-fail",
    "DEADLINE": "deadline",
    "PENDING": "pending",
    "REQUEUED": "pending",
    "REQUEUE_FED": "pending",
    "REQUEUE_HOLD": "pending",
    "RESV_DEL_HOLD": "pending",
    "CONFIGURING": "pending",
    "RUNNING": "running",
    "COMPLETING": "running",
    "SIGNALING": "running",
    "STAGE_OUT": "running",
    "RESIZING": "running",
    "SUSPENDED": "running",
    "STOPPED": "running",
}
# squeue's and scontrol's compact codes, for outputs formatted with %t.
SHORT_STATES = {
    "BF": "BOOT_FAIL", "CA": "CANCELLED", "CD": "COMPLETED", "CF": "CONFIGURING",
    "CG": "COMPLETING", "DL": "DEADLINE", "F": "FAILED", "NF": "NODE_FAIL",
    "OOM": "OUT_OF_MEMORY", "OO": "OUT_OF_MEMORY", "PD": "PENDING", "PR": "PREEMPTED",
    "R": "RUNNING", "RD": "RESV_DEL_HOLD", "RF": "REQUEUE_FED", "RH": "REQUEUE_HOLD",
    "RQ": "REQUEUED", "RS": "RESIZING", "RV": "REVOKED", "SI": "SIGNALING",
    "SE": "SPECIAL_EXIT", "SO": "STAGE_OUT", "ST": "STOPPED", "S": "SUSPENDED",
    "TO": "TIMEOUT",
}

SQUEUE_FIELDS = ("JOBID", "STATE", "NODELIST", "REASON", "TIME", "TIME_LIMIT")
SQUEUE_FORMAT = "%i|%T|%N|%r|%M|%l"
SACCT_FIELDS = ("JobID", "JobName", "State", "ExitCode", "ReqMem", "AllocCPUS", "MaxRSS",
                "Elapsed", "Timelimit", "NodeList", "Start", "End")

# sacct's and scontrol's binary units; ReqMem's trailing n/c is the old per-node/per-CPU form.
_SIZE_RE = re.compile(r"^([0-9]*\.?[0-9]+)([KMGTP]?)([nc]?)$")
_SIZE_UNITS = {"": 1, "K": 1024, "M": 1024**2, "G": 1024**3, "T": 1024**4, "P": 1024**5}


# -- small pure helpers -------------------------------------------------------------
def map_state(raw: str) -> tuple[str, str | None]:
    """('CANCELLED by 1000') -> ('cancelled', '1000'). Also takes squeue's short codes."""
    raw = raw.strip()
    m = re.match(r"^CANCELLED by (\S+)$", raw)
    if m:
        return "cancelled", m.group(1)
    name = raw.split()[0].rstrip("+") if raw else ""
    name = SHORT_STATES.get(name, name)
    return STATE_MAP.get(name, "unknown"), None


def parse_exit_code(text: str) -> tuple[int | None, int | None]:
    """'3:0' -> (3, None); '0:15' -> (0, 15); '0:125' -> (0, 125), SLURM's OOM marker."""
    text = (text or "").strip()
    if not text:
        return None, None
    code, _, sig = text.partition(":")
    try:
        exit_code = int(code)
        signal = int(sig) if sig else 0
    except ValueError:
        return None, None
    return exit_code, (signal or None)


def parse_slurm_memory(text: str, cpus: int | None = None) -> int | None:
    """'300M', '1G', '1023456K', '0' -> bytes; old '4000Mc' is per CPU (times `cpus`).

    SLURM's units are binary. Unreadable values (sacct prints '16?' for some pending
    jobs) give None: a missing number is better than a crash in the middle of a poll.
    """
    text = (text or "").strip()
    m = _SIZE_RE.match(text)
    if not m:
        return None
    number, unit, per = m.groups()
    # A bare number is MB in ReqMem/MinMemoryNode but bytes in MaxRSS; sacct always
    # writes a unit on ReqMem, so the bare case here is MaxRSS (or --noconvert).
    value = float(number) * _SIZE_UNITS[unit]
    if per == "c":
        if cpus is None:
            return None
        value *= cpus
    return int(value)


def parse_slurm_duration(text: str) -> int | None:
    """'00:01:13', '1-00:00:00', '5:00' (MM:SS), '30' (minutes) -> seconds; 'UNLIMITED' -> None."""
    text = (text or "").strip()
    if not text or not text[0].isdigit():
        return None  # UNLIMITED, INVALID, Partition_Limit, NOT_SET, ''
    days = 0
    if "-" in text:
        d, text = text.split("-", 1)
        days = int(d)
    try:
        parts = [float(p) for p in text.split(":")]
    except ValueError:
        return None
    if days:
        # After a day count SLURM writes hours first: D-HH, D-HH:MM, D-HH:MM:SS.
        parts += [0] * (3 - len(parts))
        h, m, s = parts
    elif len(parts) == 3:
        h, m, s = parts
    elif len(parts) == 2:
        h, m, s = 0, parts[0], parts[1]
    elif len(parts) == 1:
        h, m, s = 0, parts[0], 0  # a bare number is minutes in SLURM
    else:
        return None
    return int(days * 86400 + h * 3600 + m * 60 + s)


_ARRAY_RANGE = re.compile(r"^(\d+)_\[([0-9,\-]+)(?:%\d+)?\]$")


def expand_array_id(job_id: str) -> list[str]:
    """'2012_[0-3,7]' -> ['2012_0', ... '2012_3', '2012_7']: squeue (and sacct) print an array's
    pending elements as one line in this range form (`%N`, a throttle, may follow the range),
    while each running or finished element has its own line, `2012_4`. Any other id: itself."""
    m = _ARRAY_RANGE.match(job_id)
    if not m:
        return [job_id]
    out = []
    for part in m.group(2).split(","):
        first, dash, last = part.partition("-")
        if not first.isdigit() or (dash and not last.isdigit()):
            raise BatchError(f"cannot read the array range in job id {job_id!r}")
        out += [f"{m.group(1)}_{i}" for i in range(int(first), int(last or first) + 1)]
    return out


def expand_hostlist(text: str | None) -> list[str]:
    """SLURM's compressed host list -> names: 'hpcn[1-2,4]' -> ['hpcn1', 'hpcn2', 'hpcn4'];
    'n[01-02],gpu7' keeps the zero padding; 'None assigned', '' -> []."""
    text = _none_if_unset(text or "")
    if not text:
        return []
    parts, depth, start = [], 0, 0
    for i, ch in enumerate(text):              # commas split hosts only outside brackets
        depth += {"[": 1, "]": -1}.get(ch, 0)
        if ch == "," and depth == 0:
            parts.append(text[start:i])
            start = i + 1
    parts.append(text[start:])
    out = []
    for part in parts:
        m = re.match(r"^([^\[]*)\[([^\]]*)\](.*)$", part)
        if not m:
            out.append(part)
            continue
        head, ranges, tail = m.groups()
        for r in ranges.split(","):
            first, _, last = r.partition("-")
            width = len(first)
            for n in range(int(first), int(last or first) + 1):
                out += [f"{head}{n:0{width}d}{rest}" for rest in (expand_hostlist(tail) if tail else [""])]
    return out


def _none_if_unset(text: str) -> str | None:
    text = (text or "").strip()
    return None if text in ("", "None", "None assigned", "Unknown", "(null)", "N/A") else text


# -- parsers ----------------------------------------------------------------------
def parse_sbatch(text: str) -> str:
    """Job id from `sbatch --parsable` ('123' or '123;cluster') or plain 'Submitted batch job 123'."""
    for line in reversed(text.strip().splitlines()):
        line = line.strip()
        m = re.search(r"Submitted batch job (\d+)", line)
        if m:
            return m.group(1)
        m = re.fullmatch(r"(\d+)(?:;\S+)?", line)
        if m:
            return m.group(1)
    raise BatchError(f"could not find a job id in sbatch's output: {text.strip()!r}")


def _table(text: str, expected: Sequence[str]) -> Iterable[dict[str, str]]:
    """Rows of a '|'-separated table; the header line, when present, names the columns."""
    lines = [line for line in text.splitlines() if line.strip()]
    if not lines:
        return
    header = lines[0].split("|")
    if header[0] == expected[0]:
        lines = lines[1:]
    else:
        header = list(expected)
    for line in lines:
        cells = line.split("|")
        if len(cells) < len(header):
            raise BatchError(f"unexpected line ({len(cells)} fields, want {len(header)}): {line!r}")
        if len(cells) > len(header):
            # Only free text (job names, reasons) can hold '|'; glue the excess back into
            # the one free-text column we ask for.
            free = next((i for i, h in enumerate(header) if h in ("JobName", "REASON")), None)
            if free is None:
                raise BatchError(f"unexpected line ({len(cells)} fields, want {len(header)}): {line!r}")
            extra = len(cells) - len(header)
            cells = cells[:free] + ["|".join(cells[free:free + extra + 1])] + cells[free + extra + 1:]
        yield dict(zip(header, cells))


def parse_squeue(text: str) -> dict[str, JobStatus]:
    """`squeue -t all --format='%i|%T|%N|%r|%M|%l'` (with or without header) -> {id: JobStatus}."""
    out = {}
    for row in _table(text, SQUEUE_FIELDS):
        raw = row["STATE"].strip()
        state, _ = map_state(raw)
        for job_id in expand_array_id(row["JOBID"].strip()):
            out[job_id] = JobStatus(
                job_id=job_id, state=state, raw_state=raw,
                node=_none_if_unset(row.get("NODELIST", "")),
                reason=_none_if_unset(row.get("REASON", "")),
                elapsed=parse_slurm_duration(row.get("TIME", "")),
                time_limit=parse_slurm_duration(row.get("TIME_LIMIT", "")),
            )
    return out


# squeue's form with the job's comment last: the lookup of a cluster's jobs by the tag sbatch
# --comment gave them (deploy/daemon/untracked.py).
SQUEUE_TAGGED_FORMAT = SQUEUE_FORMAT + "|%k"


def parse_squeue_tagged(text: str, prefix: str) -> dict[str, tuple[JobStatus, str]]:
    """`squeue -h --me -o '%i|%T|%N|%r|%M|%l|%k'` -> {id: (JobStatus, comment)} for the jobs
    whose comment starts with `prefix`; others' (no comment: '(null)') are skipped. The comment
    is the last field, so a '|' in a pending reason still parses."""
    out = {}
    for line in text.splitlines():
        head, sep, comment = line.rpartition("|")
        if sep and comment.strip().startswith(prefix):
            out.update((jid, (st, comment.strip())) for jid, st in parse_squeue(head).items())
    return out


def parse_squeue_states(text: str) -> dict[str, JobStatus]:
    """`squeue --only-job-state -h -o '%i|%T'` -> {id: JobStatus} with states only."""
    out = {}
    for line in text.splitlines():
        job_id, _, raw = line.strip().partition("|")
        if job_id and raw:
            out[job_id] = JobStatus(job_id=job_id, state=map_state(raw)[0], raw_state=raw.strip())
    return out


def parse_sacct(text: str) -> list[AccountingRecord]:
    """`sacct -P --format=<SACCT_FIELDS>` with steps -> one record per job, steps attached.

    Memory use is only reported on step lines (.batch, .extern, .0), so a job's max_rss
    is the largest of its steps'. A step line whose job line is missing (sacct can omit
    it for jobs of other clusters) still gets a record, built from the step. Array elements
    keep their own ids (`2013_4`, steps `2013_4.batch`): each element is a job of its own to
    the job manager and the diagnosis; a pending array's range line gives each element one.

    A job over several nodes (nodes=): each step names its node (NodeList), and ReqMem is the
    whole job's since SLURM 21.08 (300M for --mem=100M on 3 nodes; older ones wrote '100Mn'),
    so requested_memory is divided back to a node's. When a node of a --no-kill job fails,
    SLURM resizes the job: sacct then shows the job twice under one id, the first line (and
    every step line, even those still running elsewhere) RESIZING on all its nodes, then the
    job going on, RUNNING and later its end, on the nodes left (multinode/ fixtures). The
    record is the later line's, the missing nodes its `released_nodes`.
    """
    records: dict[str, AccountingRecord] = {}
    lines: dict[str, list[str]] = {}
    first_nodes: dict[str, list[str]] = {}              # a job's nodes on its first line (before a resize)
    resized: set[str] = set()
    rows = []
    for row in _table(text, SACCT_FIELDS):
        full_id = row["JobID"].strip()
        job_part, dot, step_id = full_id.partition(".")
        rows += [(job_id, dot, step_id, row) for job_id in expand_array_id(job_part)]
    for job_id, dot, step_id, row in rows:
        raw = row.get("State", "").strip()
        state, cancelled_by = map_state(raw)
        exit_code, signal = parse_exit_code(row.get("ExitCode", ""))
        cpus = _int(row.get("AllocCPUS"))
        line = "|".join(row.values())
        if dot:
            step = StepRecord(step_id=step_id, state=state, raw_state=raw, exit_code=exit_code,
                              signal=signal, max_rss=parse_slurm_memory(row.get("MaxRSS", "")),
                              elapsed=parse_slurm_duration(row.get("Elapsed", "")),
                              nodes=expand_hostlist(row.get("NodeList", "")))
            if job_id not in records:
                records[job_id] = AccountingRecord(job_id=job_id, state="unknown", raw_state="")
            records[job_id].steps.append(step)
            lines.setdefault(job_id, []).append(line)
            continue
        record = records.get(job_id) or AccountingRecord(job_id=job_id, state=state, raw_state=raw)
        record.state, record.raw_state, record.cancelled_by = state, raw, cancelled_by
        record.exit_code, record.signal = exit_code, signal
        record.elapsed = parse_slurm_duration(row.get("Elapsed", ""))
        record.time_limit = parse_slurm_duration(row.get("Timelimit", ""))
        record.node = _none_if_unset(row.get("NodeList", ""))
        record.nodes = expand_hostlist(record.node)
        first = first_nodes.setdefault(job_id, record.nodes)
        if raw.startswith("RESIZING"):
            resized.add(job_id)
        req = row.get("ReqMem", "").strip()
        record.requested_memory = parse_slurm_memory(req, cpus)
        if record.requested_memory and len(first) > 1 and not req.endswith(("n", "c")):
            record.requested_memory //= len(first)
        record.start = _none_if_unset(row.get("Start", ""))
        record.end = _none_if_unset(row.get("End", ""))
        records[job_id] = record
        lines.setdefault(job_id, []).insert(0, line)
    for job_id, record in records.items():
        if job_id in resized and not record.raw_state.startswith("RESIZING"):
            record.released_nodes = [n for n in first_nodes[job_id] if n not in record.nodes]
        rss = [s.max_rss for s in record.steps if s.max_rss is not None]
        record.max_rss = max(rss) if rss else None
        record.raw = "\n".join(lines.get(job_id, []))
        if record.state == "pending" and any(s.state == "running" for s in record.steps):
            # slurmdbd can hold a job line at PENDING (JobName 'allocation', ReqMem '16?')
            # after its batch step reported RUNNING: the step is the fresher news.
            record.state = "running"
        if not record.raw_state and record.steps:  # steps only: the batch step speaks for it
            batch = next((s for s in record.steps if s.step_id == "batch"), record.steps[0])
            record.state, record.raw_state = batch.state, batch.raw_state
            record.exit_code, record.signal = batch.exit_code, batch.signal
    return list(records.values())


def _int(text: str | None) -> int | None:
    try:
        return int((text or "").strip())
    except ValueError:
        return None


def _scontrol_fields(record: str) -> dict[str, str]:
    # Values never contain spaces except a few free-text fields (Command, Reason text in
    # some versions); split on ' Key=' boundaries so those stay whole.
    fields = {}
    for m in re.finditer(r"(?:^|\s)([A-Za-z][A-Za-z0-9_/:]*)=(.*?)(?=\s+[A-Za-z][A-Za-z0-9_/:]*=|\s*$)",
                         record, re.S):
        fields.setdefault(m.group(1), m.group(2).strip())
    return fields


def parse_scontrol_job(text: str) -> list[AccountingRecord]:
    """`scontrol show job` (multi-line or -o one-line form) -> records, for when sacct is off.

    scontrol knows only jobs still in the controller's memory (MinJobAge), has no steps
    and no memory use, and does not say who cancelled; that is why sacct comes first.
    """
    chunks = re.split(r"(?m)^(?=JobId=)", text)
    out = []
    for chunk in chunks:
        chunk = chunk.strip()
        if not chunk.startswith("JobId="):
            continue
        f = _scontrol_fields(chunk)
        raw = f.get("JobState", "")
        state, _ = map_state(raw)
        exit_code, signal = parse_exit_code(f.get("ExitCode", ""))
        memory = parse_slurm_memory(f.get("MinMemoryNode", "")) if "MinMemoryNode" in f else None
        if memory is None and "MinMemoryCPU" in f:
            memory = parse_slurm_memory(f["MinMemoryCPU"] + "c", _int(f.get("NumCPUs")))
        out.append(AccountingRecord(
            job_id=f["JobId"], state=state, raw_state=raw, exit_code=exit_code, signal=signal,
            elapsed=parse_slurm_duration(f.get("RunTime", "")),
            time_limit=parse_slurm_duration(f.get("TimeLimit", "")),
            requested_memory=memory, node=_none_if_unset(f.get("NodeList", "")),
            start=_none_if_unset(f.get("StartTime", "")),
            # A live job's EndTime is only the projected end (start + limit).
            end=_none_if_unset(f.get("EndTime", "")) if state in FINAL_STATES else None,
            raw=chunk,
        ))
    return out


_ACCOUNTING_DISABLED = re.compile(r"accounting storage is disabled", re.IGNORECASE)


def accounting_disabled(sacct_stderr: str) -> bool:
    """Whether sacct's complaint means this cluster keeps no accounting (so ask scontrol)."""
    return bool(_ACCOUNTING_DISABLED.search(sacct_stderr or ""))


def parse_slurm_version(text: str) -> tuple[int, int, int] | None:
    """`squeue --version` / `sinfo -V` ('slurm 24.05.1', 'slurm-wlm 22.05.8', 'slurm 23.11.0-0rc1')
    -> (24, 5, 1); None when it names no version."""
    m = re.search(r"\bslurm(?:-wlm)?\s+(\d+)\.(\d+)(?:\.(\d+))?", text or "", re.I)
    return (int(m.group(1)), int(m.group(2)), int(m.group(3) or 0)) if m else None


# squeue --only-job-state: ids and states only, through a lighter RPC (and, where the site
# enables SchedulerParameters=enable_job_state_cache, from slurmctld's job-state cache without
# the job table lock). Slurm's NEWS: added in 23.11.5 ("squeue - Add `--only-job-state`
# argument to use faster query of job states"); 25.05.0rc1 fixed "a false fatal with squeue
# --only-job-state -j<job id>", hence the fallback to the full form when it is refused.
ONLY_JOB_STATE_SINCE = (23, 11, 5)
# sacct --starttime: relative to the login node's own clock ("now-N"), so no clock skew
# between it and us matters; the margin covers the submission's own latency.
STARTTIME_MARGIN = 600


# sinfo's node-oriented form: one line per node and partition, its name and NodeAddr.
SINFO_ADDRESS_FORMAT = "%N %o"


def parse_sinfo_addresses(text: str) -> list[str]:
    """`sinfo -h -N -o "%N %o"` -> the nodes' addresses (NodeAddr), each once, in sinfo's order.

    A node in several partitions is listed once per partition. NodeAddr is the node's name
    when slurm.conf sets none (a name the login node resolves, usually); the one-node test
    cluster's is 127.0.0.1. Nodes without an address ('(null)', 'N/A') are skipped.
    """
    out = []
    for line in (text or "").splitlines():
        fields = line.split()
        if len(fields) < 2:
            continue
        addr = fields[1]
        if addr not in ("(null)", "N/A", "n/a") and addr not in out:
            out.append(addr)
    return out


def sacct_starttime(within: float) -> str:
    """The --starttime value for jobs all submitted within the last `within` seconds. With -j
    and no --starttime, sacct reads from the epoch: slurmdbd scans all of its history."""
    return f"now-{int(math.ceil(within)) + STARTTIME_MARGIN}"


def status_from_accounting(record: AccountingRecord) -> JobStatus:
    return JobStatus(job_id=record.job_id, state=record.state, raw_state=record.raw_state,
                     node=record.node, elapsed=record.elapsed, time_limit=record.time_limit)


# -- the adapter --------------------------------------------------------------------
def sbatch_value(value) -> str:
    # sbatch reads #SBATCH lines with its own quote handling; quote only when needed so
    # the common case stays readable.
    value = str(value)
    return value if value == shlex.quote(value) else shlex.quote(value)


def slurm_memory(nbytes: int) -> str:
    """--mem for a number of bytes, rounded up to whole GiB, MiB or KiB as dask-jobqueue does
    (sbatch's G/M/K are binary): 28GB -> '27G', 300MB -> '287M'; never less than asked."""
    for unit, size in (("G", 2**30), ("M", 2**20), ("K", 2**10)):
        if nbytes >= size:
            return f"{math.ceil(nbytes / size)}{unit}"
    return "1K"


# sbatch reads --mem as a whole number with an optional K, M, G or T, binary (1G = 1024M), a
# bare number being megabytes; it reads nothing after the unit's letter, so '2GB' is 2G (SLURM
# 22.05 grants `--mem=2GB` as ReqMem 2G). dask-jobqueue users write '2GB', so a trailing B or
# iB is taken and the plain form handed to sbatch. No fractions: sbatch refuses '1.5G'.
_SBATCH_MEM = re.compile(r"^(\d+)\s*(?:([KMGT])(?:I?B)?)?$", re.IGNORECASE)


def check_job_mem(key, v) -> str:
    """dask-jobqueue's job_mem as sbatch --mem takes it: '2GB' and '2GiB' -> '2G', 2048 -> '2048'."""
    text = str(v).strip() if isinstance(v, (str, int)) and not isinstance(v, bool) else ""
    m = _SBATCH_MEM.match(text)
    if not m:
        raise ValueError(f"{key}={v!r} is not a size sbatch --mem reads: write a whole number with K, M, G "
                         "or T (binary, as SLURM reads them: '2G', '2GB' and '2GiB' are all 2 GiB; a bare "
                         "number is megabytes), e.g. '100G', or '1536M' for 1.5G (or drop it: memory= sets --mem)")
    return f"{int(m.group(1))}{(m.group(2) or '').upper()}"


def job_mem_bytes(job_mem: str | None) -> int | None:
    """The bytes a checked job_mem asks SLURM for ('2G' -> 2 GiB); None when unset or '0'
    (--mem=0 is a whole node's memory: a size only the node knows)."""
    if not job_mem:
        return None
    return parse_slurm_memory(job_mem if job_mem[-1].isalpha() else f"{job_mem}M") or None   # bare: MB
