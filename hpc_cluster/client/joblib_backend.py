"""joblib's backend for our cluster: scikit-learn's fits (any joblib.Parallel) run on the workers.

    with joblib.parallel_backend("hpc-cluster"):
        GridSearchCV(SVC(), grid, cv=5).fit(X, y)

hpc_cluster registers "hpc-cluster" with joblib as soon as joblib is loaded (hpc_cluster/__init__.py:
an import hook, so importing hpc_cluster loads neither joblib nor this module), and "dask" too:
joblib's own dask backend cannot drive our Client (it takes distributed's `get_client()`, runs
coroutines on the client's tornado loop, `distributed.as_completed(loop=...)`, asynchronous
scatter), so "dask" is a dispatcher: our backend while one of our Clients is the current one (or
`client=` is ours), joblib's own DaskDistributedBackend otherwise.

It behaves as joblib's dask backend, keyword for keyword (`client`, `scheduler_host`, `scatter`,
`wait_for_workers_timeout`, the rest handed to Client.submit): a batch of joblib's calls is one
task; large arguments are scattered once per Parallel call, not pickled into every batch; n_jobs
is the cluster's threads; a Parallel call inside a task submits to the task's own cluster and gives
up its thread slot while it waits.
"""

from __future__ import annotations

import contextlib
import inspect
import threading
import uuid

from joblib.parallel import AutoBatchingMixin, ParallelBackendBase

from .client import Client
from .exceptions import TimeoutError
from .seceding import seceded_while_waiting
from .subtasks import get_client

# Arguments larger than this (dask's sizeof) go to the workers once per call, as joblib's dask
# backend does: GridSearchCV passes the same X and y to every fit.
SCATTER_ABOVE = 1_000
# What Client.submit takes besides the function and its arguments: parallel_config's extra
# keywords must be among them (the key is ours, one per batch; a batch is never pure: joblib may
# run the same calls twice on purpose).
SUBMIT_KEYWORDS = frozenset(inspect.signature(Client.submit).parameters) - {"self", "func", "args", "kwargs", "key",
                                                                             "pure"}


def _run_batch(batch):
    """The task: one of joblib's BatchedCalls (its arguments arrive with the scattered ones in place)."""
    return batch()


def _probe():
    """Submitted when the cluster has no worker yet: an adaptive cluster starts one for it."""


def _our_client(client) -> Client:
    if isinstance(client, Client):
        return client
    raise TypeError(f"client={client!r}: the 'hpc-cluster' joblib backend needs an hpc_cluster Client "
                    "(client = hpc_cluster.Client(cluster)); for a dask.distributed Client use "
                    "parallel_config('dask', client=...) without hpc_cluster's Client being current")


