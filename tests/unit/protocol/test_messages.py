"""protocol/messages.py: the one vocabulary (issue 30, point 4).

Members are their wire strings (equal, same hash, packed and dumped as plain strings, so peers
and old journals keep working); every op the handler tables dispatch on or a layer sends is a
member; and no module but messages.py writes a death cause (or an error kind) as a literal.
"""

from __future__ import annotations

import ast
import importlib
import json
import textwrap
from pathlib import Path

import msgpack
import pytest

from hpc_cluster.protocol import frames
from hpc_cluster.protocol.messages import BLAMED_CAUSES, MEMORY_CAUSES, Cause, ErrorKind, Op, WireStr
from hpc_cluster.scheduler import journal

PACKAGE = Path(__file__).resolve().parents[3] / "hpc_cluster"

# The wire as it was before the vocabulary had names: a member's value must never change (a
# peer of another version or an old journal sends these exact strings).
WIRE_OPS = {
    "auth", "auth-proof", "welcome", "refused", "register-worker", "task-started", "task-finished",
    "task-erred", "task-seceded", "task-rejoined", "missing-data", "handed-back", "abandoned-done",
    "add-replica", "replica-failed", "heartbeat", "goodbye", "register-nanny", "exit-report", "registered",
    "compute", "free-keys", "fetch-replica", "hand-back", "free-all", "close", "heartbeat-interval",
    "restart", "end-unresponsive", "update-graph", "release-keys", "want-keys", "cancel", "scatter",
    "who-has", "workers", "deaths", "replicate", "task-spec", "why", "versions", "counts",
    "key-in-memory", "key-recomputing", "scheduler-closed", "cluster-halted", "reply", "get-data",
    "put-data", "ping", "get-logs", "data", "ok", "pong", "logs", "scale", "jobs", "adapt", "shutdown",
}
# issue 31, reaching and preparing workers (client.run, worker plugins)
WIRE_OPS |= {"run", "run-result", "register-worker-plugin", "unregister-worker-plugin", "setup-plugin",
             "teardown-plugin", "restart-workers"}
# issue 31, looking inside the cluster (who_has, task streams, events, metadata, logs)
WIRE_OPS |= {"has-what", "processing", "nthreads", "all-who-has", "task-stream", "scheduler-logs", "get-events",
             "set-metadata", "get-metadata", "rebalance", "subscribe-topic", "unsubscribe-topic", "log-event",
             "forward-logging", "event"}
# issue 31, coordination (locks, semaphores, events, variables, queues, fire_and_forget, datasets)
WIRE_OPS |= {"semaphore-register", "semaphore-acquire", "semaphore-release", "semaphore-value", "semaphore-close",
             "multi-lock-acquire", "multi-lock-release", "event-wait", "event-set", "event-clear", "event-is-set",
             "variable-set", "variable-get", "variable-delete", "queue-create", "queue-put", "queue-get",
             "queue-size", "queue-close", "fire-and-forget", "dataset-put", "dataset-get", "dataset-list",
             "dataset-delete", "coordination-taken"}
# issue 31, futures (client.retry, LocalCluster.adapt)
WIRE_OPS |= {"retry", "task-retried", "workload", "drain-workers"}
# issue 31, point 10 (scheduler_info's identity, client.nbytes)
WIRE_OPS |= {"identity", "nbytes"}
WIRE_KINDS = {"exception", "dependency", "missing", "refused", "cancelled", "lost-data", "killed-worker",
              "too-long", "no-pool", "unsendable"}
# DESIGN.md's table, in its order.
WIRE_CAUSES = ["retired", "walltime", "memory-batch", "memory-nanny", "crash", "startup", "cancelled",
               "preempted", "node-failure", "connection-lost", "scheduler-lost", "heartbeat-lost", "unknown"]
ALL = [*Op, *ErrorKind, *Cause]


def test_the_values_are_the_wire_strings_of_before():
    assert {m.value for m in Op} == WIRE_OPS
    assert {m.value for m in ErrorKind} == WIRE_KINDS
    assert [m.value for m in Cause] == WIRE_CAUSES
    assert MEMORY_CAUSES == {"memory-batch", "memory-nanny"}
    assert BLAMED_CAUSES == {"memory-batch", "memory-nanny", "crash"}


def _decoded(s: str) -> str:
    """The string as a peer's message brings it: a fresh (not interned) str object."""
    return msgpack.unpackb(msgpack.packb(s), raw=False)


