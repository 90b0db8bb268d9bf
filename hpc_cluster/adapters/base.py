"""What every batch system adapter provides, and the records they return.

An adapter is a few commands plus pure parsers of their outputs. Commands run through a
`Runner` (local subprocess or SSH, see `runners/`) so one adapter serves both.
The records here are what the scheduler's diagnosis reads: keep them plain data.
"""

from __future__ import annotations

import dataclasses
import re
import shlex
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import Sequence

import jinja2

from ..runners.base import BatchError, CommandResult, Runner  # noqa: F401  (CommandResult: adapters hand it on)
from .options import AdapterOption

# The closed set of job states every adapter maps its batch system's states onto.
JOB_STATES = (
    "pending", "running", "completed", "failed", "timeout", "out-of-memory",
    "cancelled", "preempted", "node-fail", "boot-fail", "deadline", "unknown",
)
FINAL_STATES = frozenset(JOB_STATES) - {"pending", "running", "unknown"}


@dataclass
class JobSpec:
    """Everything a job script is rendered from. Sizes are bytes, times are seconds."""

    worker_command: str                     # the full command line that starts the worker(s)
    job_name: str = "hpc-cluster"
    cores: int = 1
    memory: int = 1_000_000_000
    processes: int = 1                      # worker processes per node (per job when nodes is 1)
    walltime: int = 3600
    queue: str | None = None
    account: str | None = None
    extra_directives: list[str] = field(default_factory=list)
    directives_skip: list[str] = field(default_factory=list)
    prologue: list[str] = field(default_factory=list)
    epilogue: list[str] = field(default_factory=list)
    log_directory: str | None = None
    python: str = "python3"
    nanny: bool = True
    env: dict[str, str] = field(default_factory=dict)
    working_directory: str | None = None
    template: str | None = None             # a site's own template file, replacing ours
    resource_spec: str | None = None        # PBS: the -l request instead of select=1:ncpus=..:mem=..
    shebang: str = "#!/usr/bin/env bash"
    job_cpu: int | None = None              # SLURM: --cpus-per-task instead of cores
    job_mem: str | None = None              # SLURM: --mem as written, instead of memory
    worker_index: int = 0                   # the job's number in its cluster: workers are NAME-<index>
    worker_name: str = ""                   # that NAME (the cluster's name=); "" where none is known
    job_array: bool = False                 # the site's `job_array`: scale-ups as one array (deploy/daemon/arrays.py)
    array_size: int = 0                     # this submission is an array of so many elements (0: one job);
                                            # element i's workers are NAME-<worker_index + i>
    # The batch system's own settings that are set (its adapter's `keywords`, adapters/options.py:
    # LSF's ncpus, mem, lsf_units, use_stdin; HTCondor's disk and command extras), read by that
    # adapter alone. SLURM's job_cpu and job_mem and PBS's and SGE's resource_spec are declared
    # by their adapters too but, older, are fields of their own above.
    batch_options: dict = field(default_factory=dict)
    # Nodes per job (adapters with `multi_node`): `processes` workers on each, cores and memory
    # per node. Last, so plans written before it read as one node.
    nodes: int = 1

    @property
    def workers_per_job(self) -> int:
        return max(1, self.processes) * max(1, self.nodes)

    def replace(self, **changes) -> "JobSpec":
        return dataclasses.replace(self, **changes)


@dataclass
class JobStatus:
    """What the queue (squeue, qstat) says about a job right now."""

    job_id: str
    state: str                              # one of JOB_STATES
    raw_state: str
    node: str | None = None
    reason: str | None = None               # why pending, when the batch system says
    elapsed: int | None = None              # seconds
    time_limit: int | None = None           # seconds


@dataclass
class StepRecord:
    """One accounting line below a job: `.batch`, `.extern`, `.0` ..."""

    step_id: str
    state: str
    raw_state: str
    exit_code: int | None = None
    signal: int | None = None
    max_rss: int | None = None              # bytes
    elapsed: int | None = None
    nodes: list[str] = field(default_factory=list)   # the nodes it ran on (expanded), where known


@dataclass
class AccountingRecord:
    """What the batch system's accounting says about a finished (or running) job."""

    job_id: str
    state: str                              # one of JOB_STATES
    raw_state: str
    exit_code: int | None = None
    signal: int | None = None
    cancelled_by: str | None = None         # uid (or user name) when the system says
    elapsed: int | None = None              # seconds
    time_limit: int | None = None           # seconds
    requested_memory: int | None = None     # bytes (per node: what each node's workers had)
    max_rss: int | None = None              # bytes, the largest over the job's steps
    node: str | None = None
    start: str | None = None
    end: str | None = None
    steps: list[StepRecord] = field(default_factory=list)
    raw: str = ""
    # A job over several nodes: its nodes (expanded; `node` is the batch system's own form), and
    # those the batch system took from it while it ran (SLURM resizes a --no-kill job when one
    # of its nodes fails, and goes on with the others).
    nodes: list[str] = field(default_factory=list)
    released_nodes: list[str] = field(default_factory=list)

    @property
    def final(self) -> bool:
        return self.state in FINAL_STATES


