"""The one vocabulary of the wire: message ops, error kinds and death causes.

Every layer imports these names from here instead of writing the strings again. Each member
IS its wire string (a `str` subclass): it compares and hashes equal to the plain string a peer
or an old journal sends, packs into msgpack and dumps to JSON as that string, and formats as
it (`f"{cause}"` is "walltime", not "Cause.WALLTIME", on every Python >= 3.10; `repr` is
'walltime' too, so no message a user reads changes with where the string came from). The values are
part of the protocol and of the public API (the death causes are DESIGN.md's table): never
change one, only add.

Speed: reading `Op.COMPUTE` goes through the Enum class (~75 ns on 3.11, against ~1 ns for a
literal), and comparing a member with a decoded string misses the interpreter's str-only fast
path. Hot loops (the scheduler's and the worker's dispatch, the state machine's messages) bind
plain copies at import, `COMPUTE = Op.COMPUTE.value`, and pay what a literal costs.
"""

from __future__ import annotations

from enum import Enum


class WireStr(str, Enum):
    """A member that is its own wire string, also where Enum would print its name."""

    __str__ = str.__str__            # str(m), "%s" % m: the value (Enum's would be "Op.COMPUTE")
    __format__ = str.__format__      # f"{m}": the value (Python 3.12 changed Enum's to the name)
    __repr__ = str.__repr__          # f"{m!r}", in messages users read: 'walltime', as a wire string shows


class Op(WireStr):
    """The `op` of every message, by who sends it."""

    # handshake (protocol/comm.py)
    AUTH = "auth"
    AUTH_PROOF = "auth-proof"
    WELCOME = "welcome"
    REFUSED = "refused"
    # worker -> scheduler
    REGISTER_WORKER = "register-worker"
    TASK_STARTED = "task-started"
    TASK_FINISHED = "task-finished"
    TASK_ERRED = "task-erred"
    TASK_SECEDED = "task-seceded"
    TASK_REJOINED = "task-rejoined"
    MISSING_DATA = "missing-data"
    HANDED_BACK = "handed-back"
    ABANDONED_DONE = "abandoned-done"
    ADD_REPLICA = "add-replica"
    REPLICA_FAILED = "replica-failed"
    HEARTBEAT = "heartbeat"
    GOODBYE = "goodbye"
    # nanny -> scheduler
    REGISTER_NANNY = "register-nanny"
    EXIT_REPORT = "exit-report"
    # scheduler -> worker / nanny
    REGISTERED = "registered"
    COMPUTE = "compute"
    FREE_KEYS = "free-keys"
    FETCH_REPLICA = "fetch-replica"
    HAND_BACK = "hand-back"
    FREE_ALL = "free-all"
    CLOSE = "close"
    HEARTBEAT_INTERVAL = "heartbeat-interval"
    RESTART = "restart"
    END_UNRESPONSIVE = "end-unresponsive"
    # client -> scheduler
    UPDATE_GRAPH = "update-graph"
    RELEASE_KEYS = "release-keys"
    WANT_KEYS = "want-keys"
    CANCEL = "cancel"
    SCATTER = "scatter"
    WHO_HAS = "who-has"
    WORKERS = "workers"
    DEATHS = "deaths"
    REPLICATE = "replicate"
    TASK_SPEC = "task-spec"
    WHY = "why"
    VERSIONS = "versions"
    COUNTS = "counts"
    # scheduler -> client
    KEY_IN_MEMORY = "key-in-memory"
    KEY_RECOMPUTING = "key-recomputing"
    SCHEDULER_CLOSED = "scheduler-closed"
    CLUSTER_HALTED = "cluster-halted"
    REPLY = "reply"
    # peer -> worker (data moves, logs) and the worker's answers
    GET_DATA = "get-data"
    PUT_DATA = "put-data"
    PING = "ping"
    GET_LOGS = "get-logs"
    DATA = "data"
    OK = "ok"
    PONG = "pong"
    LOGS = "logs"
    # anyone -> the cluster daemon (its handlers in the scheduler process)
    SCALE = "scale"
    JOBS = "jobs"
    ADAPT = "adapt"
    SHUTDOWN = "shutdown"


class ErrorKind(WireStr):
    """The `kind` of a task's error record (scheduler -> client; client/exceptions.py maps each
    to the exception the user catches)."""

    EXCEPTION = "exception"            # the task raised
    DEPENDENCY = "dependency"          # an input's task failed
    MISSING = "missing"                # an input was released before it was needed
    REFUSED = "refused"                # the scheduler refused the submission
    CANCELLED = "cancelled"
    LOST_DATA = "lost-data"            # scattered data or a result with no lineage is gone
    KILLED_WORKER = "killed-worker"    # it was running on too many workers that died
    TOO_LONG = "too-long"              # longer than every pool's walltime
    NO_POOL = "no-pool"                # no pool has what it asks for
    UNSENDABLE = "unsendable"          # the client could not serialize it


class Cause(WireStr):
    """Why a worker died: DESIGN.md's table, stable strings of the public API."""

    RETIRED = "retired"
    WALLTIME = "walltime"
    MEMORY_BATCH = "memory-batch"
    MEMORY_NANNY = "memory-nanny"
    CRASH = "crash"
    STARTUP = "startup"
    CANCELLED = "cancelled"
    PREEMPTED = "preempted"
    NODE_FAILURE = "node-failure"
    CONNECTION_LOST = "connection-lost"
    SCHEDULER_LOST = "scheduler-lost"
    HEARTBEAT_LOST = "heartbeat-lost"
    UNKNOWN = "unknown"


# Groups more than one layer asks about.
MEMORY_CAUSES = frozenset({Cause.MEMORY_BATCH, Cause.MEMORY_NANNY})
BLAMED_CAUSES = MEMORY_CAUSES | {Cause.CRASH}          # charged to the tasks that were executing
