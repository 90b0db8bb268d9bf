"""The dashboard's page names its cluster (issue 34 papercut: with several clusters' dashboards
open in a browser, nothing told them apart); a name is HTML-escaped."""

from types import SimpleNamespace

from hpc_cluster.dashboard.server import Dashboard


def page(name):
    return Dashboard(SimpleNamespace(), b"s" * 32, name=name).page().decode()


def test_the_page_names_its_cluster_in_the_title_and_header():
    text = page("mysite-a1b2c3")
    assert "<title>mysite-a1b2c3 - hpc-cluster</title>" in text
    assert '<h1>hpc-cluster <span class="cluster-name">mysite-a1b2c3</span></h1>' in text


def test_a_name_is_escaped_and_no_name_leaves_the_page_as_it_is():
    assert "&lt;b&gt;" in page("<b>") and "<b>" not in page("<b>").split("<body")[0]
    assert "<title>hpc-cluster dashboard</title>" in page(None)