_TEMPLATES = Path(__file__).resolve().parent.parent / "templates"


def kept_directives(directives: Sequence[Sequence[str]], skip: Sequence[str]) -> list[str]:
    """The directive lines `skip` leaves: each directive is (the line we write, its other
    spellings...), and a skip string drops it if it is found in any of them, so a skip list
    written for dask-jobqueue's short flags ('-J') and one written for long ones
    ('--job-name') both work. Only our lines are skipped: what the user adds, they meant."""
    return [spellings[0] for spellings in directives
            if not any(s in line for s in skip for line in spellings)]


def clock_seconds(text: str) -> int | None:
    """Seconds for a batch system's [[h:]m:]s clock ('0:10:0', '00:10:00', '6.5'); None if not one."""
    try:
        parts = [float(p) for p in text.split(":")]
    except ValueError:
        return None
    if len(parts) > 3:
        return None
    seconds = 0.0
    for p in parts:
        seconds = seconds * 60 + p
    return int(round(seconds))


_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


def check_env_names(env: dict) -> None:
    """env= keys go into `export KEY=...` lines: a bad name is refused here, not by the job's shell."""
    for key in env:
        if not _ENV_NAME.match(key):
            raise BatchError(f"env={{{key!r}: ...}}: {key!r} is not a valid environment "
                             f"variable name (letters, digits, '_', not starting with a digit)")


# PBS's and Grid Engine's -l request: one setting the two adapters share (the same object, as
# config/adapter_options.py wants of a name declared twice).
RESOURCE_SPEC = AdapterOption(
    "resource_spec", "str", "the -l resource request, replacing select=1:ncpus={cores}:mem={memory} "
    "(Torque: nodes=1:ppn={cores},mem={memory}; Grid Engine: e.g. h_vmem={memory})",
    example="nodes=1:ppn={cores},mem={memory}", per_pool=True)


def fill_resource_spec(spec: "JobSpec", memory: str, example: str) -> str:
    """resource_spec with {cores}, {memory} (as the batch system writes sizes) and {processes}
    filled in; a bad placeholder names itself and shows `example`."""
    try:
        return spec.resource_spec.format(cores=spec.cores, memory=memory, processes=spec.processes)
    except (KeyError, IndexError, ValueError) as exc:
        raise BatchError(f"resource_spec={spec.resource_spec!r}: {type(exc).__name__}: {exc}; it may use "
                         f"{{cores}}, {{memory}} and {{processes}}, e.g. {example!r}") from None


def _template_line(error: BaseException, path: Path) -> int | None:
    """The template line an error was raised at (jinja2 maps its frames back to the file)."""
    line = None
    for frame, lineno in traceback.walk_tb(error.__traceback__):
        if frame.f_code.co_filename == str(path):
            line = lineno
    return line


