"""DESIGN.md's layering and principles, checked on every import statement (lazy ones included).

Every rule here is stated by FOLDER (a room of the house), never by a hand-kept list of modules,
so a new module is checked by where it is put:

- the layers: `protocol`, `runners` and the leaves at the package root (units, retry, memseries,
  lifeline, plugins) are the ground; `scheduler`, `worker` and `client` stand on `protocol`;
  `adapters` on `runners`; `config` on the leaves alone; `dashboard` on `scheduler`; `deploy`
  uses all of those; `cli` stands on top. Nothing below imports `deploy` or `cli`.
- the rooms inside a layer: `scheduler/state/` is the pure state machine (nothing in it does I/O
  or reads a clock, and it imports nothing of the scheduler's I/O side); in `deploy/`, the daemon's
  room (`daemon/`) and LocalCluster's (`local/`) import neither each other nor the user-side
  modules (cluster classes, launch, keeper).
- no two of our modules import each other, at import time or lazily inside a function.

Principles checked here as well: the scheduler never unpickles user data (nothing it imports
brings in a pickler or our serializer), and the state machine and the batch systems' parsers
are pure (nothing they import reads a clock or does I/O).
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import hpc_cluster

PACKAGE = Path(__file__).resolve().parents[2] / "hpc_cluster"

# The leaves at the package root: any layer may import them, they import no layer of ours.
LEAVES = {"units", "retry", "memseries", "lifeline", "plugins", "imports"}
# layer (a folder of hpc_cluster/) -> the layers it may import (besides itself and the leaves).
ALLOWED = {
    "protocol": set(),
    "runners": set(),
    "scheduler": {"protocol"},
    "worker": {"protocol"},
    "client": {"protocol"},
    "adapters": {"runners"},
    "config": set(),
    "dashboard": {"scheduler", "protocol"},
    "testing": {"adapters", "runners", "scheduler", "protocol", "config"},   # the kit checks an adapter's settings against config's
    "engines": {"scheduler", "worker", "client", "protocol", "adapters", "runners", "config"},
    "deploy": {"engines", "scheduler", "worker", "client", "protocol", "adapters", "runners", "config", "dashboard"},
    "cli": {"deploy", "engines", "scheduler", "client", "protocol", "adapters", "runners", "config"},
}
ALL_LAYERS = set(ALLOWED)
FORBIDDEN = {layer: ALL_LAYERS - allowed - {layer} for layer, allowed in ALLOWED.items()}
FORBIDDEN.update({leaf: set(ALL_LAYERS) for leaf in LEAVES})


def layer_of(module: str) -> str | None:
    """'hpc_cluster.scheduler.state.machine' -> 'scheduler'; a leaf is its own layer."""
    parts = module.split(".")
    if parts[0] != "hpc_cluster" or len(parts) < 2:
        return None
    return parts[1]


def module_of(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def path_of(module: str) -> Path | None:
    """Our module's file ('hpc_cluster.scheduler' -> its __init__.py); None if not ours."""
    base = PACKAGE.parent.joinpath(*module.split("."))
    for p in (base.with_suffix(".py"), base / "__init__.py"):
        if module.split(".")[0] == "hpc_cluster" and p.is_file():
            return p
    return None


def _runs_at_import(tree: ast.Module) -> list[ast.AST]:
    """The nodes that run when the module is imported: all but function bodies."""
    out, todo = [], list(tree.body)
    while todo:
        node = todo.pop()
        out.append(node)
        if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            todo.extend(ast.iter_child_nodes(node))
    return out


