"""dask-jobqueue 0.9.0's own tests, fetched from the package registry and pointed at our classes.

Nothing of theirs is kept in this repository: the sdist is downloaded with pip at test time
into a cache outside git (~/.cache/hpc-cluster-tests, or $XDG_CACHE_HOME), checked against
its published sha256 and its PKG-INFO version, and only these files of
dask_jobqueue/tests/ are extracted into a temporary package `dask_jobqueue_tests`:
__init__.py, test_slurm.py, test_pbs.py, test_sge.py, test_lsf.py, test_htcondor.py,
test_jobqueue_core.py and test_job.py (not test_oar.py: no OAR adapter; not test_runner.py:
no runner).

The rewrites (import statements only; every other line is theirs, unchanged):

1. `from dask_jobqueue import X` / `from dask_jobqueue.core import X`: SLURMCluster,
   PBSCluster, SGECluster, LSFCluster and HTCondorCluster come `from hpc_cluster`,
   JobQueueCluster `from hpc_cluster.deploy.cluster`, and the module `lsf` (test_lsf.py
   computes its expected `#BSUB -M` with `lsf.lsf_format_bytes_ceil`) is our LSF adapter's,
   which keeps that function under dask-jobqueue's name.
2. Every other name from `dask_jobqueue` or a submodule (MoabCluster, OARCluster,
   dask_jobqueue.local.LocalCluster, Job, PBSJob, SGEJob, SLURMRunner ...) becomes `X = placeholder("dask_jobqueue.<module>.X")`
   (djq_placeholders.py): using it skips the test, saying why.
3. `Client` imported from `distributed` or `dask.distributed` comes `from hpc_cluster`;
   every other name from distributed (Security, Scheduler, Status, utils_test ...) stays
   distributed's.
4. `from dask_jobqueue.tests import QUEUE_WAIT` becomes `from . import QUEUE_WAIT` (their
   own constant, from the extracted package).

A rewritten statement keeps the line count of the one it replaces (several statements are
joined with `;` and padded with blank lines), so a traceback's line numbers are the
upstream file's. Any import of dask_jobqueue left after the rewrite is an error: we never
run their classes by accident (dask-jobqueue is installed in the venv for the benchmarks).
"""

from __future__ import annotations

import ast
from pathlib import Path

from helpers.peers import TableIds, sdist_files

VERSION = "0.9.0"
SDIST = f"dask_jobqueue-{VERSION}.tar.gz"
# The sha256 PyPI publishes for that file; pip checks it on download (--require-hashes)
# and we check it again on every use of the cached copy.
SHA256 = "494ef64b7bb3848c7d72ed334c288030caca6a09dca54cfaa3f395f4ba7f5c47"
TEST_FILES = ("__init__.py", "test_slurm.py", "test_pbs.py", "test_sge.py", "test_lsf.py", "test_htcondor.py",
              "test_jobqueue_core.py", "test_job.py")
PACKAGE = "dask_jobqueue_tests"
# `dask_jobqueue_tests/test_slurm.py::test_header` is `test_slurm.py::test_header` in the table.
IDS = TableIds(PACKAGE)

OURS = {"SLURMCluster": "hpc_cluster", "PBSCluster": "hpc_cluster", "SGECluster": "hpc_cluster",
        "LSFCluster": "hpc_cluster", "HTCondorCluster": "hpc_cluster",
        "JobQueueCluster": "hpc_cluster.deploy.cluster", "lsf": "hpc_cluster.adapters"}
OUR_CLIENT = "hpc_cluster"


def extract_package(dest: Path) -> Path:
    """The rewritten test package under `dest`; returns its directory."""
    package = dest / PACKAGE
    package.mkdir(parents=True)
    with sdist_files("dask-jobqueue", VERSION, SDIST, SHA256) as read:
        for name in TEST_FILES:
            # Read one member by name: nothing else of the archive is written.
            source = read(f"dask_jobqueue/tests/{name}")
            (package / name).write_text(rewrite_imports(source, name))
    return package


# -- the import rewrite -------------------------------------------------------------------
def _from(module: str, names: list[ast.alias]) -> str:
    return f"from {module} import " + ", ".join(a.name + (f" as {a.asname}" if a.asname else "")
                                                 for a in names)


def _statements(node: ast.ImportFrom) -> list[str] | None:
    """What replaces one `from M import ...`, or None to keep it as it is."""
    module = node.module or ""
    if node.level or not (module == "dask_jobqueue" or module.startswith("dask_jobqueue.")
                          or module in ("distributed", "dask.distributed")):
        return None
    if module == "dask_jobqueue.tests":
        return [_from(".", node.names)]
    if module in ("distributed", "dask.distributed"):
        if not any(a.name == "Client" for a in node.names):
            return None
        rest = [a for a in node.names if a.name != "Client"]
        client = [a for a in node.names if a.name == "Client"]
        return ([_from(module, rest)] if rest else []) + [_from(OUR_CLIENT, client)]
    ours: dict[str, list[ast.alias]] = {}
    stand_ins = []
    for alias in node.names:
        if alias.name == "*":
            raise ValueError(f"line {node.lineno}: `from {module} import *` cannot be rewritten name by name")
        if module in ("dask_jobqueue", "dask_jobqueue.core") and alias.name in OURS:
            ours.setdefault(OURS[alias.name], []).append(alias)
        else:
            stand_ins.append(f"{alias.asname or alias.name} = placeholder({module + '.' + alias.name!r})")
    return ([_from(m, aliases) for m, aliases in ours.items()]
            + (["from djq_placeholders import placeholder", *stand_ins] if stand_ins else []))


def rewrite_imports(source: str, filename: str = "<test>") -> str:
    tree = ast.parse(source, filename)
    lines = source.splitlines(keepends=True)
    edits = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import) and any(a.name.split(".")[0] == "dask_jobqueue" for a in node.names):
            raise ValueError(f"{filename}:{node.lineno}: `import dask_jobqueue...` is not a rewrite we do")
        if isinstance(node, ast.ImportFrom) and (new := _statements(node)) is not None:
            first, last = lines[node.lineno - 1], lines[node.end_lineno - 1]
            if first[:node.col_offset].strip() or last[node.end_col_offset:].strip():
                raise ValueError(f"{filename}:{node.lineno}: the import shares its lines with other code")
            indent = first[:node.col_offset]
            span = node.end_lineno - node.lineno + 1
            edits.append((node.lineno - 1, span, [indent + "; ".join(new) + "\n"] + ["\n"] * (span - 1)))
    for start, span, replacement in sorted(edits, reverse=True):
        lines[start:start + span] = replacement
    result = "".join(lines)
    _check(ast.parse(result, filename), filename)
    return result


def _check(tree: ast.Module, filename: str) -> None:
    """No dask_jobqueue import and no distributed Client survive the rewrite."""
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and not node.level:
            module = node.module or ""
            if module.split(".")[0] == "dask_jobqueue":
                raise ValueError(f"{filename}:{node.lineno}: still imports from {module}")
            if module in ("distributed", "dask.distributed") and any(a.name == "Client" for a in node.names):
                raise ValueError(f"{filename}:{node.lineno}: still imports distributed's Client")