class BatchAdapter:
    """Base for batch systems. Subclasses set `name`, `template_name` and the commands, and
    declare their own settings (`keywords`)."""

    name = "base"
    template_name = ""
    # The batch system's own settings (adapters/options.py): keywords of the cluster classes,
    # keys of a site's YAML, checked by config like the core ones. None: declares none, and
    # another batch system's settings are left to this adapter (older plugins); () or more:
    # another batch system's settings are refused here, with their `instead` advice.
    keywords: tuple | None = None
    title: str | None = None              # how the docs name it ('HTCondor'); None: name upper case
    # dask-jobqueue's cluster class for this batch system ('LSFCluster'): named in messages and
    # made by deploy/batch_clusters.py (`from hpc_cluster import LSFCluster`). None: a plugin's,
    # used with batch= in a site or JobQueueCluster(batch=...).
    cluster_name: str | None = None
    cluster_doc: str | None = None        # that class's docstring, before its Parameters (numpydoc)
    # How the batch system reads a walltime string (units.WalltimeReading); None: as we do (a
    # bare number is seconds), for a batch system whose submit command takes seconds.
    walltime_reading = None
    # dask-jobqueue's names of a core setting on this batch system, read without the renamed-
    # keyword warning they get elsewhere: {"project": "account"} (qsub -P, bsub -P).
    native_keywords: dict = {}
    # How the batch system writes "running" (a job's raw_state): a job whose worker registered
    # is shown running before the next poll confirms it (deploy/daemon/polling.py), in the system's word.
    running_state = "RUNNING"
    submit_command = ""
    cancel_command = ""           # named to users who must cancel jobs by hand (`hpc-cluster down`)
    # Where `template_name` is: ours are in hpc_cluster/templates; a plugin's adapter ships its
    # own beside its module and sets this (docs/writing-an-adapter.md).
    template_dir: Path | None = None
    # Job arrays (the site's `job_array`): an adapter that can submit k jobs in one command
    # sets this, renders `array_size` as its array directive and the element's index from the
    # batch system's variable (the template), and names the elements in `array_element_ids`.
    # Without it, a scale-up of k jobs is k submissions, as always.
    supports_arrays = False
    array_index_variable: str | None = None   # the element's index inside the job (SLURM_ARRAY_TASK_ID)
    # One job over several nodes (JobSpec.nodes > 1): the adapter asks for them and its template
    # starts a worker set on each. Without it, nodes= > 1 is refused (config/resolve.py, render).
    multi_node = False
    # Pending reasons after which a job will not start without someone acting (a hold, a
    # dependency that can never be met, a request over a limit): `hpc-cluster up` stops waiting
    # on them and says what to do (issue 34). The batch system's own words, as squeue shows them.
    never_starts: frozenset = frozenset()

    def __init__(self, runner: Runner | None = None):
        if runner is None:
            from ..runners.local import LocalRunner      # loads subprocess: only when none is given
            runner = LocalRunner()
        self.runner = runner
        self.options: dict = {}

    @classmethod
    def resolve_options(cls, values: dict, environ: dict) -> dict:
        """This batch system's rules over a site's merged settings (config/resolve.py calls it
        with every setting, parsed): settings it works out, name -> (value, source), or a
        ValueError saying what to write (HTCondor's required disk). Pure: no command, no file."""
        return {}

    @classmethod
    def job_options(cls, options: dict, read_text, environ: dict) -> dict:
        """The `batch_options` the jobs get, from the settings that are set: the defaults
        this batch system takes from its site's own files (LSF's units from lsf.conf) are
        filled in here. `read_text(path)` is a file's text or None (deploy hands it over, so
        the adapter stays pure)."""
        return dict(options)

    def configure(self, options: dict) -> None:
        """The jobs' `batch_options` for what is not in the script: how to submit and cancel
        (LSF's use_stdin, HTCondor's command extras). The daemon calls it with its plan's."""
        self.options = dict(options or {})

    # -- rendering -----------------------------------------------------------------
    def template_context(self, spec: JobSpec) -> dict:
        """Values for the template beyond the spec's own fields; subclasses add directives."""
        return {}

    def render(self, spec: JobSpec) -> str:
        own = Path(self.template_dir) if self.template_dir else _TEMPLATES
        env = jinja2.Environment(
            loader=jinja2.FileSystemLoader([str(own)]),
            undefined=jinja2.StrictUndefined,
            keep_trailing_newline=True,
            trim_blocks=True,
            lstrip_blocks=True,
        )
        env.filters["quote"] = shlex.quote
        if spec.nodes > 1 and not self.multi_node:
            raise BatchError(f"nodes={spec.nodes}: {self.name} jobs here run on one node each; ask for one job "
                             "per node instead (nodes=1 and scale(jobs=N)); nodes= is supported with SLURM")
        context = dataclasses.asdict(spec)
        context.update(self.template_context(spec))
        if spec.template:
            path = Path(spec.template).expanduser().resolve()
            if not path.is_file():
                raise BatchError(f"template={spec.template!r}: no such file; point it at a jinja2 job-script "
                                 f"template or remove it to use the built-in {self.template_name}")
            what = f"template={spec.template!r}" + (f" ({path})" if str(path) != spec.template else "")
        else:
            path = own / self.template_name
            what = f"the built-in template {path}"
        try:
            # Loaded by its path, so errors carry its file name and line.
            env.loader = jinja2.FileSystemLoader([str(path.parent), str(own)])
            return env.get_template(path.name).render(**context)
        except jinja2.TemplateSyntaxError as e:
            raise BatchError(f"{what}, line {e.lineno}: {e.message}") from None
        except jinja2.UndefinedError as e:
            line = _template_line(e, path)
            raise BatchError(f"{what}{f', line {line}' if line else ''}: {e.message}. A job template "
                             f"can use: {', '.join(sorted(context))}") from None

    # -- commands (subclasses) ----------------------------------------------------
    def submit(self, script: str) -> str:
        raise NotImplementedError

    def cancel(self, job_ids: Sequence[str]) -> None:
        raise NotImplementedError

    def array_element_ids(self, array_id: str, count: int) -> list[str]:
        """The ids of an array's `count` elements, in index order, as status, cancel and the
        accounting take them and as the job's HPC_CLUSTER_JOB_ID says (`array_id` is what
        `submit` returned for the array). Only for adapters with `supports_arrays`."""
        raise NotImplementedError(f"{self.name}: no job arrays")

    def node_addresses(self, partition: str | None = None) -> list[str]:
        """The compute nodes' addresses (names or IPs), for the scheduler to listen on the
        address that routes to them (deploy/address.py). [] (the default): unknown, and the
        scheduler falls back to this host name's address."""
        return []

    def status(self, job_ids: Sequence[str]) -> dict[str, JobStatus]:
        raise NotImplementedError

    def accounting(self, job_ids: Sequence[str]) -> dict[str, AccountingRecord]:
        raise NotImplementedError
