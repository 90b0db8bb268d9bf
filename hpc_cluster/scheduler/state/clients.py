"""What clients ask of the state machine: new graphs, releases, cancels, scattered data,
clearing, who holds what. Mixed into SchedulerState (state.py), pure like it.
"""

from __future__ import annotations

from ...protocol.messages import ErrorKind, Op
from .records import add_edge, own, priority_of, TaskState, with_item, without_item

# Plain str copies of the ops sent per task: a literal's cost, not an Enum lookup's (protocol/messages.py).
KEY_IN_MEMORY, TASK_ERRED = Op.KEY_IN_MEMORY.value, Op.TASK_ERRED.value


class ClientsMixin:
    def add_client(self, cid: str) -> None:
        self.clients.add(cid)

    def remove_client(self, cid: str) -> None:
        self.clients.discard(cid)
        self.client_releases(cid, [k for k, ts in self.tasks.items() if cid in ts.who_wants])
        self.outbox.pop(cid, None)

    def update_graph(self, cid: str, tasks: list[dict], wanted: list[str]) -> None:
        """New tasks from a client. Each: key, func, args, deps, priority, retries, resources,
        and optionally duration (seconds), memory (bytes), pool (a name) and workers (names,
        with allow_other_workers: restrictions.py).
        A graph with a dependency cycle would wait for ever: it is refused whole."""
        cycle = self._cycle(tasks)
        if cycle:
            self.refuse_graph(cid, [*(t["key"] for t in tasks), *wanted],
                              f"the graph has a dependency cycle: {' -> '.join(map(repr, cycle))}; a task "
                              "cannot wait for its own result. Nothing of this submission was run: fix the "
                              "tasks' inputs and submit it again")
            return
        new: list[TaskState] = []
        for spec in tasks:
            key = spec["key"]
            ts = self.tasks.get(key)
            if ts is not None and ts.state != "released":
                continue                              # same key already known: share it
            if ts is None:
                ts = self.tasks[key] = TaskState(key)
            ts.func, ts.args = spec["func"], spec["args"]
            self._touch(ts)
            ts.priority = priority_of(int(spec.get("priority", 0)), next(self._seq))
            ts.retries = int(spec.get("retries", 0))
            ts.resources = spec.get("resources") or None
            ts.duration = float(spec["duration"]) if spec.get("duration") else None
            ts.where = self._where_of(spec["workers"], spec.get("allow_other_workers")) if "workers" in spec else None
            if not ts.escalated:                      # a move learned where it must go: kept
                ts.memory, ts.pool = int(spec.get("memory") or 0), spec.get("pool") or None
            new.append(ts)
        specs = {s["key"]: s for s in tasks}
        for ts in new:
            for dkey in specs[ts.key].get("deps", ()):
                dep = self.tasks.get(dkey)
                if dep is None:
                    ts.error = {"kind": ErrorKind.MISSING, "text": f"input {dkey!r} of {ts.key!r} was released "
                                "before the task was submitted; keep a future to it"}
                    continue
                own(ts, "dependencies").add(dep)
                add_edge(dep, "dependents", ts)
        self._claim_held(new)                         # results reattached workers kept (reattach.py)
        for key in wanted:
            ts = self.tasks.get(key)
            if ts is not None:
                self._want(cid, ts)
        for ts in new:
            if ts.error is not None:
                self._err(ts, ts.error)
        for ts in new:
            if ts.who_wants:
                self._activate(ts)                   # and, from lineage, the inputs it needs
        for ts in new:
            # Nobody holds a future to it and nothing wanted needs it (not even failed): a task
            # needed only by an unwanted one was computed for nobody.
            self._maybe_forget(ts)
        self._schedule()

    def _want(self, cid: str, ts: TaskState) -> None:
        """The client holds a future to `ts`: tell it at once if the result or the error is there."""
        ts.who_wants = with_item(ts.who_wants, cid)
        self._touch(ts)
        if ts.state == "memory":
            self._send(cid, {"op": KEY_IN_MEMORY, "key": ts.key, "nbytes": ts.nbytes})
        elif ts.state == "erred":
            self._send(cid, {"op": TASK_ERRED, "key": ts.key, "error": ts.error})

    def refuse_graph(self, cid: str, keys, reason: str) -> None:
        """Tell the client its submission is refused, touching nothing else: its futures to
        keys it already held from earlier submissions (shared, already running) stay as they are."""
        error = {"kind": ErrorKind.REFUSED, "text": reason}
        for key in dict.fromkeys(keys):
            ts = self.tasks.get(key)
            if ts is None or cid not in ts.who_wants:
                self._send(cid, {"op": TASK_ERRED, "key": key, "error": error})

    def _cycle(self, tasks: list[dict]) -> list[str] | None:
        """A dependency cycle the submission would make, as [a, b, ..., a], or None.

        Depth-first with a stack of our own (a deep graph must not recurse). Only tasks
        (re)defined here can close a cycle; existing ones are walked only when a released
        one is redefined (its old dependents could lead back to it)."""
        deps = {}
        for spec in tasks:
            ts = self.tasks.get(spec["key"])
            if ts is None or ts.state == "released":
                deps[spec["key"]] = spec.get("deps", ())
        walk_old = any(k in self.tasks for k in deps)

        def inputs(key):
            if key in deps:
                return deps[key]
            ts = self.tasks.get(key) if walk_old else None
            return sorted(d.key for d in ts.dependencies) if ts is not None else ()

        done: set = set()
        for start in deps:
            if start in done:
                continue
            path, on_path = [start], {start}
            stack = [iter(inputs(start))]
            while stack:
                key = next(stack[-1], None)
                if key is None:
                    stack.pop()
                    done.add(path[-1])
                    on_path.discard(path.pop())
                elif key in on_path:
                    return path[path.index(key):] + [key]
                elif key not in done:
                    path.append(key)
                    on_path.add(key)
                    stack.append(iter(inputs(key)))
        return None

    def client_releases(self, cid: str, keys) -> None:
        touched = []
        for key in keys:
            ts = self.tasks.get(key)
            if ts is not None and cid in ts.who_wants:
                ts.who_wants = without_item(ts.who_wants, cid)
                touched.append(ts)
                self._touch(ts)
        for ts in touched:
            self._maybe_release(ts)
        self._schedule()

    def cancel(self, keys, reason: str) -> None:
        """Cancel tasks (and what depends on them) for every client."""
        for key in keys:
            ts = self.tasks.get(key)
            if ts is None or ts.state in ("memory", "erred"):
                continue
            self._err(ts, {"kind": ErrorKind.CANCELLED, "text": reason})
        self._schedule()

    def scatter(self, cid: str, who_has: dict[str, list[str]], nbytes: dict[str, int]) -> None:
        for key, addrs in who_has.items():
            holders = [self.workers[a] for a in addrs if a in self.workers]
            ts = self.tasks.get(key) or self.tasks.setdefault(key, TaskState(key))
            ts.who_wants = with_item(ts.who_wants, cid)
            ts.nbytes = int(nbytes.get(key, 0))
            self._touch(ts)
            if not holders:
                if ts.state == "memory" and ts.who_has:
                    # The same key (the same data) is held already: this copy's loss loses nothing.
                    self._send(cid, {"op": KEY_IN_MEMORY, "key": key, "nbytes": ts.nbytes})
                    continue
                self._err(ts, {"kind": ErrorKind.LOST_DATA, "text": f"scattered data {key!r} reached no live worker"})
                continue
            if ts.state != "memory":                  # (the same data scattered again: still in memory)
                self._transition(ts, "memory", "scattered")
            ts.error = None
            for ws in holders:
                own(ts, "who_has").add(ws)
                ws.has_what.add(ts)
            self._send(cid, {"op": KEY_IN_MEMORY, "key": key, "nbytes": ts.nbytes})
        self._schedule()

    def clear(self, reason: str) -> list[str]:
        """Forget every task (client.restart()); tell clients their futures were cancelled.

        Returns the workers that still hold data, so the caller can have them drop it.
        """
        for ts in self.tasks.values():
            self._tell_clients(ts, {"op": TASK_ERRED, "key": ts.key,
                                    "error": {"kind": ErrorKind.CANCELLED, "text": reason}})
        holders = [ws.address for ws in self.workers.values() if ws.has_what or ws.processing]
        if self.touched is not None:
            self.touched.update(self.tasks)          # every one forgotten
        if self.debug:
            for ts in self.tasks.values():
                self._tell_story(ts.key, ts.state, "forgotten", "cleared")
        self.tasks.clear()
        self.copying.clear()
        self._ready.clear()
        self._roots.clear()
        self._unchecked.clear()
        for ws in self.workers.values():
            ws.abandoned |= {t.key for t in ws.executing}
            ws.processing.clear()
            ws.executing.clear()
            ws.has_what.clear()
            ws.used_resources.clear()
            ws.used_memory = ws.queued_us = 0
            self._update_free(ws)
        return holders

    def who_has(self, keys) -> dict[str, list[str]]:
        out = {}
        for key in keys:
            ts = self.tasks.get(key)
            out[key] = [ws.address for ws in ts.who_has] if ts is not None else []
        return out

