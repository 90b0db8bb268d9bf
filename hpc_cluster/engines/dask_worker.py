"""`python -m hpc_cluster.engines.dask_worker`: a dask.distributed Worker started by our nanny.

The job script runs `python -m hpc_cluster.worker ... --engine distributed`: our nanny (worker/
nanny.py) samples this process's memory, stops it over its budget, sees the kernel's OOM kills
and its exit signal, keeps its log tail, and reports how it ended to our scheduler, as for our
own workers. This process takes the same flags (worker/flags.py), reads the distributed
scheduler's address from the cluster file, and runs distributed's Worker with:

- the job's facts (job id, nanny id, pool, walltime, lifetime) as startup information, which
  the bridge (bridge.py) reads when the worker registers;
- a worker plugin naming each task it starts and ends on the nanny's pipe (--executing-fd), so a
  death charges only the tasks that were executing;
- a version check: a worker whose dask or distributed differs from the scheduler's, or that has
  no distributed, exits at start (EXIT_REFUSED: the nanny does not restart it) with both versions
  and its interpreter (as our engine refuses a mismatched worker), before it can run anything.
"""

from __future__ import annotations

import asyncio
import faulthandler
import json
import logging
import os
import signal
import socket
import sys

try:
    from distributed.diagnostics.plugin import WorkerPlugin
except ImportError:         # the job's environment lacks distributed: main() refuses, saying so
    WorkerPlugin = object

from ..lifeline import watch_owner
from ..protocol.clusterfile import read_cluster_file
from ..worker.__main__ import (build_parser, cpu_count, lifetime_info, registration_info, system_memory,
                               use_local_directory)
from ..worker.flags import memory_limit_bytes, parse_resources, threads_per_worker
from ..worker.route import listen_host, source_address
from ..worker.worker import EXIT_LIFETIME

logger = logging.getLogger("hpc_cluster.engines.dask_worker")

EXIT_REFUSED = 3            # the nanny does not restart it (worker/nanny.py: "cannot reach the scheduler")
# bridge.retire's stimulus ids say why we asked a worker to leave ("hpc-cluster-<intent>-<time>");
# the scheduler drains for a --lifetime with the intent "lifetime" (scheduler/server.py).
LIFETIME_RETIREMENT = "hpc-cluster-lifetime-"


def key_text(key) -> str:
    """A dask key as one line of JSON (tuples as lists); bridge.py's key_from_text reads it back."""
    return json.dumps(key, separators=(",", ":"), default=str)


class ExecutingToNanny(WorkerPlugin):
    """A distributed WorkerPlugin: '+KEY' when a task starts executing, '-KEY' when it stops."""

    name = "hpc-cluster-executing"

    def __init__(self, fd: int):
        self.fd = fd

    def transition(self, key, start, finish, **kwargs):
        # A task cancelled while executing (the worker closing on SIGTERM, the scheduler freeing
        # it) still runs in its thread until it returns: it ends when it leaves "cancelled".
        running, still = ("executing", "long-running"), ("executing", "long-running", "cancelled")
        if finish in running and start not in running:
            self._write(b"+", key)
        elif start in still and finish not in still:
            self._write(b"-", key)

    def _write(self, sign: bytes, key) -> None:
        try:
            os.write(self.fd, sign + key_text(key).encode() + b"\n")
        except OSError:              # the nanny is gone: nothing to tell
            pass


def note_retirement(worker) -> dict:
    """Keep the stimulus id of the retirement distributed announces to the worker (its status
    change to closing_gracefully): it tells the end of a --lifetime from other retirements."""
    seen: dict = {}
    handler = worker.stream_handlers["worker-status-change"]

    def status_change(status, stimulus_id, **kwargs):
        seen["stimulus_id"] = str(stimulus_id)
        return handler(status=status, stimulus_id=stimulus_id, **kwargs)
    worker.stream_handlers["worker-status-change"] = status_change
    return seen


def version_mismatch(expected: dict | None) -> str | None:
    """Why this worker may not join a scheduler running `expected` (package -> version), or None."""
    import dask
    try:
        import distributed
        installed = distributed.__version__
    except ImportError:
        installed = "not installed"
    here = {"distributed": installed, "dask": dask.__version__}
    wrong = [f"{name} {here[name]} here, {want} on the scheduler" for name, want in sorted((expected or {}).items())
             if name in here and want and want != here[name]]
    if not wrong:
        return None
    # The interpreter named: which environment to fix is what a user of several cannot tell.
    return ("this worker's packages differ from the scheduler's (" + "; ".join(wrong) + "): install the same "
            f"versions in the environment the jobs run ({sys.executable}: the cluster's python= setting, or "
            "job_script_prologue's activation) as where the cluster starts")


