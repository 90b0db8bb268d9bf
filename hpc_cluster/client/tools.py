"""Client methods for looking after the cluster rather than computing on it:
why things died, restart, replicas, versions, logs, debugging a failed task locally.
Mixed into Client; they use its request plumbing (`_request`, `_lt`, `_worker_request`).
"""

from __future__ import annotations

import asyncio
import time
import warnings

from .exceptions import TimeoutError, format_death
from .futures import Future, flatten_futures, wait
from .timeouts import parse_timeout
from ..protocol import serialize
from ..protocol.clusterfile import dashboard_link
from ..protocol.messages import ErrorKind, Op
from ..protocol.versions import VersionMismatchWarning, format_grouped, get_versions, grouped_mismatches


class ClusterToolsMixin:
    @property
    def dashboard_link(self) -> str | None:
        """The dashboard's URL with its access token (docs/dashboard.md), as dask's
        client.dashboard_link; None when the cluster serves none. The scheduler tells its
        address as the client registers; the token is derived from the cluster secret."""
        if self.cluster is not None and hasattr(self.cluster, "dashboard_link"):
            return self.cluster.dashboard_link
        address = (getattr(self, "services", None) or {}).get("dashboard")
        if not isinstance(address, str) or not address.startswith("http"):
            return None
        return dashboard_link(address, self._secret)

    def deaths(self) -> list[dict]:
        """Every worker death the scheduler saw: cause, blame, explanation, evidence, log tail;
        in a cluster with pools, the dead worker's `pool`, and `escalation` when the death moved
        the task it was running to another pool ("attempt 2 on bigmem (64 GB) after ..."); and
        `memory`, the worker's memory over its life (docs/cli-json.md, "Death records")."""
        return self._lt.run(self._request({"op": Op.DEATHS}), self.timeout)

    def why(self, future: Future) -> str:
        """Explain a failed or retried future: every worker death while it ran, with evidence."""
        info = self._lt.run(self._request({"op": Op.WHY, "key": future.key}), self.timeout)
        if info is None:
            return f"{future.key!r} is not known to the scheduler (released, or never submitted)"
        err = info["error"] or {}
        lines = []
        if info["state"] == "erred" and err.get("kind") == ErrorKind.EXCEPTION:
            lines.append(f"{future.key!r} failed with an exception in the task: {err.get('text')} "
                         "(not a worker death; .result() raises it with the remote traceback)")
        elif info["state"] == "erred" and err.get("kind") == ErrorKind.DEPENDENCY:
            lines.append(f"{future.key!r} failed because its input {err.get('origin')!r} failed; "
                         f"see client.why() of that one")
        elif info["state"] == "erred":
            lines.append(f"{future.key!r} failed: {self.future_error(future.key)}")
            return "\n".join(lines)
        attempts = info["attempts"]
        if attempts:
            lines.append(f"{future.key!r} ({info['state']}) was running on {len(attempts)} worker(s) that died:")
            lines += [format_death(a, "     ") for a in attempts]
        elif not lines:
            lines.append(f"{future.key!r} ({info['state']}): no worker died while running it")
        moved = info.get("escalation")
        if moved and not any(a.get("escalation") == moved for a in attempts):
            lines.append(f"  escalation: {moved}")       # moved before it ran (too long for its pool)
        if info.get("pool"):
            lines.append(f"  it runs only in pool {info['pool']!r}")
        if info.get("workers"):                           # workers= (scheduler/state/restrictions.py)
            lines.append(f"  {info['workers']}")
        return "\n".join(lines)

    def replicate(self, futures, n: int | None = 2, timeout=None) -> None:
        """Keep `n` copies of these results on different workers (None: on every worker),
        restored when a holder dies. `timeout`: seconds, or a string ("30s")."""
        if n is not None and (isinstance(n, bool) or not isinstance(n, int) or n < 1):
            raise ValueError(f"replicate(n={n!r}): give how many copies to keep, 1 or more (replicate cannot delete "
                             "data: release the futures, or cancel them, for that)")
        timeout = parse_timeout(timeout, "replicate")
        flat: list[Future] = []
        flatten_futures(futures, flat)
        keys = [f.key for f in flat]
        wait(flat, timeout=timeout)
        workers = len(self.scheduler_info()["workers"])
        n = workers if n is None else n
        self._send({"op": Op.REPLICATE, "keys": keys, "n": n})
        want = min(n, workers)
        deadline = time.monotonic() + (timeout or self.timeout)
        while True:
            who_has = self._lt.run(self._request({"op": Op.WHO_HAS, "keys": keys}), self.timeout)
            if all(len(who_has.get(k) or []) >= want for k in keys):
                return
            if time.monotonic() > deadline:
                short = [k for k in keys if len(who_has.get(k) or []) < want]
                raise TimeoutError(f"{len(short)} keys have fewer than {want} copies after "
                                   f"{timeout or self.timeout} s, e.g. {short[0]!r}")
            time.sleep(0.02)

    def restart(self, timeout: float = 60.0) -> None:
        """Restart every worker through its nanny and forget all work.

        Outstanding futures are cancelled with a message saying so. Workers running
        without a nanny cannot be restarted; they drop their data and a warning names them.
        """
        reply = self._lt.run(self._request({"op": Op.RESTART, "timeout": timeout}, timeout + 10), timeout + 10)
        if reply.get("error"):
            raise ValueError(reply["error"])
        if reply["not_restarted"]:
            warnings.warn(f"{len(reply['not_restarted'])} workers run without a nanny and cannot be "
                          f"restarted (their data was dropped): {', '.join(reply['not_restarted'])}; "
                          "start them with a nanny (nanny=True) to make restart() complete",
                          RuntimeWarning, stacklevel=2)
        if reply["missing"]:
            raise TimeoutError(f"{len(reply['missing'])} workers did not come back within {timeout} s "
                               f"after restart: {', '.join(reply['missing'])}")

    def get_versions(self, check: bool = False) -> dict:
        """Package versions of this client, the scheduler and every worker.

        With check=True, raise RuntimeError (with a table) when any of them differ from
        this client's in a way that matters.
        """
        out = self._lt.run(self._request({"op": Op.VERSIONS}), self.timeout)
        out["client"] = get_versions()
        if check:
            rows = grouped_mismatches(out["client"], _peers(out["scheduler"], out["workers"]))
            if rows:
                raise RuntimeError("package versions differ across the cluster:\n" + format_grouped(rows))
        return out

    def _warn_on_other_versions(self, scheduler: dict | None, workers: dict, stacklevel: int) -> None:
        """Warn (once per worker) when the scheduler or workers run other versions than we do.

        The scheduler refuses mismatched peers when its `versions` setting is 'strict'; by
        default it only logs them, and this is where the user hears of it.
        """
        new = {a: v for a, v in workers.items() if a not in self._versions_seen}
        self._versions_seen.update(new)
        rows = grouped_mismatches(self._info["versions"], _peers(scheduler, new))
        if rows:
            warnings.warn("package versions differ between this client and the cluster; results may "
                          "not unpickle, or code may behave differently (set versions='strict' to "
                          "refuse such peers):\n" + format_grouped(rows),
                          VersionMismatchWarning, stacklevel=stacklevel + 1)

    def get_worker_logs(self, n: int = 200, include_dead: bool = True) -> dict[str, list[str]]:
        """Recent log lines of each worker; with include_dead, the last lines of dead ones too."""
        async def collect():
            rows = await self._request({"op": Op.WORKERS})
            # Another engine's workers (engine: distributed) speak its protocol, not ours: their
            # logs are its client's to fetch (distributed.Client.get_worker_logs()).
            workers = [w for w in rows if w.get("engine", "hpc-cluster") == "hpc-cluster"]
            replies = await asyncio.gather(*(self._worker_request(w["address"], {"op": Op.GET_LOGS, "n": n})
                                             for w in workers), return_exceptions=True)
            logs = {w["address"]: (r["lines"] if isinstance(r, dict) else [f"(unreachable: {r})"])
                    for w, r in zip(workers, replies)}
            for w in rows:
                if w not in workers:
                    logs[w["address"]] = [f"(a {w['engine']} worker: distributed's Client.get_worker_logs() has "
                                          "its lines)"]
            return logs
        logs = self._lt.run(collect(), self.timeout)
        if include_dead:
            for d in self.deaths():
                if d.get("log_tail"):
                    logs[f"{d['worker']} (died: {d['cause']})"] = d["log_tail"][-n:]
        return logs

    def recreate_task_locally(self, future):
        """Run a task here, with its real inputs fetched from the cluster, and return what it
        returns (distributed's): for a task that finished with a surprising result, under a
        debugger (`pdb.runcall(client.recreate_task_locally, future)`). `future`: a Future
        (waited for first) or a key."""
        if isinstance(future, Future):
            self.wait_keys([future.key], self.timeout)
            future = future.key
        spec = self._lt.run(self._request({"op": Op.TASK_SPEC, "key": future}), self.timeout)
        if spec is None:
            raise ValueError(f"the task {future!r} is not known to the scheduler (released, or never submitted): "
                             "keep a future to it while you debug it")
        deps = [Future(k, self) for k in spec["deps"]]
        values = dict(zip(spec["deps"], self.gather(deps))) if deps else {}
        func = serialize.loads(spec["func"].data)
        args, kwargs = serialize.loads_args(spec["args"].data, values.__getitem__)
        return func(*args, **kwargs)

    def recreate_error_locally(self, future):
        """Run the task behind a failure here, with its real inputs, so that its exception is
        raised in this process for `pdb.pm()` or a debugger to inspect (distributed's).
        `future`: a failed Future, or a collection of futures (a persisted one too) of which
        the first failed one is taken; when the failure came from an input's task, that task
        is the one run."""
        flat: list[Future] = []
        flatten_futures(future, flat)
        wait(flat)
        failed = [f for f in flat if f.status == "error"]
        if not failed:
            raise ValueError("No errored futures passed: recreate_error_locally runs the task of a failed future "
                             "(status 'error'); recreate_task_locally runs any task")
        key, err = failed[0].key, self.future_state(failed[0].key).error or {}
        while err.get("kind") == ErrorKind.DEPENDENCY:
            key, err = err.get("origin"), err.get("cause") or {}
        return self.recreate_task_locally(key)


def _peers(scheduler: dict | None, workers: dict) -> dict[str, dict]:
    """Labels -> versions of the peers that announced theirs."""
    out = {"scheduler": scheduler} if scheduler else {}
    out.update((f"worker {a}", v) for a, v in sorted(workers.items()) if v)
    return out
