"""The adapter test kit: what every batch-system adapter must do, checked on its captured outputs.

An adapter (ours or a plugin's) subclasses `AdapterConformance` in a pytest module, names its
class and entry point, and hands over what its batch system really printed:

    class TestSGE(AdapterConformance):
        adapter_class = SGEAdapter
        entry_point = "sge"
        script_must_contain = ("#$ -l h_rt=01:30:00", "#$ -q kit-queue")
        submit_output = Captured("qsub", "Your job 42 (\\"kit-job\\") has been submitted\\n")
        status_outputs = [Captured("qstat", read("qstat.xml"))]
        status_expected = {"17": "running", "18": "pending"}
        accounting_outputs = [Captured("qacct", read("qacct_walltime.txt"), match="12"), ...]
        endings = [Ending("12", "timeout", cause="walltime"), ...]

Every test replays those outputs through a `ReplayRunner` (nothing reaches a batch system),
so the adapter's commands and its parsers are tested together, its declared settings
(`keywords`) are checked as config will use them (`keyword_problems`), and each `Ending` is also put
through the scheduler's diagnosis (scheduler/diagnosis.py): an accounting record that lacks
what the diagnosis reads (a time limit, the memory requested, the signal) fails here, not on a
user's cluster. docs/writing-an-adapter.md explains each check. Pure: no clock, no batch system.
"""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass
from typing import Sequence

from ..adapters import adapter_class as registered_class
from ..adapters.base import (FINAL_STATES, JOB_STATES, AccountingRecord, BatchAdapter, BatchError,
                             CommandResult, JobSpec)
from ..adapters.options import AdapterOption
from ..config.adapter_options import OptionClash, adapter_classes, collect
from ..config.schema import CORE_OPTIONS, STANDARD_CHECKS
from ..plugins import adapter_entry_points
from ..scheduler.diagnosis import Evidence, diagnose

# What the diagnosis needs of a record, per state: a walltime verdict quotes the limit and the
# time used, a memory verdict the request; a failed job, its exit code or the signal that ended
# it (at least one of each tuple).
DEATH_FIELDS = {
    "timeout": (("time_limit",), ("elapsed",)),
    "out-of-memory": (("requested_memory",),),
    "failed": (("exit_code", "signal"),),
}
WORKER_COMMAND = "/opt/kit/python -m hpc_cluster.worker tcp://10.0.0.1:8786 --name kit-7 --nanny"


@dataclass
class Captured:
    """What one command printed on a real batch system. It answers a call whose argv[0] is
    `command` and, when `match` is given, whose arguments include `match` (say a job id)."""

    command: str
    stdout: str
    stderr: str = ""
    returncode: int = 0
    match: str | None = None

    def answers(self, argv: Sequence[str]) -> bool:
        return argv[0].rsplit("/", 1)[-1] == self.command and (
            self.match is None or any(self.match in a for a in argv[1:]))


@dataclass
class Ending:
    """How one captured job ended, as the adapter's accounting must report it. `cause` is the
    diagnosis's verdict for a worker that died in it while running a task (None: not checked);
    `registered=False` for a job whose worker never started."""

    job_id: str
    state: str
    cause: str | None = None
    exit_code: int | None | type(...) = ...       # ... : not checked
    signal: int | None | type(...) = ...
    registered: bool = True
    nanny: dict | None = None


class ReplayRunner:
    """A Runner that answers from captured outputs and remembers every call (argv, stdin)."""

    def __init__(self, outputs: Sequence[Captured] = ()):
        self.outputs = list(outputs)
        self.calls: list[tuple[list[str], str | None]] = []

    def run(self, argv, input=None, timeout=None, check=True) -> CommandResult:
        argv = [str(a) for a in argv]
        self.calls.append((argv, input))
        for out in self.outputs:
            if out.answers(argv):
                if check and out.returncode != 0:
                    raise BatchError(f"{argv[0]} failed: {out.stderr}")
                return CommandResult(argv, out.returncode, out.stdout, out.stderr)
        raise AssertionError(f"the adapter ran {argv}, and no captured output answers it; captured: "
                             f"{[(o.command, o.match) for o in self.outputs]}")


