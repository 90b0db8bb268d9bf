"""worker/plugins.py's import_file: what upload_file makes importable on a worker."""

from __future__ import annotations

import sys
import uuid
import zipfile

from hpc_cluster.worker.plugins import import_file


def test_a_new_version_of_a_module_replaces_the_old_and_a_zip_imports_its_packages(tmp_path, monkeypatch):
    monkeypatch.setattr(sys, "path", list(sys.path))
    name = f"imported_{uuid.uuid4().hex[:8]}"
    path = tmp_path / f"{name}.py"
    path.write_text("V = 1\n")
    try:
        (first,) = import_file(str(path))
        assert first.V == 1
        path.write_text("V = 2\n")                 # same size, same second: only the reload tells
        assert import_file(str(path))[0].V == 2 and sys.modules[name].V == 2
        package = f"zipped_{uuid.uuid4().hex[:8]}"
        archive = tmp_path / "lib.zip"
        with zipfile.ZipFile(archive, "w") as z:
            z.writestr(f"{package}/__init__.py", "W = 'zip'\n")
        assert [m.W for m in import_file(str(archive))] == ["zip"]
        assert import_file(str(tmp_path / "data.csv")) == []
    finally:
        for n in [m for m in sys.modules if m.startswith(("imported_", "zipped_"))]:
            del sys.modules[n]