@pytest.mark.parametrize("m", ALL, ids=lambda m: f"{type(m).__name__}.{m.name}")
def test_a_member_is_its_wire_string(m):
    s = _decoded(m.value)
    assert isinstance(m, str) and m == s and s == m and not (m != s)
    assert hash(m) == hash(s)           # Enum's own __hash__ (of the name) must not be the one used
    assert str(m) == f"{m}" == "%s" % m == s
    assert repr(m) == repr(s) and f"{m!r}" == repr(s)
    assert f"{m:>20}" == f"{s:>20}"


def test_a_table_keyed_by_members_finds_the_handler_by_the_wire_string_and_back():
    handlers = {m: m.name for m in ALL if isinstance(m, Op)}
    for m in Op:
        assert handlers[_decoded(m.value)] == m.name and _decoded(m.value) in handlers
    plain = {m.value: m.name for m in Op}
    assert all(plain[m] == m.name for m in Op)
    assert {_decoded(c.value) for c in Cause} == set(Cause)
    assert _decoded("memory-nanny") in MEMORY_CAUSES and "crash" in BLAMED_CAUSES and "walltime" not in BLAMED_CAUSES


def test_the_daemons_handlers_are_found_by_the_wire_op():
    from hpc_cluster.deploy.daemon.handlers import HANDLERS
    assert set(HANDLERS) == {"scale", "jobs", "adapt", "shutdown"}
    assert all(_decoded(op) in HANDLERS for op in ("scale", "jobs", "adapt", "shutdown"))


def _record(members: bool) -> dict:
    v = (lambda m: m) if members else (lambda m: m.value)
    return {"op": v(Op.TASK_ERRED), "key": "x", "error": {"kind": v(ErrorKind.KILLED_WORKER), "attempts": [
        {"cause": v(Cause.MEMORY_NANNY), "blame": True}]}, v(Cause.WALLTIME): [v(Op.COMPUTE), v(ErrorKind.NO_POOL)]}


def test_msgpack_packs_members_as_plain_strings_byte_for_byte():
    with_members, plain = _record(True), _record(False)
    assert msgpack.packb(with_members, use_bin_type=True) == msgpack.packb(plain, use_bin_type=True)
    back = msgpack.unpackb(msgpack.packb(with_members, use_bin_type=True), raw=False)
    assert back == plain and type(back["op"]) is str and type(back["error"]["attempts"][0]["cause"]) is str
    # The wire's own framing and the journal's records: the same bytes as before.
    assert b"".join(map(bytes, frames.dumps([with_members]))) == b"".join(map(bytes, frames.dumps([plain])))
    assert journal.pack(with_members) == journal.pack(plain)


def test_json_dumps_members_as_plain_strings():
    # The CLI's --json output and the dashboard's JSON must not change.
    with_members, plain = _record(True), _record(False)
    for kw in ({}, {"indent": 2}, {"sort_keys": True}, {"indent": 1, "sort_keys": True}):
        assert json.dumps(with_members, **kw) == json.dumps(plain, **kw)


def test_every_python_from_3_10_formats_a_member_as_its_value():
    # Python 3.12 made format() of a mixed-in Enum print "Cause.WALLTIME"; WireStr keeps the value.
    assert WireStr.__format__ is str.__format__ and WireStr.__str__ is str.__str__
    assert "{}".format(Cause.WALLTIME) == "walltime" and format(Op.COMPUTE, "") == "compute"


# -- every op dispatched on or sent is a member ------------------------------------------------
def _is_op_expr(node: ast.AST) -> bool:
    text = ast.unparse(node)
    return text == "op" or text.endswith(('["op"]', "['op']", '.get("op")', ".get('op')"))


def op_uses(path: Path, module: str) -> list[tuple[int, str, ast.AST]]:
    """(line, how, node) for what a module compares `op` / msg["op"] with, puts under "op" in a
    message, keys the daemon's HANDLERS by, or names in control(path, OP, ...)."""
    out = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Compare):
            sides = [node.left, *node.comparators]
            if any(_is_op_expr(s) for s in sides):
                for side in sides:
                    if not _is_op_expr(side):
                        elts = side.elts if isinstance(side, (ast.Tuple, ast.List, ast.Set)) else [side]
                        out.extend((node.lineno, "compared", e) for e in elts)
        elif isinstance(node, ast.Dict):
            for k, v in zip(node.keys, node.values):
                if isinstance(k, ast.Constant) and k.value == "op":
                    out.append((node.lineno, "sent", v))
        elif isinstance(node, ast.Assign) and [ast.unparse(t) for t in node.targets] == ["HANDLERS"]:
            out.extend((node.lineno, "handler", k) for k in node.value.keys)
        elif isinstance(node, ast.Call) and ast.unparse(node.func) == "control" and len(node.args) >= 2:
            out.append((node.lineno, "control", node.args[1]))
    return out