class HPCClusterBackend(AutoBatchingMixin, ParallelBackendBase):
    """joblib.Parallel's batches as tasks on an hpc_cluster cluster (see the module's docstring)."""

    MIN_IDEAL_BATCH_DURATION = 0.2        # joblib's dask backend's: a task costs ~ms, not us
    MAX_IDEAL_BATCH_DURATION = 1.0
    supports_retrieve_callback = True
    default_n_jobs = -1

    def __init__(self, client=None, scheduler_host=None, scatter=None, loop=None, wait_for_workers_timeout=10,
                 nesting_level=None, inner_max_num_threads=None, _deferred=False, **submit_kwargs):
        super().__init__(nesting_level=nesting_level, inner_max_num_threads=inner_max_num_threads)
        unknown = sorted(set(submit_kwargs) - SUBMIT_KEYWORDS)
        if unknown:
            raise TypeError(f"parallel_config('hpc-cluster', {unknown[0]}=...): not a keyword of the backend "
                            f"nor of Client.submit; the backend takes client, scheduler_host, scatter, "
                            f"wait_for_workers_timeout and {', '.join(sorted(SUBMIT_KEYWORDS))}")
        if scatter is not None and not isinstance(scatter, (list, tuple)):
            raise TypeError(f"scatter must be a list or tuple of the arguments to send once, got "
                            f"{type(scatter).__name__}")
        self.submit_kwargs = submit_kwargs
        self.wait_for_workers_timeout = wait_for_workers_timeout
        self._client = None
        if client is not None:
            self._client = _our_client(client)
        elif scheduler_host:
            self._client = Client(scheduler_host, set_as_default=False)
        elif not _deferred:
            self._client = self._current_client()
        self._broadcast: dict[int, tuple[object, object]] = {}      # id -> (the object, its Future)
        if scatter:
            futures = self.client.scatter(list(scatter), broadcast=True)
            self._broadcast = {id(x): (x, f) for x, f in zip(scatter, futures)}
        self._lock = threading.Lock()
        self._scattered: dict[int, tuple[object, object]] = {}     # this call's: id -> (object, Future)
        self._running: dict[str, object] = {}                       # key -> Future, until its callback

    @staticmethod
    def _current_client() -> Client:
        try:
            return get_client()          # inside a task: its own cluster's; else the current default
        except ValueError:
            raise ValueError("the 'hpc-cluster' joblib backend needs a Client: create one first, e.g.\n"
                             "    client = hpc_cluster.Client(cluster)\n"
                             "or pass one: parallel_config('hpc-cluster', client=client)") from None

    @property
    def client(self) -> Client:
        # A backend unpickled on a worker (a nested Parallel's) finds the task's cluster when used.
        if self._client is None:
            self._client = self._current_client()
        return self._client

    def __reduce__(self):
        # Travels inside joblib's BatchedCalls as the nested backend: never the Client itself.
        return (_deferred_backend, ())

    def get_nested_backend(self):
        # As joblib's dask backend: a Parallel call inside a task runs on the cluster too.
        return HPCClusterBackend(client=self.client), -1

    # -- sizing ------------------------------------------------------------------------------
    def configure(self, n_jobs=1, parallel=None, **backend_kwargs):
        self.parallel = parallel
        return self.effective_n_jobs(n_jobs)

    def effective_n_jobs(self, n_jobs):
        """The cluster's threads (n_jobs asks for nothing here, as with joblib's dask backend); with
        no worker yet, a probe task waits for one (and makes an adaptive cluster start one)."""
        threads = sum(self.client.nthreads().values())
        if threads or not self.wait_for_workers_timeout:
            return threads
        try:
            self.client.submit(_probe, pure=False).result(timeout=self.wait_for_workers_timeout)
        except TimeoutError:
            raise TimeoutError(
                f"the 'hpc-cluster' joblib backend found no worker within {self.wait_for_workers_timeout} s: "
                "scale the cluster (cluster.scale(n) or cluster.adapt(...)) or wait longer with "
                f"parallel_config('hpc-cluster', wait_for_workers_timeout="
                f"{max(10, 2 * self.wait_for_workers_timeout)})") from None
        return sum(self.client.nthreads().values())

    # -- one Parallel call -------------------------------------------------------------------
    def start_call(self):
        with self._lock:
            self._scattered = {}

    def stop_call(self):
        # Drop this call's scattered arguments: the workers let them go with their last Future.
        with self._lock:
            self._scattered = {}

    def _scatter_large(self, arg):
        """`arg`, or the Future of its copy on the cluster when it is large (sent once per call)."""
        held = self._broadcast.get(id(arg)) or self._scattered.get(id(arg))
        if held is not None and held[0] is arg:
            return held[1]
        from dask.sizeof import sizeof
        if sizeof(arg) <= SCATTER_ABOVE:
            return arg
        # One key for the whole object, not hashed: two equal objects (two clones of an estimator
        # that the tasks fit in place) stay two, as with joblib's dask backend.
        future = self.client.scatter([arg], hash=False)[0]
        with self._lock:
            # Holding the object keeps its id from being reused for another within the call.
            self._scattered[id(arg)] = (arg, future)
        return future

    def submit(self, func, callback=None):
        """Run joblib's batch `func` as one task; `callback` gets its results (or its exception)."""
        func.items = [(f, [self._scatter_large(a) for a in args], {k: self._scatter_large(v) for k, v in kwargs.items()})
                      for f, args, kwargs in func.items]
        name = getattr(func.items[0][0], "__name__", "call") if func.items else "call"   # sklearn's keep theirs
        key = f"joblib-{name}-{len(func.items)}-{uuid.uuid4().hex}"
        future = self.client.submit(_run_batch, func, key=key, pure=False, **self.submit_kwargs)
        with self._lock:
            self._running[key] = future

        def done(fut):
            # On the client's callback thread (not its event loop): fetching here is allowed.
            try:
                out = fut.result()
            except BaseException as exc:            # joblib's callback raises it in the caller
                out = exc
            with self._lock:
                self._running.pop(fut.key, None)
            if callback is not None:
                callback(out)
        future.add_done_callback(done)
        return future

    apply_async = submit            # the name joblib before 1.5 calls

    def retrieve_result_callback(self, out):
        if isinstance(out, BaseException):
            raise out
        return out

    def abort_everything(self, ensure_ready=True):
        """A batch failed: the others are of no use to joblib any more; free the workers of them."""
        with self._lock:
            running, self._running = list(self._running.values()), {}
        if running:
            self.client.cancel(running, reason="another batch of the same joblib call failed")

    @contextlib.contextmanager
    def retrieval_context(self):
        # Inside a task, a Parallel call waiting for its batches gives up the task's thread slot
        # (as joblib's dask backend secedes), so a worker with one thread can run them.
        with seceded_while_waiting(self.client.scheduler_address):
            yield


def _deferred_backend() -> HPCClusterBackend:
    return HPCClusterBackend(_deferred=True)


def _ours_for_dask(kwargs: dict) -> bool:
    """Does parallel_config('dask', ...) mean our cluster? Yes with client= one of ours, or with no
    client= and no scheduler_host= while one of our Clients is current."""
    if kwargs.get("client") is not None:
        return isinstance(kwargs["client"], Client)
    if kwargs.get("scheduler_host"):
        return False                    # an address: dask's meaning, a distributed scheduler
    try:
        get_client()
        return True
    except ValueError:
        return False


def _distributed_client_current() -> bool:
    import sys
    if "distributed" not in sys.modules:
        return False                    # never imported: no Client of it can exist
    from distributed import get_client as distributed_client
    try:
        distributed_client()
        return True
    except ValueError:
        return False


def make_backend(name: str, **kwargs) -> ParallelBackendBase:
    """What joblib gets for backend `name` ("hpc-cluster" or "dask"), with its keywords."""
    if name == "dask" and not _ours_for_dask(kwargs):
        if kwargs.get("client") is None and not kwargs.get("scheduler_host") and not _distributed_client_current():
            # joblib's own message would say `from dask.distributed import Client`: not what a
            # program that switched its import to hpc_cluster needs to read.
            raise ValueError("parallel_config('dask') needs a current Client: create one first, e.g.\n"
                             "    client = hpc_cluster.Client(cluster)\n"
                             "(or a dask.distributed Client, for joblib's own dask backend)")
        from joblib._dask import DaskDistributedBackend      # joblib's own, as if we were not here
        return DaskDistributedBackend(**kwargs)
    return HPCClusterBackend(**kwargs)