def kit_spec(**changes) -> JobSpec:
    """The job every adapter renders in the kit: each resource differs from the defaults."""
    spec = JobSpec(worker_command=WORKER_COMMAND, job_name="kit-job", cores=3, memory=2 * 2**30,
                   processes=1, walltime=5400, queue="kit-queue", account="kit-account",
                   prologue=["module load kit-python"], epilogue=["echo kit-epilogue"],
                   env={"KIT_VARIABLE": "kit value"}, worker_index=7)
    return spec.replace(**changes)


_SETTING_NAME = re.compile(r"[a-z][a-z0-9_]*")


def keyword_problems(adapter: type, batch: str) -> list[str]:
    """What is wrong with the settings `adapter` declares (`keywords`, adapters/options.py), as
    `batch`: each is an AdapterOption with a plain name that is no core setting's and no other
    installed adapter's (unless the very same declaration), help text, a check (its own, or
    config's for its kind) that refuses a wrong value with a ValueError naming the setting, and
    a default that passes that check. [] when all is well, or when it declares none."""
    keywords = getattr(adapter, "keywords", None)
    if keywords is None:
        return []
    if not isinstance(keywords, (tuple, list)):
        return [f"keywords={keywords!r} must be a tuple of AdapterOption"]
    core = {n for o in CORE_OPTIONS for n in (o.name, *o.aliases)}
    problems, seen = [], set()
    for o in keywords:
        if not isinstance(o, AdapterOption):
            problems.append(f"{o!r} is not an AdapterOption (hpc_cluster.adapters.options)")
            continue
        for name in (o.name, *o.aliases):
            if not _SETTING_NAME.fullmatch(name):
                problems.append(f"{name!r}: a setting's name is lower-case letters, digits and '_' (a keyword, a "
                                "YAML key and an HPC_CLUSTER_* variable)")
            if name in core:
                problems.append(f"{name!r} is a core setting of hpc-cluster; name yours differently, e.g. "
                                f"'{batch}_{name}'")
            if name in seen:
                problems.append(f"{name!r} is declared twice")
            seen.add(name)
        if not (o.help or "").strip():
            problems.append(f"{o.name}: give it help, one line for the docs' table and `config init`")
        if o.elsewhere not in ("refuse", "ignore"):
            problems.append(f"{o.name}: elsewhere={o.elsewhere!r} must be 'refuse' or 'ignore'")
        check = o.check or STANDARD_CHECKS.get(o.kind)
        if check is None:
            problems.append(f"{o.name}: kind {o.kind!r} is none config checks by itself ({', '.join(STANDARD_CHECKS)}); "
                            "give it check=")
            continue
        try:
            check(o.name, object())
            problems.append(f"{o.name}: its check accepts anything (an object() passed); it must raise ValueError")
        except ValueError as e:
            if o.name not in str(e):
                problems.append(f"{o.name}: its check's error must name the setting, so a user knows what to fix: {e}")
        except Exception as e:          # a TypeError reaches the user as a traceback, not advice
            problems.append(f"{o.name}: its check raised {type(e).__name__} ({e}) instead of a ValueError")
        if o.default is not None:
            try:
                check(o.name, o.default)
            except Exception as e:
                problems.append(f"{o.name}: its default {o.default!r} does not pass its own check: {e}")
    try:                                # against the other installed adapters (core names: above)
        collect({**adapter_classes(), batch: adapter}, set())
    except OptionClash as e:
        problems.append(str(e))
    return problems