def _value_of(node: ast.AST, module: str):
    """The string an op expression stands for, if it is known without running the code (a
    constant, Op.X, or a module-level name bound to one); None for a variable."""
    if isinstance(node, ast.Constant):
        return node.value
    if isinstance(node, ast.Attribute) and ast.unparse(node.value) == "Op":
        return getattr(Op, node.attr)
    if isinstance(node, ast.Name):
        return getattr(importlib.import_module(module), node.id, None)
    return None


def op_problems(path: Path, module: str) -> tuple[list[str], set[str]]:
    bad, seen = [], set()
    for line, how, node in op_uses(path, module):
        value = _value_of(node, module)
        if isinstance(node, ast.Constant):
            bad.append(f"line {line}: {how} the literal {node.value!r} (name it Op.X)")
        elif isinstance(value, frozenset):              # a named group of ops (COORDINATION_OPS): each a member
            strays = sorted(v for v in value if v not in set(Op))
            if strays:
                bad.append(f"line {line}: {how} {ast.unparse(node)}, which holds {strays}, not Ops")
            seen |= value
        elif value is not None and value not in set(Op):
            bad.append(f"line {line}: {how} {ast.unparse(node)} = {value!r}, not an Op")
        elif value is not None:
            seen.add(value)
    return bad, seen


SOURCES = sorted(p for p in PACKAGE.rglob("*.py") if p.name != "messages.py")


