"""`python -m hpc_cluster.scheduler`: run a scheduler until signalled.

The secret comes from $HPC_CLUSTER_SECRET or --cluster-file; once listening, the address
is written to --address-file (and the cluster file, if given) so a launcher can wait for it.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import signal
import sys

from ..lifeline import watch_owner
from ..protocol.frames import Limits
from ..protocol.admission import raise_open_file_limit
from ..protocol.clusterfile import open_private, read_cluster_file, take_secret_from_env, write_cluster_file
from ..protocol.messages import Op
from ..protocol.tls import Security
from .journal import Journal, resume_from
from .server import Scheduler


def main(argv=None, prog: str = "python -m hpc_cluster.scheduler", add_arguments=None, beside=None) -> int:
    """Run a scheduler until signalled. A process that serves more beside it reuses this:
    `add_arguments(parser)` adds its flags; `beside(scheduler, args, secret)` runs once the
    scheduler listens, before the address is written (so what it starts is there when a
    launcher sees the address), and returns what to call at exit (or None). deploy/
    local_scheduler.py does so for the dashboard, which the scheduler package never imports."""
    raise_open_file_limit()          # a soft 1024 under a far higher hard limit is common
    p = argparse.ArgumentParser(prog=prog)
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=0)
    p.add_argument("--cluster-file", help="JSON file with the secret; the address is written into it")
    p.add_argument("--address-file", help="write the listening address here once up")
    p.add_argument("--allowed-failures", type=int, default=3)
    p.add_argument("--heartbeat-ttl", type=float, default=5.0)
    p.add_argument("--versions", choices=["warn", "strict"], default="warn",
                   help="what to do when a peer's package versions differ")
    p.add_argument("--max-message-bytes", type=int, default=64 * 2**30)
    p.add_argument("--max-frame-bytes", type=int, default=2**30)
    p.add_argument("--tls-ca-file", help="TLS: the CA of the cluster's certificates (with --tls-cert, --tls-key)")
    p.add_argument("--tls-cert")
    p.add_argument("--tls-key")
    p.add_argument("--reattach-grace", type=float, default=0.0,
                   help="seconds after start in which no task is placed, so that the workers of a restarted "
                        "scheduler report the results they kept before anything is computed again")
    p.add_argument("--claim-window", type=float, default=120.0,
                   help="seconds a reattached worker's result of a task this scheduler does not know is kept "
                        "for a client to resubmit or want it again")
    p.add_argument("--log-level", default="INFO")
    p.add_argument("--owner-pid", type=int, help="exit when this process (the one that started us) is gone")
    p.add_argument("--journal", help="keep a journal of the state here (journal.py); removed on a clean exit")
    p.add_argument("--resume", action="store_true", help="with --journal: start from the state it holds, if any")
    if add_arguments is not None:
        add_arguments(p)
    args = p.parse_args(argv)
    logging.basicConfig(level=args.log_level.upper(), stream=sys.stderr,
                        format="%(asctime)s %(name)s %(levelname)s %(message)s")
    extra = {}
    security = Security(args.tls_ca_file, args.tls_cert, args.tls_key) if args.tls_ca_file else None
    if args.cluster_file:
        extra = read_cluster_file(args.cluster_file)
        secret = extra.pop("secret")
        extra.pop("address", None)
        security = security or Security.from_dict(extra.get("tls"))
    else:
        secret = take_secret_from_env()
        if secret is None:
            p.error("give --cluster-file or set $HPC_CLUSTER_SECRET")

    async def run() -> None:
        journal = Journal(args.journal) if args.journal else None
        recovered = resume_from(args.journal) if args.journal and args.resume else None
        sched = Scheduler(secret, host=args.host, port=args.port, allowed_failures=args.allowed_failures,
                          heartbeat_ttl=args.heartbeat_ttl, versions=args.versions,
                          limits=Limits(max_frame_bytes=args.max_frame_bytes,
                                        max_message_bytes=args.max_message_bytes), security=security,
                          reattach_grace=args.reattach_grace, claim_window=args.claim_window,
                          journal=journal, recovered=recovered)
        address = await sched.start()
        stop_beside = beside(sched, args, secret) if beside is not None else None
        if args.cluster_file:
            write_cluster_file(args.cluster_file, address, secret, **dict(extra, scheduler_pid=os.getpid()))
        if args.address_file:
            tmp = args.address_file + ".tmp"
            with open_private(tmp, "w") as f:
                f.write(address)
            os.replace(tmp, args.address_file)
        loop = asyncio.get_running_loop()
        stop = asyncio.Event()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)

        async def shutdown(msg: dict) -> None:
            loop.call_soon(stop.set)                   # after the reply is on its way
        sched.handlers.setdefault(Op.SHUTDOWN, shutdown)   # Client.shutdown(): as SIGTERM does

        def orphaned(reason: str) -> bool:
            loop.call_soon_threadsafe(stop.set)        # close() tells the workers to leave
            return True

        watch_owner(args.owner_pid, orphaned, "scheduler")
        await stop.wait()
        if stop_beside is not None:
            stop_beside()
        await sched.close()
        if journal is not None:
            journal.remove()                       # a clean exit: nothing to resume

    asyncio.run(run())
    return 0


if __name__ == "__main__":
    sys.exit(main())
