"""Running a worker process: register (retrying while the scheduler is not up yet), end on
signals or when its owner goes, and turn the outcome into the process's exit code."""

from __future__ import annotations

import asyncio
import logging
import socket
import sys
import time
from typing import Callable

from ..protocol.comm import AuthenticationError, HandshakeClosed
from ..retry import Backoff
from .reattach import reconnect_window as reconnect_window_for
from .route import source_address
from .worker import EXIT_CANNOT_LISTEN, ListenError, Worker

logger = logging.getLogger("hpc_cluster.worker")


def run_worker(scheduler: str, secret: bytes, death_timeout: float = 60.0,
               on_registered: Callable[[], None] | None = None, owner_pid: int | None = None,
               reconnect_window: float | None = None, **kwargs) -> int:
    """Run a worker until the scheduler closes it or it is signalled. Returns an exit code.

    The scheduler may not be reachable yet (or for a moment); keep trying for
    `death_timeout` seconds before giving up with exit code 3. A worker that loses its
    scheduler later keeps its results and tries to reattach for `reconnect_window` (default:
    the larger of 10 minutes and death_timeout; worker/reattach.py), then exits with
    EXIT_LOST_SCHEDULER. `on_registered` is called
    once the scheduler has accepted the worker (the nanny learns it that way). It ends with
    `owner_pid` (its nanny, or LocalCluster's process), cleanly if it can.
    """
    import signal

    from ..lifeline import watch_owner
    running: list[Worker] = []

    def orphaned(reason: str) -> bool:
        if not running:
            return False                   # not registered yet: nothing to say goodbye to
        running[0].loop.call_soon_threadsafe(lambda: asyncio.ensure_future(running[0].close(reason)))
        return True

    watch_owner(owner_pid, orphaned, "worker")
    window = reconnect_window_for(death_timeout, reconnect_window)

    async def main() -> int:
        deadline = time.monotonic() + death_timeout
        # Jittered: workers that started together do not come back together.
        backoff = Backoff(0.1, 5.0, jitter=0.5)
        tried: dict[str, list] = {}            # address -> [attempts, why the last one failed]
        while True:
            worker = Worker(scheduler, secret, reconnect_window=window, **kwargs)
            try:
                await worker.start()
                break
            except (OSError, ConnectionError) as exc:
                # A refused proof will be refused again; a handshake closed unanswered may be
                # a scheduler taking hundreds of workers at once (protocol/admission.py).
                refused = isinstance(exc, AuthenticationError) and not isinstance(exc, HandshakeClosed)
                why = unreachable(exc)
                if why:
                    entry = tried.setdefault(scheduler, [0, why])
                    entry[0], entry[1] = entry[0] + 1, why
                if refused or time.monotonic() + backoff.peek() > deadline:
                    if why:                    # never reached: say where we looked and what to set
                        raise ConnectionError(cannot_reach(tried, death_timeout, socket.gethostname(),
                                                           source_address(scheduler))) from None
                    raise
                logger.warning("scheduler %s not reachable (%s); retrying", scheduler, why or exc)
                if getattr(worker, "listener", None) is not None:
                    worker.listener.stop()
                await asyncio.sleep(backoff.next())
        running.append(worker)
        if on_registered is not None:
            on_registered()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, lambda s=sig: asyncio.ensure_future(
                worker.close(f"received {signal.Signals(s).name}")))
        await worker.closed.wait()
        return worker.exit_code

    try:
        return asyncio.run(main())
    except ConnectionError as exc:
        print(f"hpc-cluster worker: {exc}", file=sys.stderr)
        return 3
    except ListenError as exc:
        print(f"hpc-cluster worker: {exc}", file=sys.stderr)
        return EXIT_CANNOT_LISTEN


def unreachable(exc: BaseException) -> str | None:
    """Why a connection to the scheduler could not be made, in a few words; None when it was
    made and something else failed (a handshake, a refused registration)."""
    if isinstance(exc, (AuthenticationError, HandshakeClosed)) or not str(exc).startswith("could not connect"):
        return None
    # protocol.comm.connect raises `from None`: the socket's own error is its context.
    real = exc.__context__
    real = getattr(real, "real_error", None) or real
    if isinstance(real, (asyncio.TimeoutError, TimeoutError)):
        return "no answer: timed out"
    if isinstance(real, ConnectionRefusedError):
        return "connection refused: nothing listens there"
    if isinstance(real, socket.gaierror):
        return "the name does not resolve on this node"
    if isinstance(real, OSError) and real.strerror:
        return real.strerror.lower()
    return str(exc).split(": ", 1)[-1]


def cannot_reach(tried: dict[str, list], death_timeout: float, here: str, source: str | None) -> str:
    """The one line a worker that never reached its scheduler ends with (after 'hpc-cluster
    worker: '): the diagnosis shows it as a startup death's fix (scheduler/diagnosis.py). Pure."""
    attempts = "; ".join(f"{address} ({n} {'try' if n == 1 else 'tries'}, last: {why})" if n else f"{address} ({why})"
                         for address, (n, why) in tried.items())
    route = f"routed from {source}" if source else "no route to it"
    return (f"cannot reach the scheduler from {here} ({route}) within death_timeout ({death_timeout:g} s): tried "
            f"{attempts} — the scheduler listens on the address that routes to the compute nodes (or on "
            "scheduler_options' host); if this node reaches the scheduler's host through another network, set "
            "interface= (`hpc-cluster up --interface NAME`) to that network's interface, and check that a "
            "firewall lets the compute nodes reach the scheduler's port")
