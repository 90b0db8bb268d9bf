"""Worker plugins as dask.distributed has them: the `WorkerPlugin` protocol and the plugins it
ships (`UploadFile`, `PipInstall`, `UploadDirectory`, `Environ`), for client.register_plugin.

A plugin is pickled by the client, kept by the scheduler as opaque bytes and set up in every
worker, those running now and those that join later (worker/plugins.py runs them). The classes
live in the client's room because the user makes them there; what they do on a worker they ask
of the worker object they are given (worker/plugins.py's WorkerView), so this module imports
nothing but the standard library, and a worker unpickling one loads nothing more of ours.

Where distributed runs a plugin in the nanny or the scheduler (Environ, UploadDirectory and
restart_workers are its nanny plugins, PipInstall also installs on the scheduler), ours run in
the worker: our scheduler runs no user code, and a worker that joins later sets its plugins up
before it runs any task (docs/migrating-from-distributed.md, "Preparing workers").
"""

from __future__ import annotations

import contextlib
import inspect
import io
import logging
import os
import subprocess
import sys
import tempfile
import uuid
import warnings
import zipfile

logger = logging.getLogger("hpc_cluster.worker.plugins")

# What upload_file takes: what Python can import from a file (a module, or a zip of packages).
IMPORTABLE = (".py", ".zip", ".egg", ".pyz")


class WorkerPlugin:
    """distributed's WorkerPlugin: subclass it, override what you need, and register an
    instance with `client.register_plugin(plugin)`.

    `setup(worker)` runs on every worker, now and on those that join later, before they run
    a task; `teardown(worker)` when the plugin is unregistered or the worker closes;
    `transition(key, start, finish, **kwargs)` as a task on the worker goes ready ->
    executing -> memory (or error). Each may be a coroutine function. With `idempotent = True`
    registering a plugin of a name already registered keeps the one there.
    """

    idempotent: bool = False

    def setup(self, worker):
        """Run when the plugin is attached to a worker."""

    def teardown(self, worker):
        """Run when the plugin is removed, or its worker closes."""

    def transition(self, key, start, finish, **kwargs):
        """Run as a task on the worker changes state (ready, executing, memory, error)."""


class UploadFile(WorkerPlugin):
    """Put a file (.py, .zip, .egg) in every worker's local_directory, importable there; what
    client.upload_file registers. `load`: import it at once (a module already imported is
    reloaded, so a new version of a file replaces the old)."""

    name = "upload_file"

    def __init__(self, filepath: str, load: bool = True):
        self.filename = os.path.basename(filepath)
        self.load = load
        with open(filepath, "rb") as f:
            self.data = f.read()

    async def setup(self, worker):
        response = await worker.upload_file(filename=self.filename, data=self.data, load=self.load)
        assert len(self.data) == response["nbytes"]


class PipInstall(WorkerPlugin):
    """pip install `packages` (requirement lines, with $VARIABLES as pip expands them) in every
    worker's Python, one worker of a host at a time. With `restart_workers`, each worker running
    when it is registered is restarted through its nanny afterwards, so that it imports the new
    versions (a worker that joins later installs before it imports anything of them)."""

    idempotent = True

    def __init__(self, packages: list[str], pip_options: list[str] | None = None, restart_workers: bool = False):
        if isinstance(packages, str):
            raise TypeError(f"PipInstall(packages=...) takes a list of requirements, not the string {packages!r}: "
                            f"write [{packages!r}]")
        self.packages = list(packages)
        self.pip_options = list(pip_options or [])
        self.restart_workers = bool(restart_workers)
        self.name = f"pip-install-{_digest(self.packages, self.pip_options)}"

    def setup(self, worker):
        logger.info("pip installing %s", self.packages)
        # A requirements file, as distributed does: pip expands ${VARIABLES} in it (tokens for
        # private indexes), never on a command line where they would show in `ps`.
        with tempfile.NamedTemporaryFile("w", suffix=".txt") as requirements, _host_lock("pip-install"):
            requirements.write("\n".join(self.packages))
            requirements.flush()
            done = subprocess.run([sys.executable, "-m", "pip", "install", *self.pip_options, "-r", requirements.name],
                                  capture_output=True, text=True)
        if done.returncode != 0:
            raise RuntimeError(f"pip install failed with '{done.stderr.strip()[-2000:]}'")