def imports_of(path: Path, module: str | None = None, at_import_only: bool = False) -> list[tuple[int, str]]:
    """(line, module name) for every import in the file, lazy ones too unless at_import_only.

    `from a import b` yields both `a` and `a.b` (b may be a module); `__import__("x")` and
    `importlib.import_module("x")` with a literal name count as imports of x.
    """
    module = module or module_of(path)
    is_package = path.name == "__init__.py"
    package = module.split(".") if is_package else module.split(".")[:-1]
    tree = ast.parse(path.read_text())
    out = []
    for node in (_runs_at_import(tree) if at_import_only else ast.walk(tree)):
        if isinstance(node, ast.Import):
            out.extend((node.lineno, alias.name) for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = package[:len(package) - node.level + 1] if node.level else []
            name = ".".join([*base, node.module] if node.module else base)
            if node.module is not None:
                out.append((node.lineno, name))
            out.extend((node.lineno, f"{name}.{alias.name}") for alias in node.names if alias.name != "*")
        elif (isinstance(node, ast.Call) and node.args and isinstance(node.args[0], ast.Constant)
              and isinstance(node.args[0].value, str)
              and ((isinstance(node.func, ast.Name) and node.func.id == "__import__")
                   or (isinstance(node.func, ast.Attribute) and node.func.attr == "import_module"))):
            out.append((node.lineno, node.args[0].value))
    return out


def imported_closure(path: Path, module: str | None = None) -> list[tuple[str, int, str]]:
    """(where, line, name) for every import of the file (lazy ones too) and, through each of
    our modules it imports, every import that runs when that module is loaded.

    The package root is followed too: Python runs hpc_cluster/__init__.py before any of our
    modules (its public names load lazily, so it imports none of them).
    """
    seen: set[Path] = {path}
    out = []
    todo = [(path, module or module_of(path), False)]
    while todo:
        p, mod, at_import_only = todo.pop()
        for line, name in imports_of(p, mod, at_import_only):
            out.append((mod, line, name))
            parts = name.split(".")
            for i in range(1, len(parts) + 1):         # hpc_cluster.a.b loads hpc_cluster, .a too
                dep = path_of(".".join(parts[:i]))
                if dep is not None and dep not in seen:
                    seen.add(dep)
                    todo.append((dep, module_of(dep), True))
    return out


def test_the_resolver_sees_relative_imports():
    found = dict((name, line) for line, name in imports_of(PACKAGE / "config" / "resolve.py"))
    assert "hpc_cluster.units" in found


def test_the_resolver_sees_names_imported_from_a_package_and_dynamic_imports(tmp_path):
    src = tmp_path / "m.py"
    src.write_text("from ..protocol import serialize\nfrom . import state\n"
                   "def f():\n    import time\n    return __import__('random')\n")
    names = [n for _, n in imports_of(src, "hpc_cluster.scheduler.m")]
    assert {"hpc_cluster.protocol.serialize", "hpc_cluster.scheduler.state", "time", "random"} <= set(names)
    assert [n for _, n in imports_of(src, "hpc_cluster.scheduler.m", at_import_only=True)
            if n in ("time", "random")] == []


# What `from hpc_cluster import X` brings in: the root re-exports client and deploy names
# (loaded on first use from the modules its _EXPORTS table names).
ROOT_LAYERS = {layer_of(f"hpc_cluster.{m}") for m in hpc_cluster._EXPORTS.values()} - {None}


def layers_imported(name: str) -> set[str]:
    layer = layer_of(name)
    if name == "hpc_cluster" or (layer is not None and path_of(name) is None
                                 and path_of(name.rsplit(".", 1)[0]) == PACKAGE / "__init__.py"):
        return ROOT_LAYERS                        # `from hpc_cluster import Client`
    return {layer} if layer else set()


def layer_violations(path: Path, module: str | None = None) -> list[str]:
    layer = layer_of(module or module_of(path))
    return [f"line {line}: {name}" for line, name in imports_of(path, module)
            if layers_imported(name) & FORBIDDEN[layer]]


SOURCES_ALL = sorted(PACKAGE.rglob("*.py"))
SOURCES = [p for p in SOURCES_ALL if layer_of(module_of(p)) in FORBIDDEN]


@pytest.mark.parametrize("path", SOURCES, ids=[str(p.relative_to(PACKAGE)) for p in SOURCES])
def test_no_import_crosses_the_layers(path):
    bad = layer_violations(path)
    assert not bad, (f"{path.relative_to(PACKAGE)} ({layer_of(module_of(path))}) imports across "
                     f"DESIGN.md's layers: {bad}")


def test_every_room_is_a_known_layer_or_leaf():
    # The rules are by folder: a module outside every folder the table knows would go unchecked.
    strays = sorted(str(p.relative_to(PACKAGE)) for p in SOURCES_ALL if module_of(p) != "hpc_cluster"
                    and layer_of(module_of(p)) not in FORBIDDEN)
    assert not strays, f"put these in a room (a folder of ALLOWED) or declare them leaves: {strays}"


def _ours(path: Path) -> list[tuple[int, str]]:
    return [(line, name) for line, name in imports_of(path) if name.startswith("hpc_cluster.")]


STATE = sorted((PACKAGE / "scheduler" / "state").rglob("*.py"))


@pytest.mark.parametrize("path", STATE, ids=[p.name for p in STATE])
def test_the_state_machine_imports_nothing_of_the_schedulers_io_side(path):
    # scheduler/state/ is called by the server; it never calls back into it. Of the rest of the
    # scheduler it may use only the diagnosis table (pure, tested below).
    bad = [f"line {line}: {name}" for line, name in _ours(path)
           if name.startswith("hpc_cluster.scheduler.") and not name.startswith("hpc_cluster.scheduler.state")
           and not name.startswith("hpc_cluster.scheduler.diagnosis")]
    assert not bad, f"scheduler/state/{path.name} reaches out of the state machine: {bad}"


DEPLOY_USER_SIDE = ("hpc_cluster.deploy.cluster", "hpc_cluster.deploy.batch_clusters",
                    "hpc_cluster.deploy.launch", "hpc_cluster.deploy.keeper")
DEPLOY_ROOMS = sorted((PACKAGE / "deploy" / "daemon").rglob("*.py")) + sorted((PACKAGE / "deploy" / "local").rglob("*.py"))


@pytest.mark.parametrize("path", DEPLOY_ROOMS, ids=[str(p.relative_to(PACKAGE)) for p in DEPLOY_ROOMS])
def test_deploys_rooms_stay_apart(path):
    # The daemon's room and LocalCluster's are each whole: neither imports the other, nor the
    # user side that starts them (the daemon runs where that side may not even be installed).
    room = module_of(path).split(".")[2]                    # "daemon" or "local"
    other = "local" if room == "daemon" else "daemon"
    bad = [f"line {line}: {name}" for line, name in _ours(path)
           if name.startswith(f"hpc_cluster.deploy.{other}")
           or any(name == m or name.startswith(m + ".") for m in DEPLOY_USER_SIDE)]
    assert not bad, f"{path.relative_to(PACKAGE)} crosses deploy's rooms: {bad}"


def test_importing_the_package_root_counts_as_importing_what_it_re_exports(tmp_path):
    assert {"client", "deploy"} <= ROOT_LAYERS
    src = tmp_path / "m.py"
    src.write_text("def f():\n    from .. import Client\n")
    assert layer_violations(src, "hpc_cluster.scheduler.m") == ["line 2: hpc_cluster.Client"]


# -- principle 2: the scheduler never unpickles user data ------------------------------------
PICKLERS = {"pickle", "_pickle", "cloudpickle", "dill", "shelve", "hpc_cluster.protocol.serialize"}


def _is_one_of(name: str, modules: set[str]) -> bool:
    return any(name == m or name.startswith(m + ".") for m in modules)


def pickling_imports(path: Path, module: str | None = None) -> list[str]:
    return [f"{where} line {line}: {name}" for where, line, name in imported_closure(path, module)
            if _is_one_of(name, PICKLERS)]


SCHEDULER = sorted((PACKAGE / "scheduler").rglob("*.py"))


@pytest.mark.parametrize("path", SCHEDULER, ids=[p.name for p in SCHEDULER])
def test_the_scheduler_imports_no_pickler(path):
    bad = pickling_imports(path)
    assert not bad, f"scheduler/{path.name} brings in a pickler (DESIGN.md principle 2): {bad}"


def test_the_pickler_check_catches_direct_lazy_and_indirect_imports(tmp_path):
    for text in ("import cloudpickle\n", "def f():\n    import pickle\n",
                 "from ..protocol import serialize\n", "from ..protocol.serialize import loads\n",
                 "from ..client import Client\n"):          # client/client.py imports serialize
        src = tmp_path / "m.py"
        src.write_text(text)
        assert pickling_imports(src, "hpc_cluster.scheduler.m"), text
    assert pickling_imports(PACKAGE / "worker" / "worker.py")  # the worker does unpickle


# -- principle 1 (and 4): pure state machine and parsers -----------------------------------
CLOCKS_AND_IO = {"time", "datetime", "socket", "asyncio", "tornado", "subprocess", "random"}
IO_BUILTINS = {"open", "input", "print"}


def parser_modules() -> list[str]:
    """The adapters' modules that define parse_* functions."""
    out = []
    for p in sorted((PACKAGE / "adapters").glob("*.py")):
        tree = ast.parse(p.read_text())
        if any(isinstance(n, ast.FunctionDef) and n.name.startswith("parse_") for n in tree.body):
            out.append(str(p.relative_to(PACKAGE)))
    return out


# Pure by folder: all of scheduler/state/. Besides it, the pure leaves the state machine and
# the clusters use, each pure by its own nature: the diagnosis table and the task stream (the
# scheduler's), the batch systems' parsers (found by their parse_* functions), the unit and
# memory-series leaves, and the dask-worker flag table (cluster classes check a user's
# worker_extra_args with it before any job is submitted).
PURE = ([str(p.relative_to(PACKAGE)) for p in STATE] + parser_modules()
        + ["scheduler/diagnosis.py", "scheduler/stream.py", "units.py", "memseries.py", "worker/flags.py",
           "deploy/daemon/policy.py"])


def impurities(path: Path, module: str | None = None) -> list[str]:
    found = [f"{where} line {line}: imports {name}" for where, line, name in imported_closure(path, module)
             if name.split(".")[0] in CLOCKS_AND_IO]
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in IO_BUILTINS:
            found.append(f"line {node.lineno}: calls {node.func.id}()")
    return found


def test_the_parsers_are_found():
    assert {"adapters/slurm_text.py", "adapters/pbs.py"} <= set(parser_modules())


@pytest.mark.parametrize("name", PURE)
def test_pure_modules_read_no_clock_and_do_no_io(name):
    bad = impurities(PACKAGE / name)
    assert not bad, f"{name} must be pure (DESIGN.md principles 1 and 4), but: {bad}"


def test_the_purity_check_catches_clocks_however_imported(tmp_path):
    for text in ("import time\n", "from datetime import datetime\n", "import tornado.ioloop\n",
                 "def f():\n    from random import random\n", "x = __import__('socket')\n",
                 "def f():\n    print('x')\n", "from .server import Scheduler\n"):    # server reads a clock
        src = tmp_path / "m.py"
        src.write_text(text)
        assert impurities(src, "hpc_cluster.scheduler.m"), text


def test_a_scheduler_process_loads_no_pickler_of_ours():
    # Principle 2 at run time: what `python -m hpc_cluster.scheduler` imports, in a fresh
    # interpreter. (The stdlib's pickle comes with logging.handlers, through tornado: not ours.)
    import subprocess
    import sys

    code = ("import sys, hpc_cluster.scheduler.__main__; "
            "print(sorted(m for m in sys.modules if m in ('cloudpickle', 'dill', 'hpc_cluster.client.client', "
            "'hpc_cluster.protocol.serialize') or m.startswith('hpc_cluster.deploy')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60)
    assert out.stdout.strip() == "[]", out.stdout


def test_a_local_clusters_scheduler_process_with_its_dashboard_loads_no_pickler_of_ours():
    # LocalCluster's scheduler process (deploy/local/scheduler.py) adds the dashboard: still no
    # pickler, no client, and of deploy only that entry module itself.
    import subprocess
    import sys

    code = ("import sys, hpc_cluster.deploy.local.scheduler; "
            "print(sorted(m for m in sys.modules if m in ('cloudpickle', 'dill', 'hpc_cluster.client.client', "
            "'hpc_cluster.protocol.serialize') or (m.startswith('hpc_cluster.deploy') and m not in "
            "('hpc_cluster.deploy', 'hpc_cluster.deploy.local', 'hpc_cluster.deploy.local.scheduler'))))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60)
    assert out.stdout.strip() == "[]", out.stdout


# -- no circles -----------------------------------------------------------------------------
def import_graph(lazy: bool) -> dict[str, set[str]]:
    """Our module -> our modules it imports (at import time, type-checking blocks included;
    with `lazy`, inside functions too). A package's own __init__ is not an edge of its
    modules: Python loads it first whatever they import."""
    graph: dict[str, set[str]] = {}
    for path in PACKAGE.rglob("*.py"):
        mod = module_of(path)
        edges = graph.setdefault(mod, set())
        for _, name in imports_of(path, mod, at_import_only=not lazy):
            target = name if path_of(name) is not None else name.rsplit(".", 1)[0]
            if path_of(target) is not None and target != mod and not mod.startswith(target + "."):
                edges.add(target)
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Every simple circle through the graph, each once (from its smallest module)."""
    found = []

    def walk(start, node, trail):
        for nxt in sorted(graph.get(node, ())):
            if nxt == start:
                found.append(trail + [start])
            elif nxt > start and nxt not in trail:
                walk(start, nxt, trail + [nxt])
    for start in sorted(graph):
        walk(start, start, [start])
    return found


@pytest.mark.parametrize("lazy", [False, True], ids=["at-import", "lazy-too"])
def test_no_module_imports_one_that_imports_it_back(lazy):
    # Lazy imports inside functions count too (issue 30): a circle hidden in a function is
    # still two rooms that need each other.
    circles = cycles(import_graph(lazy=lazy))
    assert not circles, "import circles (break them: DESIGN.md, one-way data flow): " + \
        "; ".join(" -> ".join(c) for c in circles)


def test_the_circle_check_sees_a_type_checking_import(tmp_path, monkeypatch):
    graph = import_graph(lazy=False)
    graph["hpc_cluster.client.futures"] = graph["hpc_cluster.client.futures"] | {"hpc_cluster.client.client"}
    assert ["hpc_cluster.client.client", "hpc_cluster.client.futures", "hpc_cluster.client.client"] in cycles(graph)
    src = tmp_path / "m.py"
    src.write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from .client import Client\n")
    assert "hpc_cluster.client" in [n for _, n in imports_of(src, "hpc_cluster.m", at_import_only=True)]


def test_test_file_names_are_unique_across_the_suite():
    # tests/ has no __init__.py files: pytest imports test modules by basename, and two of one
    # name in different folders stop the whole run at collection (CI collects them all).
    from collections import Counter
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    names = Counter(p.name for p in root.rglob("test_*.py"))
    assert not [n for n, c in names.items() if c > 1], sorted(n for n, c in names.items() if c > 1)


def test_the_plan_is_shared_by_both_sides_and_imports_neither():
    # deploy/plan.py (config -> Plan) is read by the daemon's room and made by the user side:
    # it must import neither, or the daemon would drag the user side in.
    path = PACKAGE / "deploy" / "plan.py"
    bad = [f"line {line}: {name}" for line, name in _ours(path)
           if name.startswith(("hpc_cluster.deploy.daemon", "hpc_cluster.deploy.local"))
           or any(name == m or name.startswith(m + ".") for m in DEPLOY_USER_SIDE)]
    assert not bad, f"deploy/plan.py imports a side of deploy: {bad}"


def test_the_room_checks_can_fail(tmp_path):
    # A module in a folder no rule knows is a stray; a state-machine module that reaches the
    # server, and a daemon module that imports LocalCluster's room, are refused.
    assert layer_of("hpc_cluster.newroom.thing") not in FORBIDDEN
    src = tmp_path / "m.py"
    src.write_text("def f():\n    from ..server import Scheduler\n")
    assert [n for _, n in imports_of(src, "hpc_cluster.scheduler.state.m")
            if n.startswith("hpc_cluster.scheduler.server")]
    src.write_text("from ..local.cluster import LocalCluster\n")
    assert "hpc_cluster.deploy.local.cluster" in [n for _, n in imports_of(src, "hpc_cluster.deploy.daemon.m")]


def test_the_circle_check_sees_a_lazy_import():
    graph = import_graph(lazy=True)
    graph["hpc_cluster.units"] = graph["hpc_cluster.units"] | {"hpc_cluster.protocol.frames"}
    assert ["hpc_cluster.protocol.frames", "hpc_cluster.units", "hpc_cluster.protocol.frames"] in cycles(graph)
