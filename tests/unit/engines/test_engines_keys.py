"""A dask key travels from distributed's worker to our nanny as one line of text
(dask_worker.key_text) and back to the key distributed's scheduler knows it by
(bridge.key_from_text): tuple keys, string keys, nested tuples and numbers come back equal and
of the same type, each in one line whatever it holds."""

from __future__ import annotations

import pytest

from hpc_cluster.engines.bridge import key_from_text, shown_key
from hpc_cluster.engines.dask_worker import key_text

KEYS = ["inc-4f0a3c", ("x", 0), ("rechunk-merge-abc", 2, 3), ("a", ("b", 1), (("c", 2.5),)), 7, 2.5,
        "[1, 2]", '{"op": 1}', "line\nbreak", "naïve-δ", ("", ()), "-leading-minus", "+leading-plus"]


@pytest.mark.parametrize("key", KEYS, ids=repr)
def test_a_key_comes_back_as_it_went(key):
    text = key_text(key)
    assert "\n" not in text and "\r" not in text               # one line on the nanny's pipe
    back = key_from_text(text)
    assert back == key and type(back) is type(key)
    assert hash(back) == hash(key)                               # a dict key in distributed's tasks


def test_nested_tuples_come_back_as_tuples_all_the_way_down():
    back = key_from_text(key_text(("a", ("b", ("c", 1)))))
    assert isinstance(back[1], tuple) and isinstance(back[1][1], tuple)


def test_a_line_that_is_not_json_is_taken_as_the_key_itself():
    assert key_from_text("not json (") == "not json ("


def test_death_records_show_keys_as_our_engine_does():
    assert shown_key("hog-1GB") == "hog-1GB"
    assert shown_key(("x", 0)) == "('x', 0)"
