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
    # issue 31, reaching and preparing workers: client.run, worker plugins, upload_file
    # (client/workers.py, worker/plugins.py, scheduler/worker_plugins.py)
    RUN = "run"                                          # client -> worker; nanny=True: -> scheduler -> nanny
    RUN_RESULT = "run-result"                            # a worker's or nanny's answer to it
    REGISTER_WORKER_PLUGIN = "register-worker-plugin"    # client -> scheduler: keep it for workers to come
    UNREGISTER_WORKER_PLUGIN = "unregister-worker-plugin"
    SETUP_PLUGIN = "setup-plugin"                        # client -> worker: set this plugin up now
    TEARDOWN_PLUGIN = "teardown-plugin"                  # client -> worker: tear it down, forget it
    RESTART_WORKERS = "restart-workers"                  # client -> scheduler: these through their nannies
    # issue 31, looking inside the cluster (client/looking.py, scheduler/inspection.py, worker/events.py)
    HAS_WHAT = "has-what"                                # client -> scheduler, each answered with a reply
    PROCESSING = "processing"
    NTHREADS = "nthreads"
    ALL_WHO_HAS = "all-who-has"                          # who_has() of every task (WHO_HAS names its keys)
    TASK_STREAM = "task-stream"
    SCHEDULER_LOGS = "scheduler-logs"
    GET_EVENTS = "get-events"
    SET_METADATA = "set-metadata"
    GET_METADATA = "get-metadata"
    REBALANCE = "rebalance"
    SUBSCRIBE_TOPIC = "subscribe-topic"                  # client -> scheduler, no reply
    UNSUBSCRIBE_TOPIC = "unsubscribe-topic"
    LOG_EVENT = "log-event"                              # client or worker (a task's print, warn) -> scheduler
    FORWARD_LOGGING = "forward-logging"                  # client -> scheduler -> every worker: loggers to forward
    EVENT = "event"                                      # scheduler -> client: an event of a topic it hears
    # issue 31, coordination: client (or a task's client) -> scheduler, answered with a reply, the
    # waiting ones when granted or timed out (client/coordination.py, scheduler/coordination.py)
    SEMAPHORE_REGISTER = "semaphore-register"            # Lock is a semaphore of one lease
    SEMAPHORE_ACQUIRE = "semaphore-acquire"
    SEMAPHORE_RELEASE = "semaphore-release"
    SEMAPHORE_VALUE = "semaphore-value"
    SEMAPHORE_CLOSE = "semaphore-close"
    MULTI_LOCK_ACQUIRE = "multi-lock-acquire"
    MULTI_LOCK_RELEASE = "multi-lock-release"
    EVENT_WAIT = "event-wait"
    EVENT_SET = "event-set"
    EVENT_CLEAR = "event-clear"
    EVENT_IS_SET = "event-is-set"
    VARIABLE_SET = "variable-set"
    VARIABLE_GET = "variable-get"
    VARIABLE_DELETE = "variable-delete"                  # no reply
    QUEUE_CREATE = "queue-create"
    QUEUE_PUT = "queue-put"
    QUEUE_GET = "queue-get"
    QUEUE_SIZE = "queue-size"
    QUEUE_CLOSE = "queue-close"                          # no reply
    FIRE_AND_FORGET = "fire-and-forget"                  # no reply
    DATASET_PUT = "dataset-put"                          # client.publish_dataset (client/datasets.py)
    DATASET_GET = "dataset-get"
    DATASET_LIST = "dataset-list"
    DATASET_DELETE = "dataset-delete"
    COORDINATION_TAKEN = "coordination-taken"            # the client holds futures to a value's keys now
    # issue 31, futures and the rest of Client's surface (client/future_ops.py,
    # scheduler/state/retrying.py, deploy/local/adapt.py)
    RETRY = "retry"                                      # client -> scheduler, answered with a reply
    TASK_RETRIED = "task-retried"                        # scheduler -> client: its failed future runs again
    WORKLOAD = "workload"                                # LocalCluster.adapt -> scheduler: queued work, workers
    DRAIN_WORKERS = "drain-workers"                      # LocalCluster.adapt -> scheduler: retire these gracefully
    # issue 31, point 10: what distributed's own tests found missing (client/identity.py,
    # scheduler/identity.py); client -> scheduler, answered with a reply
    IDENTITY = "identity"                                # scheduler_info(): started, totals, workers
    NBYTES = "nbytes"                                    # client.nbytes(): bytes of the results in memory


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