def apply_memory_fractions(args) -> None:
    """distributed's own memory policy from our flags: it spills and pauses; terminating is our
    nanny's (distributed's needs its own nanny)."""
    import dask
    dask.config.set({"distributed.worker.memory.target": args.memory_target_fraction,
                     "distributed.worker.memory.spill": args.memory_spill_fraction,
                     "distributed.worker.memory.pause": args.memory_pause_fraction,
                     "distributed.worker.memory.terminate": False})


async def run(args, address: str, info: dict, security, executing_fd: int | None, ready) -> int:
    from distributed import Worker
    cpus = cpu_count()
    nthreads = threads_per_worker(args.nthreads, 1, cpus)
    memory_limit, note = memory_limit_bytes(args.memory_limit, nthreads=nthreads, cpus=cpus,
                                            system_memory=system_memory())
    if note:
        logger.warning(note)
    plugins = [ExecutingToNanny(executing_fd)] if executing_fd is not None else []
    where = {"interface": args.interface} if args.interface else {"host": listen_host(args.host, address)}
    worker = Worker(address, nthreads=nthreads, name=args.name, memory_limit=memory_limit or None,
                    resources=parse_resources(args.resources or "") or None,
                    local_directory=args.local_directory, death_timeout=args.death_timeout,
                    startup_information={"hpc_cluster": lambda _worker: info}, plugins=plugins,
                    security=security, nanny=None, **where)
    retirement = note_retirement(worker)
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, lambda: asyncio.ensure_future(worker.close(reason="the nanny stopped it")))
    try:
        await worker
    except (asyncio.TimeoutError, OSError) as exc:
        # The same line as our worker's (worker/run.py), what `hpc-cluster why` shows as the fix.
        from ..worker.run import cannot_reach
        tried = {address: [None, str(exc) or type(exc).__name__]}     # distributed counts no tries
        said = cannot_reach(tried, args.death_timeout, socket.gethostname(), source_address(address))
        print(f"hpc-cluster worker: {said}", file=sys.stderr)
        return EXIT_REFUSED
    ready()
    await worker.finished()
    if args.nanny_id and retirement.get("stimulus_id", "").startswith(LIFETIME_RETIREMENT):
        return EXIT_LIFETIME     # the nanny starts a fresh worker (--lifetime-restart) or exits 0
    return 0


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=args.log_level.upper(), stream=sys.stderr,
                        format="%(asctime)s %(name)s %(levelname)s %(message)s")
    if not args.cluster_file:
        print("hpc-cluster worker: the distributed engine's workers read the cluster file (--cluster-file)",
              file=sys.stderr)
        return 2
    meta = read_cluster_file(args.cluster_file)
    address = meta.get("engine_address")
    if not address:
        print(f"hpc-cluster worker: {args.cluster_file} names no distributed scheduler: the cluster runs "
              "hpc-cluster's engine; start the job without --engine distributed", file=sys.stderr)
        return EXIT_REFUSED
    refusal = version_mismatch(meta.get("engine_versions"))
    if refusal:
        print(f"hpc-cluster worker: {refusal}", file=sys.stderr)
        return EXIT_REFUSED
    if args.local_directory:
        args.local_directory = use_local_directory(args.local_directory)
    faulthandler.enable(all_threads=False)
    apply_memory_fractions(args)
    from ..protocol.versions import get_versions
    # Our package versions as our workers report them, for `status` and the version table.
    info = {**registration_info(args, os.environ), **lifetime_info(args), "versions": get_versions()}
    security = None
    if meta.get("engine_tls"):
        from distributed import Security
        tls = meta["engine_tls"]
        security = Security(tls_ca_file=tls["ca_file"], tls_worker_cert=tls["cert"], tls_worker_key=tls["key"],
                            require_encryption=True)
    ready_fd = args.ready_fd

    def ready() -> None:
        if ready_fd is not None:
            try:
                os.write(ready_fd, b"1")
                os.close(ready_fd)
            except OSError:
                pass

    def orphaned(reason: str) -> bool:
        os._exit(1)

    watch_owner(args.owner_pid, orphaned, "worker")
    code = asyncio.run(run(args, address, info, security, args.executing_fd, ready))
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


if __name__ == "__main__":
    sys.exit(main())
