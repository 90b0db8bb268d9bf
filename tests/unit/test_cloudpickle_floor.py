"""The cloudpickle floor in pyproject.toml matches what protocol/serialize.py calls (issue 30,
point 6): cloudpickle.cloudpickle._code_reduce is there from 3.0 (2.2 had it in
cloudpickle_fast), checked on the wheels of 2.2.1, 3.0.0, 3.1.0-3.1.3."""

import pickle
import re
import subprocess
import sys
import types
from pathlib import Path

import cloudpickle

from hpc_cluster.protocol import serialize

ROOT = Path(__file__).resolve().parents[2]


def _version(text: str) -> tuple[int, ...]:
    return tuple(int(p) for p in re.findall(r"\d+", text)[:3])


def test_the_private_reducer_we_call_is_there_and_reduces_a_code_object():
    reduce = cloudpickle.cloudpickle._code_reduce          # fails here the day cloudpickle drops it
    rebuild, args = reduce(test_the_private_reducer_we_call_is_there_and_reduces_a_code_object.__code__)
    assert rebuild is types.CodeType and isinstance(args, tuple)


def test_a_function_by_value_keeps_its_real_file_name():
    def crashes_here(x):
        return x + 1

    back = pickle.loads(serialize._dumps(crashes_here))
    assert back(1) == 2 and back.__code__.co_filename == __file__


def test_the_floor_in_pyproject_is_the_one_serialize_names_and_is_installed():
    floor = re.search(r'"cloudpickle>=([\d.]+)"', (ROOT / "pyproject.toml").read_text()).group(1)
    assert floor == serialize.CLOUDPICKLE_FLOOR
    assert _version(cloudpickle.__version__) >= _version(floor)


def test_a_cloudpickle_without_it_is_refused_at_import_naming_the_version():
    code = ("import cloudpickle.cloudpickle as c; del c._code_reduce\n"
            "import hpc_cluster.protocol.serialize\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode != 0
    assert "ImportError: hpc-cluster needs cloudpickle>=3.0 (it uses cloudpickle.cloudpickle._code_reduce)" \
        in out.stderr, out.stderr