class AdapterConformance:
    """Subclass as `Test<Name>` in a pytest module and fill in the class attributes."""

    adapter_class: type[BatchAdapter]
    entry_point: str = ""                         # the name users write as batch=
    script_must_contain: tuple[str, ...] = ()     # kit_spec()'s resources, as the directives spell them
    submit_output: Captured | None = None
    submitted_job_id: str = ""
    status_outputs: Sequence[Captured] = ()
    status_expected: dict[str, str] = {}          # job id -> state from JOB_STATES
    accounting_outputs: Sequence[Captured] = ()
    endings: Sequence[Ending] = ()
    cancel_outputs: Sequence[Captured] = ()       # e.g. what the cancel command says of a finished job
    garbage: str = "<<not what any batch system prints>>\n\x00|||\n"

    def adapter(self, outputs: Sequence[Captured] = ()) -> tuple[BatchAdapter, ReplayRunner]:
        runner = ReplayRunner(outputs)
        return self.adapter_class(runner=runner), runner

    # -- the plugin contract -----------------------------------------------------------------
    def test_registered_under_its_entry_point(self):
        assert self.entry_point, "set entry_point to the name users write as batch="
        eps = adapter_entry_points()
        assert self.entry_point in eps, (f"no {self.entry_point!r} in the installed adapters "
                                         f"{sorted(eps)}: register it in pyproject.toml")
        assert registered_class(self.entry_point) is self.adapter_class
        assert registered_class(self.entry_point.upper()) is self.adapter_class
        assert self.adapter_class.name == self.entry_point
        assert self.adapter_class.template_name and self.adapter_class.submit_command

    def test_declared_keywords_are_well_formed(self):
        problems = keyword_problems(self.adapter_class, self.entry_point or self.adapter_class.name)
        assert not problems, "the adapter's keywords:\n  " + "\n  ".join(problems)

    def test_walltime_reading_is_declared_well(self):
        from ..units import WalltimeReading, parse_walltime
        reading = getattr(self.adapter_class, "walltime_reading", None)
        if reading is None:
            return                                   # read as ours: a bare number is seconds
        assert isinstance(reading, WalltimeReading), (
            f"walltime_reading={reading!r} must be a hpc_cluster.units.WalltimeReading (or None)")
        assert reading.title and reading.forms, "walltime_reading needs a title and the forms it accepts"
        # Every batch system takes the unit forms and HH:MM:SS (hours:minutes:seconds).
        assert parse_walltime("1h30m", batch=reading) == 5400
        assert parse_walltime("01:30:00", batch=reading) == 5400

    # -- render ------------------------------------------------------------------------------
    def test_render_asks_for_the_resources(self):
        adapter, runner = self.adapter()
        script = adapter.render(kit_spec())
        assert script.startswith(kit_spec().shebang + "\n")
        assert self.script_must_contain, "list the directives kit_spec() must produce"
        for text in self.script_must_contain:
            assert text in script, f"{text!r} missing from the rendered script:\n{script}"
        assert not runner.calls, "render() must not run commands"

    def test_render_runs_the_worker_after_the_prologue_with_the_job_environment(self):
        script = self.adapter()[0].render(kit_spec())
        assert script.count(WORKER_COMMAND) == 1, script
        at = script.index(WORKER_COMMAND)
        assert script.index("module load kit-python") < at < script.index("echo kit-epilogue")
        # The worker reads these to know its job and its deadline (worker/__main__.py).
        for name in ("HPC_CLUSTER_JOB_START", "HPC_CLUSTER_JOB_WALLTIME", "HPC_CLUSTER_JOB_ID",
                     "HPC_CLUSTER_WORKER_INDEX=7"):
            assert name in script[:at], f"{name} is not set before the worker starts"
        assert "KIT_VARIABLE='kit value'" in script

    def test_directives_skip_and_extra(self):
        adapter = self.adapter()[0]
        directives = adapter.template_context(kit_spec())["directives"]
        assert directives, "template_context() must give the directive lines"
        first = directives[0]
        skipped = adapter.template_context(kit_spec(directives_skip=[first]))["directives"]
        assert first not in skipped
        prefix = first.split()[0]
        extra = adapter.template_context(kit_spec(extra_directives=["--kit-extra"]))["directives"]
        assert any("--kit-extra" in d and d.startswith(prefix) for d in extra), extra

    def test_render_refuses_a_bad_environment_name(self):
        try:
            self.adapter()[0].render(kit_spec(env={"1 bad": "x"}))
        except BatchError as exc:
            assert "1 bad" in str(exc)
        else:
            raise AssertionError("env={'1 bad': ...} rendered; it must raise BatchError naming the key")

    # -- submit and cancel ---------------------------------------------------------------------
    def test_submit_returns_the_job_id(self):
        assert self.submit_output is not None, "give the captured output of a submission"
        adapter, runner = self.adapter([self.submit_output])
        script = adapter.render(kit_spec())
        assert adapter.submit(script) == self.submitted_job_id
        argv, stdin = runner.calls[-1]
        assert stdin == script or any(script in a for a in argv), "the script must reach the submit command"

    def test_a_refused_submission_is_a_batch_error_with_the_reason(self):
        refusal = Captured(self.adapter_class.submit_command, "", "kit: no such queue 'kit-queue'", 1)
        adapter = self.adapter([refusal])[0]
        try:
            adapter.submit(adapter.render(kit_spec()))
        except BatchError as exc:
            assert "no such queue 'kit-queue'" in str(exc)
        else:
            raise AssertionError("a refused submission returned; it must raise BatchError with the reason")

    def test_cancel_of_jobs_that_already_ended_is_quiet(self):
        if not self.cancel_outputs:
            return
        adapter, runner = self.adapter(self.cancel_outputs)
        adapter.cancel([e.job_id for e in self.endings][:2] or ["1"])
        assert runner.calls

    def test_nothing_asked_runs_nothing(self):
        adapter, runner = self.adapter()
        assert adapter.status([]) == {} and adapter.accounting([]) == {}
        adapter.cancel([])
        assert not runner.calls

    # -- status --------------------------------------------------------------------------------
    def test_status_maps_states_and_answers_every_id(self):
        adapter = self.adapter([*self.status_outputs, *self.accounting_outputs])[0]
        ids = [*self.status_expected, "999999999"]
        got = adapter.status(ids)
        assert set(got) == set(ids), f"status() must answer every id asked: {sorted(got)}"
        assert {k: got[k].state for k in self.status_expected} == self.status_expected
        assert all(s.state in JOB_STATES for s in got.values())
        assert got["999999999"].state in ("unknown", *FINAL_STATES)

    # -- accounting ----------------------------------------------------------------------------
    def records(self) -> dict[str, AccountingRecord]:
        adapter = self.adapter([*self.accounting_outputs, *self.status_outputs])[0]
        return adapter.accounting([e.job_id for e in self.endings])

    def test_accounting_reports_each_ending_with_what_the_diagnosis_needs(self):
        assert self.endings, "list the captured jobs' endings"
        records = self.records()
        for ending in self.endings:
            rec = records.get(ending.job_id)
            assert rec is not None, f"no accounting record for job {ending.job_id}"
            assert (rec.job_id, rec.state, rec.final) == (ending.job_id, ending.state, ending.state in FINAL_STATES)
            assert rec.raw, f"job {ending.job_id}: keep the batch system's own lines in raw (shown as evidence)"
            for name in ("exit_code", "signal"):
                want = getattr(ending, name)
                if want is not ...:
                    assert getattr(rec, name) == want, f"job {ending.job_id}: {name} {getattr(rec, name)!r}, want {want!r}"
            for names in DEATH_FIELDS.get(rec.state, ()):
                assert any(getattr(rec, n) is not None for n in names), \
                    f"job {ending.job_id} ({rec.state}): {' or '.join(names)} missing"
            if rec.state == "timeout":
                assert rec.elapsed >= rec.time_limit * 0.9, f"job {ending.job_id}: a timeout before its limit?"

    def test_the_diagnosis_reads_each_ending_right(self):
        records = self.records()
        for ending in self.endings:
            if ending.cause is None:
                continue
            record = dataclasses.asdict(records[ending.job_id])
            ev = Evidence(accounting=record, registered=ending.registered, nanny=ending.nanny,
                          executing=["kit-task"] if ending.registered else [], job_id=ending.job_id)
            verdict = diagnose(ev)
            assert verdict.cause == ending.cause, (f"job {ending.job_id} ({record['raw_state']}): the "
                                                   f"diagnosis says {verdict.cause!r} ({verdict.text})")

    def test_unreadable_output_is_a_batch_error_or_nothing(self):
        commands = {c.command for c in (*self.status_outputs, *self.accounting_outputs)}
        garbage = [Captured(c, self.garbage) for c in commands]
        adapter = self.adapter(garbage)[0]
        for call in (adapter.status, adapter.accounting):
            try:
                got = call(["12"])
            except BatchError:
                continue
            assert all(getattr(r, "state", "unknown") in ("unknown",) for r in got.values()), got
