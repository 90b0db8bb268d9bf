"""performance_report and get_task_stream, as dask.distributed's context managers (issue 31,
point 7), and the HTML they write.

A report is ONE self-contained HTML file: inline CSS and SVG, no script, no font, no CDN, no
link to anything, so a batch job can write it on a node without network and a user can open it
weeks later anywhere. It shows the task stream, the time per task prefix, the workers and the
deaths during the block. `render_report` and `render_task_stream` are pure functions of plain
data (tested by parsing their output); the context managers gather that data from a client.
"""

from __future__ import annotations

import asyncio
import html
import linecache
import sys
import time
import zlib

from ..units import format_memory

# Colours of task prefixes (Tableau 10; a prefix keeps its colour from report to report).
PALETTE = ("#4e79a7", "#f28e2b", "#59a14f", "#b07aa1", "#76b7b2", "#edc948", "#ff9da7", "#9c755f",
           "#bab0ac", "#e15759")
ERRED, LOST = "#000000", "#d62728"
WIDTH = 960                      # the task stream's drawing width, px
MAX_HEIGHT = 640                 # rows shrink to fit this, down to MIN_ROW px each
ROW, MIN_ROW = 14, 2

CSS = """
body{font-family:system-ui,-apple-system,Segoe UI,Helvetica,Arial,sans-serif;margin:24px;color:#222}
h1{font-size:22px;margin:0 0 4px} h2{font-size:17px;margin:28px 0 8px;border-bottom:1px solid #ddd}
table{border-collapse:collapse;font-size:13px} td,th{padding:3px 10px;text-align:left;border-bottom:1px solid #eee}
th{background:#f6f6f6} td.n{text-align:right;font-variant-numeric:tabular-nums}
.bar{background:#4e79a7;height:10px} .note{color:#666;font-size:13px} pre{background:#f6f6f6;padding:8px}
svg text{font-size:10px;fill:#444}
"""


def key_prefix(key: str) -> str:
    """The task's prefix as dask names it ('inc-1c8d...' -> 'inc', "('x-ab', 0)" -> 'x')."""
    from dask.utils import key_split
    return key_split(key)


def colour(prefix: str) -> str:
    return PALETTE[zlib.crc32(prefix.encode()) % len(PALETTE)]


def _seconds(value: float) -> str:
    if value >= 100:
        return f"{value:.0f} s"
    if value >= 1:
        return f"{value:.2f} s"
    return f"{value * 1000:.1f} ms"


def _span(record: dict) -> tuple[float, float]:
    ss = record["startstops"][0]
    return ss["start"], ss["stop"]