class UploadDirectory(WorkerPlugin):
    """Copy a local directory (zipped here, at once) into every worker's local_directory;
    `update_path` puts the copy on the workers' sys.path. Files under a part named in
    `skip_words` and those any `skip` predicate accepts are left out, as in distributed.
    mode: "workers" (or "all": our scheduler takes no files). `restart_workers` restarts the
    workers running at registration through their nannies after the copy."""

    def __init__(self, path, restart_workers: bool = False, update_path: bool = False,
                 skip_words=(".git", ".github", ".pytest_cache", "tests", "docs"),
                 skip=(lambda fn: os.path.splitext(fn)[1] == ".pyc",), mode: str = "workers",
                 restart: bool | None = None):
        if restart is not None:
            warnings.warn("UploadDirectory(restart=) is now restart_workers=", FutureWarning, stacklevel=2)
            restart_workers = restart
        if mode not in ("workers", "all", "scheduler"):
            raise ValueError(f"UploadDirectory(mode={mode!r}): use 'workers' (or 'all')")
        if mode == "scheduler":
            raise ValueError("UploadDirectory(mode='scheduler'): hpc-cluster's scheduler runs no user code and "
                             "takes no files; upload to the workers (mode='workers')")
        path = os.path.expanduser(path)
        if not os.path.isdir(path):
            raise FileNotFoundError(f"UploadDirectory: {path!r} is not a directory here; give the path of a "
                                    "local directory to copy to the workers")
        self.path = os.path.basename(os.path.normpath(path))
        self.restart_workers = bool(restart_workers)
        self.update_path = update_path
        self.mode = mode
        self.name = "upload-directory-" + self.path
        self.data = _zip_directory(path, skip_words, skip)

    def setup(self, worker):
        with zipfile.ZipFile(io.BytesIO(self.data)) as z:
            z.extractall(worker.local_directory)
        if self.update_path:
            copy = os.path.join(worker.local_directory, self.path)
            if copy not in sys.path:
                sys.path.insert(0, copy)


class Environ(WorkerPlugin):
    """Set environment variables in every worker's process, before its next task (and, in a
    worker that joins later, before its first); removing the plugin puts back what was there.
    Variables read only when a process starts (MALLOC_*, PYTHONHASHSEED, a library's once it is
    imported) belong in the job's environment instead: the cluster's `env` setting."""

    def __init__(self, environ: dict | None = None):
        self.environ = {str(k): str(v) for k, v in (environ or {}).items()}
        self.name = f"environ-{_digest(sorted(self.environ.items()))}"
        self._before: dict[str, str | None] = {}

    def setup(self, worker):
        self._before = {k: os.environ.get(k) for k in self.environ}
        os.environ.update(self.environ)

    def teardown(self, worker):
        for k, v in self._before.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


class SetupCallback(WorkerPlugin):
    """client.register_worker_callbacks(setup): `setup()` (or `setup(dask_worker=worker)`) on
    every worker, now and on those that join later."""

    def __init__(self, setup):
        self.setup_fn = setup
        self.name = f"{getattr(setup, '__name__', type(setup).__name__)}-{uuid.uuid4()}"     # each call: one more

    def setup(self, worker):
        try:
            wants_worker = "dask_worker" in inspect.signature(self.setup_fn).parameters
        except (TypeError, ValueError):
            wants_worker = False
        return self.setup_fn(dask_worker=worker) if wants_worker else self.setup_fn()


def _digest(*parts) -> str:
    """A short name for a plugin made from what it does: registering the same again replaces it."""
    import hashlib
    return hashlib.sha1(repr(parts).encode()).hexdigest()[:10]


def _zip_directory(path: str, skip_words, skip) -> bytes:
    """The directory as a zip whose names start with its own basename (as distributed's)."""
    buf = io.BytesIO()
    parent = os.path.join(path, "..")
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as z:
        for root, _, files in os.walk(path):
            for file in files:
                filename = os.path.join(root, file)
                if any(predicate(filename) for predicate in skip) or any(w in filename.split(os.sep) for w in skip_words):
                    continue
                z.write(filename, os.path.relpath(filename, parent))
    return buf.getvalue()


@contextlib.contextmanager
def _host_lock(what: str):
    """One process of this host at a time (distributed uses a cluster-wide semaphore named after
    the host): two workers of a node running pip into one environment at once break it."""
    import fcntl
    path = os.path.join(tempfile.gettempdir(), f"hpc-cluster-{what}-{os.getuid()}.lock")
    with open(path, "a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)
