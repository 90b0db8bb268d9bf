"""A task's traceback rebuilt from the text its worker sent (client/tracebacks.py)."""

import traceback

from hpc_cluster.client.tracebacks import rebuild_traceback, remote_frames

# As a worker's traceback.format_exc() reads for a task that failed while handling another
# error: the worker's own frame first, a chained exception before.
WORKER_TEXT = '''Traceback (most recent call last):
  File "/data/user/analysis.py", line 12, in parse
    return int(text)
           ^^^^^^^^^
ValueError: invalid literal for int() with base 10: 'x'

During handling of the above exception, another exception occurred:

Traceback (most recent call last):
  File "/opt/venv/lib/python3.11/site-packages/hpc_cluster/worker/worker.py", line 464, in _execute
    result = func(*args, **kwargs)
             ^^^^^^^^^^^^^^^^^^^^^
  File "/data/user/analysis.py", line 30, in load
    return [parse(t) for t in texts]
  File "/data/user/analysis.py", line 30, in <listcomp>
    return [parse(t) for t in texts]
  File "/data/user/analysis.py", line 15, in parse
    raise RuntimeError("bad record")
RuntimeError: bad record
'''


def test_the_frames_are_the_raised_exceptions_own_without_the_workers():
    assert remote_frames(WORKER_TEXT) == [
        ("/data/user/analysis.py", 30, "load"),
        ("/data/user/analysis.py", 30, "<listcomp>"),
        ("/data/user/analysis.py", 15, "parse"),
    ]
    assert remote_frames("RuntimeError: no traceback here") == []


def test_the_rebuilt_traceback_reads_as_the_remote_one():
    tb = rebuild_traceback(WORKER_TEXT)
    summary = traceback.extract_tb(tb)
    assert [(f.filename, f.lineno, f.name) for f in summary] == remote_frames(WORKER_TEXT)
    shown = "".join(traceback.format_exception(RuntimeError("bad record").with_traceback(tb)))
    assert 'File "/data/user/analysis.py", line 15, in parse' in shown
    assert rebuild_traceback(None) is None and rebuild_traceback("") is None


def test_a_local_copy_of_the_file_shows_its_line_with_no_carets_of_ours(tmp_path):
    # The stand-in frame's own columns must not put carets under the real line.
    source = tmp_path / "job.py"
    source.write_text("def run(x):\n    total = compute_something_long(x) + other_function_name(x, 1 / x)\n")
    tb = rebuild_traceback(f'Traceback (most recent call last):\n  File "{source}", line 2, in run\n'
                           "ZeroDivisionError: division by zero\n")
    shown = "".join(traceback.format_tb(tb))
    assert "total = compute_something_long(x)" in shown and "^" not in shown
    assert tb.tb_frame.f_code.co_name == "run" and tb.tb_lineno == 2 and tb.tb_next is None
