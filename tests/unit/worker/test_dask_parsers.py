"""worker/flags.py reads durations and sizes with dask's own parsers, not copies of them
(issue 30, point 6): what dask-worker makes of a value, ours does, dask's next release too."""

import dask.utils
import pytest

from hpc_cluster.worker.flags import memory_limit_bytes, parse_bytes, parse_duration


def test_the_values_go_through_dask_utils(monkeypatch):
    monkeypatch.setattr(dask.utils, "parse_bytes", lambda text: 1234)
    monkeypatch.setattr(dask.utils, "parse_timedelta", lambda text: 56)
    assert parse_bytes("whatever dask reads") == 1234
    assert parse_duration("whatever dask reads") == 56.0
    assert memory_limit_bytes("7 zorkbytes", nthreads=1, cpus=1, system_memory=10**6) == (1234, None)


@pytest.mark.parametrize("text", ["", " ", "-5", "abc", "inf", "nan", "1e999", "5 parsecs"])
def test_what_dask_cannot_read_or_reads_as_nonsense_is_refused_with_the_forms(text):
    with pytest.raises(ValueError, match="not an amount of memory; use bytes"):
        parse_bytes(text)                     # dask reads '' as 1 byte and '-5' as -5
    with pytest.raises(ValueError, match="not a duration; use seconds"):
        parse_duration(text)
