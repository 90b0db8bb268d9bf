"""The dashboard in a real browser (headless Chromium, Debian's package: tests/helpers/browser.py).

Against a LocalCluster whose worker the nanny stopped over its memory budget: every page
loads with the link's token and draws something (a screenshot that is not one colour), the
deaths page shows that death with its verdict, evidence and fix, and its memory timeline as an
SVG chart (a polyline of its samples, limit lines, task starts, the death). Without the token the browser gets the 403 page. Run alone:

    .venv/bin/python -m pytest tests/integration/test_dashboard_browser.py

(installs chromium with apt-get when it is missing and we are root; skips, saying why, if not).
"""

from __future__ import annotations

import html
import re

import pytest

from helpers.browser import colour_summary, dump_dom, ensure_chromium, screenshot
from helpers.dashboard import died  # noqa: F401  (the module fixture its tests ask for)
from helpers.dashboard import (api, fake_scheduler, request, serving, split_link,
                               timeline, with_deaths)
from hpc_cluster.protocol.clusterfile import new_secret

PAGES = ("workers", "tasks", "jobs", "deaths")


@pytest.fixture(scope="session")
def chromium():
    path = ensure_chromium()
    if path is None:
        pytest.skip("no chromium, and not root to apt-get install it (install Debian's `chromium` package)")
    return path


def attributes(tag: str) -> dict[str, str]:
    return {k: html.unescape(v) for k, v in re.findall(r'([\w:-]+)="([^"]*)"', tag)}


def elements(dom: str, name: str, cls: str | None = None) -> list[dict]:
    found = [attributes(t) for t in re.findall(rf"<{name}\b([^>]*)>", dom)]
    return [a for a in found if cls is None or cls in a.get("class", "").split()]


def not_blank(path) -> None:
    colours, top = colour_summary(path)
    assert colours > 30 and top < 0.97, f"{path} looks blank: {colours} colours, the commonest on {top:.0%}"


def test_every_page_draws_in_a_browser_with_the_links_token(chromium, died, tmp_path):
    cluster, _ = died
    for page in PAGES:
        dom = dump_dom(chromium, f"{cluster.dashboard_link}#{page}")
        assert f'data-page="{page}"' in dom and "not updated" not in dom, dom[-3000:]
        assert 'id="status">updated ' in dom
        shot = screenshot(chromium, f"{cluster.dashboard_link}#{page}", tmp_path / f"{page}.png")
        not_blank(shot)
    workers = dump_dom(chromium, f"{cluster.dashboard_link}#workers")
    assert "<td>worker-0</td>" in workers and 'class="bar"' in workers and "of 381.5 MiB" in workers
    tasks = dump_dom(chromium, f"{cluster.dashboard_link}#tasks")
    assert "<td>slowinc</td>" in tasks and elements(tasks, "svg", "chart")
    assert len(elements(tasks, "rect", "task")) >= 30                            # the task stream's bars
    assert "runs no batch jobs" in dump_dom(chromium, f"{cluster.dashboard_link}#jobs")


def test_the_deaths_page_shows_the_memory_death_with_its_evidence_and_timeline(chromium, died):
    cluster, _ = died
    (death,) = api(cluster.dashboard_link, "deaths")["deaths"]
    dom = dump_dom(chromium, f"{cluster.dashboard_link}#deaths")
    box = dom[dom.index(f'id="death-{death["id"]}"'):]
    assert 'data-cause="memory-nanny"' in dom and '<span class="cause">memory-nanny</span>' in box
    assert "charged to the task" in box and "over its memory budget" in html.unescape(box)
    assert "fix: " in box and "running: hog-" in box
    # Its memory timeline (the death record's "memory": heartbeats, then the nanny's 10 Hz
    # samples of the last seconds), drawn: the samples, the limit and terminate lines, the death.
    assert death["memory_samples"] >= 20, death
    (chart,) = elements(dom, "svg", "memory-chart")
    assert int(chart["data-points"]) == death["memory_samples"]
    (line,) = elements(dom, "polyline", "samples")
    assert len(line["points"].split()) == death["memory_samples"]
    assert len(elements(dom, "line", "limit")) == 2 and elements(dom, "line", "died")
    assert elements(dom, "line", "task-start") and "nanny terminates 362.4 MiB" in dom


def test_a_death_with_a_timeline_is_drawn_as_an_svg_chart(chromium, tmp_path):
    # The chart, on a death record that carries the timeline interface ("memory"): 300
    # samples, memory limit and nanny terminate lines, two task starts, the death.
    secret = new_secret()
    state = with_deaths(timeline(300))
    with serving(fake_scheduler(state), secret) as d:
        dom = dump_dom(chromium, f"{d.link}#deaths")
        (chart,) = elements(dom, "svg", "memory-chart")
        assert chart["data-points"] == "300"
        (line,) = elements(dom, "polyline", "samples")
        points = [tuple(map(float, p.split(","))) for p in line["points"].split()]
        assert len(points) == 300 and points[0][0] < points[-1][0] and points[0][1] > points[-1][1]   # rising
        assert len(elements(dom, "line", "limit")) == 2                 # memory limit, nanny terminates
        assert len(elements(dom, "line", "task-start")) == 2 and len(elements(dom, "line", "died")) == 1
        assert "nanny terminates 380.0 MiB" in dom and "memory limit 400.0 MiB" in dom
        not_blank(screenshot(chromium, f"{d.link}#deaths", tmp_path / "chart.png"))


def test_without_the_token_the_browser_and_plain_requests_get_403(chromium, died):
    cluster, _ = died
    host, port, token = split_link(cluster.dashboard_link)
    base = f"http://{host}:{port}/"
    assert "needs its token" in dump_dom(chromium, f"{base}status")
    for path in ("/", "/api/workers", "/api/deaths", "/api/deaths/0/memory"):
        status, _, body = request(base, path)
        assert status == 403 and b"needs its token" in body, path