def _module(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def test_every_op_dispatched_on_or_sent_is_a_member():
    bad, seen = [], {}
    for path in SOURCES:
        if path.relative_to(PACKAGE).as_posix() == "scheduler/journal.py":
            continue                       # its writer thread's queue items ("write", "stop"): not messages
        problems, ops = op_problems(path, _module(path))
        bad += [f"{path.relative_to(PACKAGE)} {p}" for p in problems]
        seen[path.relative_to(PACKAGE).as_posix()] = ops
    assert not bad, bad
    # The scan saw the handler tables it is meant to check (it would pass on nothing otherwise).
    assert {"task-finished", "heartbeat", "goodbye", "register-worker"} <= seen["scheduler/links.py"]
    assert {"update-graph", "why", "counts", "restart"} <= seen["scheduler/server.py"]
    assert {"compute", "free-keys", "registered"} <= seen["worker/worker.py"]
    assert {"get-data", "put-data", "ping", "get-logs", "run"} <= seen["worker/peer_port.py"]
    assert {"restart", "end-unresponsive", "exit-report"} <= seen["worker/nanny.py"]
    assert {"key-in-memory", "task-erred", "reply", "cluster-halted"} <= seen["client/client.py"]
    assert {"scale", "jobs", "adapt", "shutdown"} <= seen["deploy/daemon/handlers.py"]
    assert {"auth", "auth-proof", "welcome", "refused"} <= seen["protocol/comm.py"]
    assert len(set().union(*seen.values())) >= 55


def test_the_op_scan_catches_a_literal_and_a_stray_name(tmp_path, monkeypatch):
    src = tmp_path / "m.py"
    src.write_text(textwrap.dedent("""\
        NOT_AN_OP = "frobnicate"
        def f(msg, send):
            op = msg["op"]
            if op == "compute" or msg.get("op") in (NOT_AN_OP,):
                send({"op": "free-keys"})
            HANDLERS = {"scale": 1}
            control(path, "jobs")
        """))
    monkeypatch.syspath_prepend(str(tmp_path))
    bad, _ = op_problems(src, "m")
    assert len(bad) == 5, bad


# -- no death cause (or error kind) written as a literal outside messages.py ---------------------
CAUSES = {c.value for c in Cause}
KINDS = {k.value for k in ErrorKind}
# Causes that are also words of other vocabularies: "walltime" (the option and a job's time
# limit), "cancelled" (a job's accounting state, a future's status), "unknown" (a job's state),
# "preempted" (an accounting state). These are flagged where they are used AS a cause (below);
# the others mean nothing else and are flagged anywhere in code.
SHARED_WORDS = {"walltime", "cancelled", "unknown", "preempted"}
UNAMBIGUOUS = CAUSES - SHARED_WORDS
# The documented exceptions: (module, literal) -> why. Keep it empty if at all possible.
ALLOWED: dict[tuple[str, str], str] = {}


def _is_cause_context(node: ast.AST) -> bool:
    return "cause" in ast.unparse(node).lower()


def _strings(node: ast.AST):
    for n in ast.walk(node):
        if isinstance(n, ast.Constant) and isinstance(n.value, str):
            yield n


def vocabulary_literals(source: str) -> list[tuple[int, str, str]]:
    """(line, literal, why) for each death cause used as one, and each error kind, in code."""
    tree = ast.parse(source)
    docstrings = {id(n.value) for n in ast.walk(tree) if isinstance(n, ast.Expr) and isinstance(n.value, ast.Constant)}
    found: dict[int, tuple[int, str, str]] = {}

    def flag(n, why):
        if id(n) not in docstrings and isinstance(n, ast.Constant) and isinstance(n.value, str):
            found.setdefault(id(n), (n.lineno, n.value, why))

    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and node.value in UNAMBIGUOUS:
            flag(node, "a death cause")
        elif isinstance(node, ast.Compare):
            sides = [node.left, *node.comparators]
            if any(_is_cause_context(s) for s in sides):
                for s in sides:
                    for c in _strings(s):
                        if c.value in CAUSES:
                            flag(c, "compared with a cause")
            if any("kind" in ast.unparse(s) for s in sides):
                for s in sides:
                    for c in _strings(s):
                        if c.value in KINDS:
                            flag(c, "compared with an error kind")
        elif isinstance(node, ast.Dict):
            keys = [k.value for k in node.keys if isinstance(k, ast.Constant)]
            for k, v in zip(node.keys, node.values):
                if isinstance(k, ast.Constant) and k.value == "cause" and isinstance(v, ast.Constant) and v.value in CAUSES:
                    flag(v, "a record's cause")
                if isinstance(k, ast.Constant) and k.value == "kind" and isinstance(v, ast.Constant) and v.value in KINDS:
                    flag(v, "an error record's kind")
                if isinstance(k, ast.Constant) and k.value in CAUSES and set(keys) & UNAMBIGUOUS:
                    flag(k, "a table keyed by cause")
        elif isinstance(node, (ast.Tuple, ast.List, ast.Set)):
            values = [e for e in node.elts if isinstance(e, ast.Constant)]
            if any(e.value in UNAMBIGUOUS for e in values):
                for e in values:
                    if e.value in CAUSES:
                        flag(e, "grouped with causes")
        elif isinstance(node, ast.Call):
            for kw in node.keywords:
                if kw.arg in ("cause", "kind") and isinstance(kw.value, ast.Constant) \
                        and kw.value.value in (CAUSES if kw.arg == "cause" else KINDS):
                    flag(kw.value, f"{kw.arg}=")
            if isinstance(node.func, ast.Attribute) and node.func.attr == "get" and len(node.args) == 2 \
                    and isinstance(node.args[0], ast.Constant) and node.args[0].value == "cause":
                flag(node.args[1], "a cause's default")
    return sorted(found.values())


@pytest.mark.parametrize("path", SOURCES, ids=[p.relative_to(PACKAGE).as_posix() for p in SOURCES])
def test_no_module_writes_a_death_cause_or_error_kind_as_a_literal(path):
    name = path.relative_to(PACKAGE).as_posix()
    bad = [f"line {line}: {value!r} ({why})" for line, value, why in vocabulary_literals(path.read_text())
           if (name, value) not in ALLOWED]
    assert not bad, f"{name}: use protocol.messages' Cause / ErrorKind instead of: {bad}"


def test_the_vocabulary_scan_catches_causes_and_kinds_used_as_such():
    src = textwrap.dedent('''\
        """A docstring may say 'memory-batch' and "crash"."""
        def f(death, err, ev, acct):
            """So may a function's: heartbeat-lost."""
            a = death["cause"] == "walltime"                    # 1
            b = death.get("cause", "unknown")                   # 2
            c = {"cause": "cancelled", "blame": False}          # 3
            d = ("memory-batch", "memory-nanny")                # 4, 5
            e = err.get("kind") == "killed-worker"              # 6
            g = {"kind": "lost-data", "text": ""}               # 7
            h = Verdict("x", cause="preempted")                 # 8
            i = {"retired": 1, "walltime": 2}                   # 9, 10
            j = "node-failure"                                  # 11
            # Not causes: an accounting state, the option, a future's status, a pool's need.
            k = acct["state"] == "preempted" or ev.state == "cancelled"
            m = {"walltime": "00:30:00", "state": "unknown"}
            n = ("timeout", "deadline", "preempted", "cancelled")
            return "walltime"
        ''')
    found = vocabulary_literals(src)
    assert len(found) == 11, found
    assert {v for _, v, _ in found} == {"walltime", "unknown", "cancelled", "memory-batch", "memory-nanny",
                                        "killed-worker", "lost-data", "preempted", "retired", "node-failure"}
