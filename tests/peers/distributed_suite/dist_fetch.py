"""distributed's own tests, fetched from a package registry at test time.

distributed's sdists and wheels on PyPI carry no tests (its MANIFEST.in has
`recursive-exclude distributed **/tests/*`, since 2021), and this machine reaches no other copy
of its repository than the package registries (PyPI, Debian's, npm's). Debian's
python3-distributed package installs them (for its autopkgtest): the one of Debian 13
"trixie", distributed 2024.12.1, is downloaded from deb.debian.org, its sha256 checked, and
only the test files in FILES (and the data files they read) are extracted. Its tests are older
than the installed distributed (2026.8); the public API they exercise is the same one
(docs/migrating-from-distributed.md says which tests and why).

The files go into a package `distributed_upstream` (`distributed_upstream/tests/test_client.py`)
and their imports of distributed's public names are switched to ours (switch_imports()): the
`distributed_switched` package beside this file answers each name with hpc_cluster's, or a
placeholder that says we lack it. Imports of distributed's internals (its Scheduler, Worker,
core, utils) are left as they are: tests using them are out of scope or fail, listed.
"""

from __future__ import annotations

import ast
import hashlib
import re
import shutil
import subprocess
import tempfile
import urllib.request
from pathlib import Path

from helpers.peers import SuiteUnavailable, cache_dir

VERSION = "2024.12.1"
DEB = "python3-distributed_2024.12.1+ds-1_all.deb"
URL = f"http://deb.debian.org/debian/pool/main/d/dask.distributed/{DEB}"
SHA256 = "f57c55a88f012c7d52cc23af5af3f8431665fdb9882c341b28804140dc8be3a7"     # trixie's Packages index
INSIDE = "usr/lib/python3/dist-packages/distributed/tests"
PACKAGE = "distributed_upstream"

# The test files whose synchronous tests run (the async gen_cluster ones are out of scope: they
# drive distributed's Scheduler and Worker objects in-process).
FILES = (
    "test_client.py", "test_as_completed.py", "test_client_executor.py", "test_worker_client.py",
    "test_locks.py", "test_semaphore.py", "test_multi_locks.py", "test_variable.py", "test_queues.py",
    "test_events.py", "test_publish.py",
)
DATA = ("mytest.pyz", "testegg-1.0.0-py3.4.egg")      # upload_file's tests read them

# distributed's public modules: names imported from them are switched to ours.
PUBLIC = ("distributed", "dask.distributed", "distributed.client", "distributed.lock", "distributed.semaphore", "distributed.multi_lock",
          "distributed.variable", "distributed.queues", "distributed.event", "distributed.publish",
          "distributed.worker_client", "distributed.diagnostics.plugin", "distributed.worker",
          "distributed.cfexecutor", "distributed.diagnostics.progressbar")
_FROM = re.compile(r"^(\s*)from ((?:dask\.)?distributed(?:\.[\w.]+)?) import ", re.M)


def switch_imports(source: str) -> str:
    """Imports of distributed's public names -> distributed_switched; of its test helpers ->
    distributed_switched.utils_test (ours override its `cluster`); the rest unchanged. Then
    guarded(): these tests are older than the installed dask and distributed."""
    def switch(m: re.Match) -> str:
        indent, module = m.groups()
        if module in PUBLIC:
            return f"{indent}from distributed_switched import "
        if module == "distributed.utils_test":
            return f"{indent}from distributed_switched.utils_test import "
        return m.group(0)
    return guarded(_FROM.sub(switch, source))


def guarded(source: str) -> str:
    """Each name a module-level `from M import a, b` takes, imported on its own: a name the
    installed dask or distributed no longer has (dask.optimization.SubgraphCallable, gone since
    these tests were written) becomes a placeholder saying so, instead of failing the whole file
    at import. Only the tests that use it fail then, and the table says why."""
    tree = ast.parse(source)
    lines = source.splitlines(keepends=True)
    for node in reversed(tree.body):
        if not isinstance(node, ast.ImportFrom) or node.module == "__future__" or node.level:
            continue
        out = []
        for alias in node.names:
            bound = alias.asname or alias.name
            out.append(f"try:\n    from {node.module} import {alias.name} as {bound}\n"
                       f"except ImportError:\n    from distributed_switched import stand_in as _stand_in\n"
                       f"    {bound} = _stand_in({f'{node.module}.{alias.name}'!r})\n")
        lines[node.lineno - 1:node.end_lineno] = out
    return "".join(lines)


def deb_path() -> Path:
    """The .deb, from the cache or downloaded now; its sha256 checked each time."""
    path = cache_dir() / DEB
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=path.parent, prefix=".download-", delete=False) as tmp:
            try:
                with urllib.request.urlopen(URL, timeout=60) as response:
                    shutil.copyfileobj(response, tmp)
            except OSError as e:
                Path(tmp.name).unlink(missing_ok=True)
                raise SuiteUnavailable(f"could not download {URL} ({e}): these tests need Debian's "
                                       "package registry; CI has it") from None
        Path(tmp.name).replace(path)
    digest = hashlib.sha256(path.read_bytes()).hexdigest()
    if digest != SHA256:
        raise SuiteUnavailable(f"{path} has sha256 {digest}, not {SHA256} (Debian trixie's {DEB}); "
                               "delete it and the next run downloads it again")
    return path


def extract(into: Path) -> Path:
    """`into`/distributed_upstream/tests/ with FILES (rewritten) and DATA; returns the suite's root."""
    with tempfile.TemporaryDirectory() as tmp:
        proc = subprocess.run(["dpkg-deb", "-x", str(deb_path()), tmp], capture_output=True, text=True,
                              stdin=subprocess.DEVNULL, timeout=120)
        if proc.returncode != 0:
            raise SuiteUnavailable(f"dpkg-deb -x {DEB} failed: {proc.stderr.strip()}")
        source = Path(tmp) / INSIDE
        tests = into / PACKAGE / "tests"
        tests.mkdir(parents=True)
        (into / PACKAGE / "__init__.py").write_text("")
        (tests / "__init__.py").write_text("")
        for name in FILES:
            if not (source / name).exists():
                raise SuiteUnavailable(f"{DEB} has no tests/{name}: is FILES still right for it?")
            (tests / name).write_text(switch_imports((source / name).read_text()))
        for name in DATA:
            shutil.copy(source / name, tests / name)
    # Their markers are registered, not checked (--strict-markers is distributed's CI policy,
    # not the API's); warnings are not errors here for the same reason.
    (into / "pytest.ini").write_text("[pytest]\nmarkers =\n    slow: slow\n    ci1: ci1\n    flaky: flaky\n"
                                     "    leaking: leaking\n    skip_if_no_dask_expr: x\n")
    return into
