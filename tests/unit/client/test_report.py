"""performance_report's HTML (client/report.py): one self-contained file, parsed here: no script,
no stylesheet or image fetched from anywhere, what the user gave escaped, and the numbers right."""

from __future__ import annotations

from hpc_cluster.client.report import TaskStreamFigure, prefix_table, render_report
from helpers.pages import ReportPage

def record(key: str, start: float, stop: float, worker: str = "tcp://127.0.0.1:1", lane: int = 0,
           status: str = "OK") -> dict:
    return {"key": key, "worker": worker, "worker_name": "worker-0", "thread": lane,
            "startstops": [{"action": "compute", "start": start, "stop": stop}], "status": status}


RECORDS = [record("inc-aaaa1111bbbb2222", 100.0, 101.0), record("inc-cccc3333dddd4444", 100.5, 103.5, lane=1),
           record("('sum-eeee5555ffff6666', 0)", 104.0, 104.25, status="error"),
           record("slow-1234abcd", 101.0, 105.0, worker="tcp://127.0.0.1:2", status="lost")]
WORKERS = {"tcp://127.0.0.1:1": {"name": "worker-0", "nthreads": 2, "memory_limit": 2 * 2**30},
           "tcp://127.0.0.1:2": {"name": "worker-1", "nthreads": 2, "memory_limit": 0}}
DEATHS = [{"time": 105.0, "worker": "tcp://127.0.0.1:2", "name": "worker-1", "cause": "memory-nanny",
           "text": "over its memory limit, see https://example.org/<b>help</b>", "advice": "ask for more memory"}]


def report(**kw) -> str:
    args = dict(records=RECORDS, workers=WORKERS, deaths=DEATHS, start=99.0, stop=106.0, code="x.compute()")
    return render_report(**{**args, **kw})


def test_the_report_is_one_self_contained_file():
    text = report()
    page = ReportPage(text)
    assert not page.fetches, page.fetches
    assert not {"script", "link", "img", "iframe", "object", "embed"} & set(page.tags)
    assert not any("url(" in s or "@import" in s for s in page.styles)
    assert "svg" in page.tags and page.tags.count("rect") == len(RECORDS)
    # No URL of ours at all; the one in a death's text (the user's data) only as escaped text.
    assert text.count("http") == 1 and "https://example.org/&lt;b&gt;help&lt;/b&gt;" in text


def test_what_the_user_gave_is_escaped():
    text = report(records=[record("<script>alert(1)</script>-1", 1.0, 2.0)], code="<b>x</b>")
    page = ReportPage(text)
    assert "script" not in page.tags and "b" not in page.tags
    assert "&lt;script&gt;" in text and "&lt;b&gt;x&lt;/b&gt;" in text


def test_time_per_prefix_adds_up_and_is_largest_first():
    rows = {r["prefix"]: r for r in prefix_table(RECORDS)}
    assert set(rows) == {"inc", "sum", "slow"}
    assert rows["inc"]["count"] == 2 and rows["inc"]["total"] == 4.0 and rows["inc"]["max"] == 3.0
    assert rows["sum"]["erred"] == 1 and rows["slow"]["erred"] == 1 and rows["inc"]["erred"] == 0
    assert [r["prefix"] for r in prefix_table(RECORDS)] == ["inc", "slow", "sum"]


def test_the_sections_show_workers_and_deaths_or_say_there_were_none():
    text = report()
    assert "worker-1" in text and "memory-nanny" in text and "ask for more memory" in text and "2.00 GiB" in text
    empty = report(records=[], deaths=[], workers={})
    assert "No task ended in this interval" in empty and "No worker died in this interval" in empty
    assert not ReportPage(empty).fetches


def test_a_task_stream_figure_saves_as_a_page_of_its_own(tmp_path):
    figure = TaskStreamFigure(RECORDS)
    assert figure._repr_html_().startswith("<svg")
    figure.save(str(tmp_path / "ts.html"))
    page = ReportPage((tmp_path / "ts.html").read_text())
    assert page.tags.count("rect") == len(RECORDS) and not page.fetches
