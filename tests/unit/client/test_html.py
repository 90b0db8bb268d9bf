"""What a notebook shows (hpc_cluster/client/html.py): the HTML summaries of a Client, a
LocalCluster and a batch cluster, parsed back with html.parser; values escaped; and the cluster's
scale control (ipywidgets) calling scale."""

from __future__ import annotations

import os
import signal
import sys

import psutil
import pytest

from hpc_cluster import Client, LocalCluster, PBSCluster
from hpc_cluster.client.html import find_control, summary_html
from helpers.pages import ReportPage
from helpers.wait import wait_until

pytestmark = pytest.mark.timeout(180)

EVIL = '<script>alert("x")</script>'


class Page(ReportPage):
    """An HTML fragment as the tests read it: helpers/pages.py's tags and links, and its text."""

    def __init__(self, text: str):
        self.text: list[str] = []
        super().__init__(text)

    def handle_data(self, data):
        super().handle_data(data)
        self.text.append(data)

    @property
    def links(self) -> list[str]:
        return [value for tag, name, value in self.fetches if tag == "a" and name == "href"]

    def has(self, value) -> bool:
        return str(value) in self.text or f"{value}: " in self.text      # a value, or a label of the facts


WORKERS = [{"name": "w-0", "address": "tcp://10.0.0.1:4000", "nthreads": 4, "memory_limit": 2 << 30,
            "status": "running", "pool": "default"},
           {"name": EVIL, "address": "tcp://10.0.0.2:4000", "nthreads": 2, "memory_limit": 1 << 30,
            "status": "paused", "pool": "bigmem"}]
JOBS = [{"job_id": "101.pbs", "state": "running", "node": "n1", "worker_names": ["w-0"], "pool": "default"},
        {"job_id": "102.pbs", "state": "pending", "node": None, "workers": [], "pool": "default",
         "reason": EVIL}]
DEATHS = [{"time": 1_700_000_000, "name": "w-9", "job_id": "99.pbs", "cause": "memory-batch", "blame": True,
           "text": f"the job went over its memory {EVIL}", "advice": "ask for more memory"}]


def test_the_summary_shows_every_fact_and_escapes_what_it_shows():
    text = summary_html("PBSCluster: " + EVIL, {"Scheduler": "tcp://10.0.0.9:8786", "Job name": EVIL},
                        WORKERS, JOBS, DEATHS)
    page = Page(text)
    assert "script" not in page.tags                      # nothing of the values became a tag
    for value in ("tcp://10.0.0.9:8786", "2", "6", "3.00 GiB", "w-0", "tcp://10.0.0.2:4000", "101.pbs", "pending",
                  "memory-batch", "99.pbs", "PBSCluster: " + EVIL):
        assert page.has(value), value
    assert page.text.count(EVIL) == 3                     # job name, worker name, job's reason
    assert any("Jobs (2: 1 pending, 1 running)" in t for t in page.text)
    assert any(f"the job went over its memory {EVIL} fix: ask for more memory" in t for t in page.text)
    assert "&lt;script&gt;" in text and EVIL not in text


def test_a_dashboard_address_that_is_no_web_address_is_shown_not_linked():
    page = Page(summary_html("x", {"Dashboard": None}))
    assert page.links == []
    from hpc_cluster.client.html import Markup, _link
    page = Page(summary_html("x", {"Dashboard": Markup(_link('javascript:alert(1)"'))}))
    assert page.links == [] and page.has('javascript:alert(1)"')


@pytest.fixture(scope="module")
def small():
    with LocalCluster(n_workers=1, threads_per_worker=1, memory_limit="1GB", dashboard_address=":0") as c:
        yield c


def test_a_local_clusters_summary_and_a_death_with_its_cause(small):
    page = Page(small._repr_html_())
    assert page.has(small.scheduler_address) and page.has("running")
    assert page.links == [small.dashboard_link]
    assert page.has("Workers") and page.has("1") and page.has("953.67 MiB")
    with Client(small, set_as_default=False) as client:
        # A worker killed from outside: the scheduler records its death with a cause.
        before = len(client.deaths())
        nanny = psutil.Process(next(iter(small.worker_pids().values())))
        worker = wait_until(lambda: nanny.children(), 20, "the nanny's worker process")[0]
        os.kill(worker.pid, signal.SIGKILL)
        # Its verdict final: a first record may be changed by evidence that comes later.
        death = wait_until(lambda: [d for d in client.deaths()[before:] if d.get("final_at") is not None], 30,
                           "the death's final verdict")[0]
        wait_until(lambda: len(client.scheduler_info()["workers"]) == 1, 30, "the worker to be back")
        page = Page(small._repr_html_())
        assert page.has(death["cause"]) and page.has(death["name"])
        # The client's summary: its connection, and the cluster's summary inside.
        text = client._repr_html_()
        page = Page(text)
        assert page.has(client.id) and page.has("Cluster object: LocalCluster") and page.has(death["cause"])
        assert text.count('class="hpc-cluster-summary"') == 2
        with Client(small.scheduler_address, secret=small.secret, set_as_default=False) as direct:
            page = Page(direct._repr_html_())
            assert page.has("Direct") and page.has(death["cause"]) and page.has("Total threads")


def test_the_scale_control_calls_scale_and_the_summary_follows(small):
    pytest.importorskip("ipywidgets")
    import ipywidgets
    widget = small._widget()
    request = find_control(widget, ipywidgets.IntText, "Workers")
    request.value = 2
    find_control(widget, ipywidgets.Button, "Scale").click()
    assert len(small.workers) == 2
    with Client(small, set_as_default=False) as client:
        client.wait_for_workers(2, timeout=60)
    small.scale(1)
    wait_until(lambda: len(small.workers) == 1, 30, "the cluster back at one worker")
    assert small._widget() is widget                      # made once per cluster, brought up to date


def test_in_a_notebook_the_widget_and_the_html_are_displayed_and_without_ipywidgets_the_html_alone(small, monkeypatch):
    pytest.importorskip("ipywidgets")
    from IPython.core.interactiveshell import InteractiveShell
    from IPython.display import display
    from IPython.utils.capture import capture_output
    InteractiveShell.instance()
    with capture_output() as shown:
        display(small)
    bundle = shown.outputs[0].data
    assert "application/vnd.jupyter.widget-view+json" in bundle and small.scheduler_address in bundle["text/html"]
    monkeypatch.setattr(small, "_notebook_widget", None)
    monkeypatch.setitem(sys.modules, "ipywidgets", None)          # as if not installed
    with capture_output() as shown:
        display(small)
    bundle = shown.outputs[0].data
    assert set(bundle) == {"text/plain", "text/html"} and small.scheduler_address in bundle["text/html"]


def test_a_batch_clusters_summary_shows_its_jobs_and_their_states(sim):
    with PBSCluster(cores=1, memory="1GB", walltime="00:10:00", job_name="evil<b>job") as cluster:
        page = Page(cluster._repr_html_())
        assert page.has("pbs") and page.has("evil<b>job") and "b" not in page.tags
        assert page.has("cores=1, memory=1GB, processes=1, walltime=00:10:00"), "|".join(page.text)
        cluster.scale(1)
        job = wait_until(lambda: list(cluster.jobs), 30, "the job to be submitted")[0]
        with Client(cluster, set_as_default=False) as client:
            client.wait_for_workers(1, timeout=60)
        page = Page(cluster._repr_html_())
        assert page.has(job) and page.has("running") and page.has("Total threads")
        assert any(t.startswith("Jobs (1: 1 running)") for t in page.text)
    page = Page(cluster._repr_html_())
    assert page.has("closed") and page.has("the cluster is closed")
