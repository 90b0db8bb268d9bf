"""What the engines' unit tests share: an environment without dask.distributed."""

from __future__ import annotations

import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest


@pytest.fixture(scope="session")
def no_distributed_python(tmp_path_factory) -> Path:
    """The python of an environment with every package of this one but distributed: a venv of
    this interpreter whose site reads a view of this one's site-packages (symlinks) with
    distributed left out, so neither `import distributed` nor importlib.metadata (nor any finder
    a package adds to sys.meta_path) can find it. Made in a second or so."""
    base = tmp_path_factory.mktemp("no-distributed")
    venv, view = base / "venv", base / "site-packages"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    view.mkdir()
    for entry in Path(sysconfig.get_paths()["purelib"]).iterdir():
        if entry.name != "distributed" and not entry.name.startswith("distributed-"):
            (view / entry.name).symlink_to(entry)
    (site_packages,) = venv.glob("lib/python*/site-packages")
    # addsitedir, not a bare path: the view's own .pth files (our editable install's) run too.
    (site_packages / "view.pth").write_text(f"import site; site.addsitedir({str(view)!r})\n")
    return venv / "bin" / "python"