def render_task_stream(records: list[dict], start: float | None = None, stop: float | None = None) -> str:
    """An inline SVG of the executions: a row per worker thread, a bar per task coloured by
    prefix (black: erred, red: its worker died), its key and duration in a hover title."""
    if not records:
        return '<p class="note">No task ended in this interval.</p>'
    spans = [_span(r) for r in records]
    t0 = min(s for s, _ in spans) if start is None else start
    t1 = max(e for _, e in spans) if stop is None else stop
    t1 = max(t1, t0 + 1e-3)
    rows = sorted({(r.get("worker_name") or r["worker"], r.get("thread", 0)) for r in records},
                  key=lambda row: (str(row[0]), row[1]))
    index = {row: i for i, row in enumerate(rows)}
    row_h = max(MIN_ROW, min(ROW, MAX_HEIGHT // len(rows)))
    left, top = 160, 4
    height = top + row_h * len(rows) + 24
    scale = (WIDTH - left - 10) / (t1 - t0)
    # Inline in HTML5, an <svg> needs no namespace attribute: the file names no URL at all.
    out = [f'<svg width="{WIDTH}" height="{height}" role="img" aria-label="task stream">']
    if row_h >= 9:                              # room for a label per row
        for (worker, lane), i in index.items():
            out.append(f'<text x="{left - 6}" y="{top + i * row_h + row_h - 3}" text-anchor="end">'
                       f'{html.escape(str(worker)[-24:])} #{lane}</text>')
    for record, (s, e) in zip(records, spans):
        prefix = key_prefix(record["key"])
        fill = {"error": ERRED, "lost": LOST}.get(record.get("status"), colour(prefix))
        x = left + (max(s, t0) - t0) * scale
        w = max(1.0, (min(e, t1) - max(s, t0)) * scale)
        y = top + index[(record.get("worker_name") or record["worker"], record.get("thread", 0))] * row_h
        title = f"{record['key']} on {record['worker']}: {_seconds(e - s)} ({record.get('status')})"
        out.append(f'<rect x="{x:.1f}" y="{y}" width="{w:.1f}" height="{max(1, row_h - 1)}" fill="{fill}">'
                   f'<title>{html.escape(title)}</title></rect>')
    axis_y = top + row_h * len(rows) + 14
    for i in range(6):
        t = t0 + (t1 - t0) * i / 5
        out.append(f'<text x="{left + (t - t0) * scale:.1f}" y="{axis_y}" text-anchor="middle">'
                   f'{html.escape(_seconds(t - t0))}</text>')
    out.append("</svg>")
    return "".join(out)


def prefix_table(records: list[dict]) -> list[dict]:
    """Per task prefix: tasks, erred, total / mean / max seconds; the most total time first."""
    rows: dict[str, dict] = {}
    for record in records:
        s, e = _span(record)
        row = rows.setdefault(key_prefix(record["key"]), {"count": 0, "erred": 0, "total": 0.0, "max": 0.0})
        row["count"] += 1
        row["erred"] += record.get("status") != "OK"
        row["total"] += e - s
        row["max"] = max(row["max"], e - s)
    return [dict(row, prefix=p, mean=row["total"] / row["count"])
            for p, row in sorted(rows.items(), key=lambda item: -item[1]["total"])]


def _table(head: list[str], rows: list[list[str]], numeric: set[int] = frozenset()) -> str:
    cells = "".join(f"<th>{html.escape(h)}</th>" for h in head)
    body = "".join("<tr>" + "".join(f'<td{" class=n" if i in numeric else ""}>{c}</td>'
                                    for i, c in enumerate(row)) + "</tr>" for row in rows)
    return f"<table><tr>{cells}</tr>{body}</table>"


def render_report(records: list[dict], workers: dict, deaths: list[dict], start: float, stop: float,
                  code: str = "", title: str = "hpc-cluster performance report") -> str:
    """The whole report as one HTML document: `records` as get_task_stream gives them,
    `workers` as scheduler_info()["workers"], `deaths` as client.deaths() (those in the
    interval), `start`/`stop` the interval in the scheduler's clock, `code` what ran."""
    e = html.escape
    prefixes = prefix_table(records)
    busy = sum(p["total"] for p in prefixes)
    biggest = max((p["total"] for p in prefixes), default=0) or 1
    ran_on: dict[str, int] = {}
    for record in records:
        ran_on[record["worker"]] = ran_on.get(record["worker"], 0) + 1
    summary = (f"{len(records)} tasks in {_seconds(stop - start)} of wall time, {_seconds(busy)} of compute "
               f"on {len(workers)} workers ({sum(w.get('nthreads', 0) for w in workers.values())} threads); "
               f"{len(deaths)} worker deaths. From {time.strftime('%Y-%m-%d %H:%M:%S', time.localtime(start))}.")
    prefix_rows = [[e(p["prefix"]), str(p["count"]), str(p["erred"]), e(_seconds(p["total"])),
                    e(_seconds(p["mean"])), e(_seconds(p["max"])),
                    f'<div class="bar" style="width:{200 * p["total"] / biggest:.0f}px;'
                    f'background:{colour(p["prefix"])}"></div>'] for p in prefixes]
    worker_rows = [[e(a), e(str(w.get("name", ""))), str(w.get("nthreads", "")),
                    e(format_memory(w["memory_limit"]) if w.get("memory_limit") else "none"),
                    e(str(w.get("pool") or "")), str(ran_on.get(a, 0))] for a, w in sorted(workers.items())]
    death_rows = [[e(time.strftime("%H:%M:%S", time.localtime(d.get("time") or 0))),
                   e(str(d.get("name") or d.get("worker") or "")), e(str(d.get("cause") or "")),
                   e(str(d.get("text", ""))), e(str(d.get("advice", "")))] for d in deaths]
    parts = [
        "<!DOCTYPE html>", '<html lang="en"><head><meta charset="utf-8">', f"<title>{e(title)}</title>",
        f"<style>{CSS}</style></head><body>", f"<h1>{e(title)}</h1>", f'<p class="note">{e(summary)}</p>',
        "<h2>Task stream</h2>", '<p class="note">A row per worker thread; hover a bar for its key and '
        'duration. Black: the task raised; red: its worker died while running it.</p>',
        render_task_stream(records, start, stop),
        "<h2>Time per task prefix</h2>",
        _table(["prefix", "tasks", "erred", "total", "mean", "max", ""], prefix_rows, {1, 2, 3, 4, 5})
        if prefix_rows else '<p class="note">No task ended in this interval.</p>',
        "<h2>Workers</h2>",
        _table(["address", "name", "threads", "memory limit", "pool", "tasks here"], worker_rows, {2, 5})
        if worker_rows else '<p class="note">No worker was connected at the end.</p>',
        "<h2>Worker deaths</h2>",
        _table(["time", "worker", "cause", "what happened", "advice"], death_rows)
        if death_rows else '<p class="note">No worker died in this interval.</p>',
    ]
    if code:
        parts += ["<h2>Code</h2>", f"<pre>{e(code)}</pre>"]
    parts.append("</body></html>")
    return "\n".join(parts)


def _write(filename: str, text: str, storage_options: dict | None = None) -> None:
    if storage_options or "://" in str(filename):
        import fsspec              # dask's way to a URL; not needed for a plain file
        with fsspec.open(filename, mode="w", compression="infer", **(storage_options or {})) as f:
            f.write(text)
        return
    with open(filename, "w", encoding="utf-8") as f:
        f.write(text)


class TaskStreamFigure:
    """What get_task_stream(plot=True) gives instead of a bokeh figure: an inline SVG that a
    notebook shows, and `save(filename)` writes as one HTML file."""

    def __init__(self, records: list[dict]):
        self.records = records
        self.svg = render_task_stream(records)

    def _repr_html_(self) -> str:
        return self.svg

    def save(self, filename: str = "task-stream.html") -> None:
        _write(filename, f'<!DOCTYPE html><html><head><meta charset="utf-8"><title>Task stream</title>'
                         f"<style>{CSS}</style></head><body>{self.svg}</body></html>")


def _caller_code(stacklevel: int) -> str:
    """The file, line and source line of the `with` that opened the report."""
    try:
        frame = sys._getframe(stacklevel + 1)
    except ValueError:              # not that deep (entered from another thread: async with)
        return ""
    name, line = frame.f_code.co_filename, frame.f_lineno
    return f"{name}:{line}\n{linecache.getline(name, line).rstrip()}"


def _current_client(client=None):
    if client is not None:
        return client
    from .dask_collections import current_client     # not subtasks.get_client: it imports the Client
    return current_client()


class get_task_stream:
    """`with get_task_stream() as ts: ...; ts.data`: the executions that ended inside the block
    (dask's records). plot=True also makes `ts.figure`; plot="save" writes it to `filename`."""

    def __init__(self, client=None, plot=False, filename: str = "task-stream.html"):
        self.data: list[dict] = []
        self.figure = None
        self.client = _current_client(client)
        self._plot, self._filename = plot, filename
        self._start: float | None = None

    def __enter__(self):
        # The scheduler's own clock marks the start: a client on another host may differ.
        self._start = self.client._task_stream(count=0)["now"]
        return self

    def __exit__(self, *exc):
        self.data.extend(self.client._task_stream(start=self._start)["records"])
        if self._plot:
            self.figure = TaskStreamFigure(self.data)
            if self._plot == "save":
                self.figure.save(self._filename)

    async def __aenter__(self):
        return await asyncio.to_thread(self.__enter__)

    async def __aexit__(self, *exc):
        await asyncio.to_thread(self.__exit__, *exc)


class performance_report:
    """`with performance_report(filename="dask-report.html"): ...` writes one self-contained HTML
    file of what ran inside the block: task stream, time per task prefix, workers, deaths.
    `mode` is accepted for dask's signature (there are no bokeh resources to choose)."""

    def __init__(self, filename: str = "dask-report.html", stacklevel: int = 1, mode=None, storage_options=None):
        self.filename = filename
        self._stacklevel = max(1, stacklevel)
        self.mode = mode
        self.storage_options = storage_options or {}
        self.client = None
        self.start = None

    def __enter__(self):
        return self._begin(_caller_code(self._stacklevel))

    def _begin(self, code: str):
        self.client, self._code = _current_client(), code
        self.start = self.client._task_stream(count=0)["now"]
        return self

    def __exit__(self, *exc):
        client = self.client
        stream = client._task_stream(start=self.start)
        deaths = [d for d in client.deaths() if (d.get("time") or 0) >= self.start]
        text = render_report(stream["records"], client.scheduler_info()["workers"], deaths, self.start,
                             stream["now"], self._code)
        _write(self.filename, text, self.storage_options)

    async def __aenter__(self):
        return await asyncio.to_thread(self._begin, "")     # no caller's line to show from a coroutine

    async def __aexit__(self, *exc):
        await asyncio.to_thread(self.__exit__, *exc)
