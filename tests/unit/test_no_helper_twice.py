"""No helper defined twice in the tests (issue 30, point 7): a module-level function or class of
one name lives in one module under tests/ (or examples/*/tests), and the others import it from
tests/helpers. A copy drifts: the poll-until-a-deadline loop existed seven times, with three
exception types and intervals from 0.02 to 0.5 s.

Names that are per-file by design are allowed below, each with its reason. Duplicates this rule
found but issue 30 has not removed yet are listed in NOT_YET: that list only shrinks (a name on
it that is no longer defined twice fails the test, so it cannot go stale)."""

from __future__ import annotations

import ast
from collections import defaultdict
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]

# Per-file by design. Keep this short: a name goes here only if every module needs its own.
ALLOWED = {
    # Each script run on its own (the simulators' commands, the fixture captures) has one.
    "main": "a script's entry point",
    # Fixtures are looked up by name: a module's own `cluster` or `client` replaces
    # tests/conftest.py's for its tests (a cluster of another shape), and tests ask for them by
    # these names. Each definition differs in what it builds.
    "cluster": "fixture: the module's own cluster, replacing conftest.py's",
    "client": "fixture: a client of the module's own cluster",
    "home": "fixture: each room isolates what its code reads from home (config dirs, LSF_ENVDIR)",
    "adapter": "fixture: the adapter of the batch system the module tests",
    "sim": "fixture: the simulator of the module's batch system on PATH",
    "worker": "fixture: a bare worker recording what the module's tests look at",
    "outcomes": "fixture: each SLURM module's own scenarios, staged once for the module's tests",
    "cleanup": "fixture: distributed's tests ask for it by name; the PBS simulator's and theirs differ",
    # A module's own attribute hook (PEP 562): what it answers is that module's.
    "__getattr__": "a module's attribute hook (PEP 562)",
}


def allowed(name: str) -> bool:
    # pytest collects test_* functions and Test* classes per module, and calls each plugin's or
    # conftest's pytest_* hooks: sharing these names is how pytest is used.
    return name.startswith(("test_", "Test", "pytest_")) or name in ALLOWED


# Duplicates still to remove (issue 30): remove a name from here when its copies are one. Empty
# now (the scenarios' Run and deployed are helpers/scenarios.py's, the peers' suites' sdist,
# known_failures, make_run and table ids helpers/peers.py's); kept so that a duplicate found
# later can be listed while it waits, and the test below keeps the list from going stale.
NOT_YET: set = set()


def scanned_modules() -> list[Path]:
    return sorted([*REPO.glob("tests/**/*.py"), *REPO.glob("examples/*/tests/**/*.py")])


def definitions(paths) -> dict[str, list[str]]:
    """Name -> the modules defining it at module level (functions and classes)."""
    found: dict[str, list[str]] = defaultdict(list)
    for path in paths:
        for node in ast.parse(Path(path).read_text(), str(path)).body:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                found[node.name].append(str(Path(path).relative_to(REPO) if Path(path).is_relative_to(REPO)
                                             else path))
    return found


def duplicates(paths) -> dict[str, list[str]]:
    return {name: where for name, where in definitions(paths).items() if len(where) > 1 and not allowed(name)}


def test_no_helper_is_defined_in_two_test_modules():
    found = {name: where for name, where in duplicates(scanned_modules()).items() if name not in NOT_YET}
    assert not found, ("defined in more than one test module; keep one in tests/helpers and import it "
                       f"(or, if per-file by design, add it to ALLOWED with the reason): {found}")


def test_the_list_of_duplicates_still_to_remove_only_shrinks():
    still = duplicates(scanned_modules())
    gone = sorted(name for name in NOT_YET if name not in still)
    assert not gone, f"no longer defined twice: remove from NOT_YET: {gone}"


def test_the_scan_finds_a_copy_and_lets_pytests_names_be(tmp_path):
    (tmp_path / "test_a.py").write_text("def wait_for(c):\n    pass\n\ndef test_x():\n    pass\n"
                                        "class TestK:\n    def helper(self):\n        pass\n")
    (tmp_path / "test_b.py").write_text("async def wait_for(c):\n    pass\n\ndef test_x():\n    pass\n"
                                        "class TestK:\n    pass\n\ndef pytest_configure(config):\n    pass\n")
    (tmp_path / "conftest.py").write_text("def pytest_configure(config):\n    pass\n\ndef cluster():\n    pass\n")
    (tmp_path / "test_c.py").write_text("def cluster():\n    pass\n\ndef helper():\n    pass\n")
    assert duplicates(sorted(tmp_path.glob("*.py"))) == {"wait_for": [str(tmp_path / "test_a.py"),
                                                                      str(tmp_path / "test_b.py")]}
