"""The scheduler's state machine, pure by folder: every module here takes events and returns
messages, with no I/O, no clock and no pickle (tests/unit/test_layering.py checks the folder).
machine.py is SchedulerState; the other modules are its parts, mixed in or called."""

from .machine import SchedulerState
from .records import TaskState, WorkerState

__all__ = ["SchedulerState", "TaskState", "WorkerState"]
