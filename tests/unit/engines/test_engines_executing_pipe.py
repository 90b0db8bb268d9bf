"""The pipe on which distributed's worker names the tasks it executes to our nanny
(worker/nanny.py ExecutingPipe; engines/dask_worker.py ExecutingToNanny writes it): '+KEY' when a
task starts, '-KEY' when it stops, a line each. What the nanny holds at the worker's death is
what a verdict charges, so: lines split across reads, lines it had not read yet when the worker
ended (finish() reads them), a writer that outpaces the reader, and a real distributed Worker's
own transitions."""

from __future__ import annotations

import asyncio
import os
import sys
import time

import pytest
from distributed import Client, Event, Scheduler, Worker

from helpers.aio import run
from helpers.wait import wait_until_async

from hpc_cluster.engines.bridge import key_from_text
from hpc_cluster.engines.dask_worker import ExecutingToNanny, key_text
from hpc_cluster.worker.nanny import ExecutingPipe


def open_pipe(executing: dict) -> tuple[ExecutingPipe, int]:
    """The nanny's pipe, and the worker's end of it (the nanny hands that to its child, then
    closes its own copy: started())."""
    pipe = ExecutingPipe(executing)
    writer = os.dup(pipe.write_end)
    pipe.started()
    return pipe, writer


async def whole_and_partial_lines() -> None:
    executing = {'"left-from-the-last-worker"': 1.0}
    pipe, writer = open_pipe(executing)
    assert executing == {}                        # a fresh worker starts with nothing executing
    t0 = time.time()
    os.write(writer, b'+"a"\n+["b",1]\n-"a"\n+"c')           # "c" not named yet: half a line
    await wait_until_async(lambda: '["b",1]' in executing, 10, "the first lines to be read")
    assert set(executing) == {'["b",1]'}
    os.write(writer, b'"\n-"never-started"\n')               # its end, and a stop of an unknown key
    await wait_until_async(lambda: '"c"' in executing, 10, "the rest of the line to be read")
    assert set(executing) == {'["b",1]', '"c"'}
    assert all(t0 - 0.001 <= at <= time.time() for at in executing.values())   # when each started
    # The worker's last lines, then its end, before the loop read them: finish() reads them.
    os.write(writer, b'-["b",1]\n+"d"\n+"e')
    os.close(writer)
    left = pipe.finish()
    assert set(left) == {'"c"', '"d"'}            # "e" never got its newline: not named
    assert [key_from_text(k) for k in sorted(left)] == ["c", "d"]
    with pytest.raises(OSError):
        os.fstat(pipe.read_end)                   # the nanny's end is closed


def test_lines_split_across_reads_and_lines_left_unread_at_the_end():
    run(whole_and_partial_lines(), timeout=30)


WRITER = """
import os, sys
fd = int(sys.argv[1])
for i in range(20000):                       # ~400 KB: many times what the pipe buffers
    os.write(fd, b'+["t",%d]\\n' % i)
    if i % 1000:                             # every 1000th stays executing
        os.write(fd, b'-["t",%d]\\n' % i)
"""


async def a_fast_writer_never_blocks() -> None:
    executing: dict = {}
    pipe = ExecutingPipe(executing)
    proc = await asyncio.create_subprocess_exec(sys.executable, "-c", WRITER, str(pipe.write_end),
                                                pass_fds=(pipe.write_end,))
    pipe.started()
    assert await asyncio.wait_for(proc.wait(), 60) == 0       # it was read as it came
    left = pipe.finish()
    assert sorted(key_from_text(k) for k in left) == [("t", i) for i in range(0, 20000, 1000)]


def test_a_writer_faster_than_the_pipe_buffers_is_read_as_it_writes():
    run(a_fast_writer_never_blocks(), timeout=90)


def wait_for_gate(name: str) -> str:
    Event(name).wait(timeout=60)
    return "done"


async def a_real_workers_transitions() -> None:
    executing: dict = {}
    pipe, writer = open_pipe(executing)
    async with Scheduler(host="127.0.0.1", port=0, dashboard=False, dashboard_address="127.0.0.1:0") as ds, \
            Worker(ds.address, nthreads=2, host="127.0.0.1", plugins=[ExecutingToNanny(writer)]), \
            Client(ds.address, asynchronous=True) as client:
        gate = Event("gate", client=client)
        running = client.submit(wait_for_gate, "gate", key=("gate", 1))
        done = client.submit(len, "abc", key="quick-len")
        assert await done == 3
        await wait_until_async(lambda: executing, 20, "the gated task to be named executing")
        assert [key_from_text(k) for k in executing] == [("gate", 1)]    # not the finished one
        assert list(executing) == [key_text(("gate", 1))]
        await gate.set()
        assert await running == "done"
        await wait_until_async(lambda: not executing, 20, "the gated task to be named ended")
    os.close(writer)
    assert pipe.finish() == {}


def test_a_distributed_workers_executing_tasks_are_named_on_the_pipe():
    run(a_real_workers_transitions(), timeout=90)
