"""The one place a task's state changes: `SchedulerState._transition(ts, new, why)`.

Every state change goes through it, so that one place can check it and tell it. With
`debug` on (the scheduler's $HPC_CLUSTER_DEBUG_STATE, read by server.py, never here), a
change outside ALLOWED raises InvalidTransition, and each change is told in the task's story:
`story(key)` lists (old, new, why, time) oldest first, as dask.distributed's
`Scheduler.story(key)` does. The time is the state's `now`, the latest time an event brought
(no clock is read here). Without `debug` the hot path pays one flag test per change: a
1,000,000-task map makes five or six changes per task.

Mixed into SchedulerState (machine.py); pure like it.
"""

from __future__ import annotations

from collections import deque

# What a task may become from each state (machine.py's docstring says what each state means).
# A change not listed is a bug in the state machine: debug mode raises at once, at the change.
ALLOWED: dict[str, frozenset[str]] = {
    # submitted or needed again; its result taken from a worker that kept it (scatter,
    # reattach.py) or adopted with the thread that runs it; rebuilt from a journal (recovery.py)
    "released": frozenset({"waiting", "erred", "memory", "held", "processing"}),
    # its inputs are ready; promoted where it was held ahead (ahead.py); a thread that ran
    # it anyway finished it; failed; nobody needs it
    "waiting": frozenset({"queued", "processing", "memory", "erred", "released"}),
    # placed; an input was lost (waits for it again); an old thread finished it; failed; unneeded
    "queued": frozenset({"processing", "waiting", "memory", "erred", "released"}),
    # finished; given back, lost with its worker or unneeded; an input was lost; failed
    "processing": frozenset({"memory", "released", "waiting", "erred"}),
    # its last copy lost, or nobody needs it
    "memory": frozenset({"released"}),
    # its holder confirmed it; its holders are gone or nobody needs it; cancelled
    "held": frozenset({"memory", "released", "erred"}),
    # scattered data under the same key; run again (client.retry: retrying.py)
    "erred": frozenset({"memory", "released"}),
}

STORY_LENGTH = 50          # changes kept per key (the latest)
STORY_KEYS = 100_000       # keys with a story; the oldest story goes first past it


class InvalidTransition(AssertionError):
    """A task changed state in a way ALLOWED does not list (raised only in debug mode)."""


class TransitionsMixin:
    # Set by SchedulerState.__init__: debug (its argument) and _stories (key -> deque of changes).
    debug: bool
    _stories: dict[str, deque]

    def _transition(self, ts, new: str, why: str) -> None:
        """`ts` becomes `new` because of `why` (a short event name: "task-finished")."""
        if self.debug:
            self._checked(ts, new, why)
        ts.state = new

    def _checked(self, ts, new: str, why: str) -> None:
        old = ts.state
        if new not in ALLOWED.get(old, ()):
            raise InvalidTransition(f"task {ts.key!r}: {old} -> {new} ({why}) is not an allowed transition; "
                                    f"its story: {self.story(ts.key)}")
        self._tell_story(ts.key, old, new, why)

    def _tell_story(self, key: str, old: str, new: str, why: str) -> None:
        """Add a change to `key`'s story (debug mode; "forgotten" as `new`: it left the state)."""
        story = self._stories.get(key)
        if story is None:
            if len(self._stories) >= STORY_KEYS:
                del self._stories[next(iter(self._stories))]
            story = self._stories[key] = deque(maxlen=STORY_LENGTH)
        story.append((old, new, why, self.now))

    def story(self, key: str) -> list[tuple]:
        """Why `key` is where it is: its latest changes as (old, new, why, time), oldest first.
        Empty unless the state was made with debug=True."""
        return list(self._stories.get(key, ()))
