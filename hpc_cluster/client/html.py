"""What a notebook shows of a Client or a cluster, as dask.distributed's do: an HTML summary
(`_repr_html_`: scheduler, dashboard link, workers, threads, memory, a batch cluster's jobs and
their states, the recent worker deaths with their causes), and for a cluster, scale and adapt
controls where ipywidgets is installed (`_ipython_display_`; without it, the HTML alone).

Every value shown is escaped here (a job name, a worker name, a death's explanation): the HTML is
built from plain facts, so one renderer serves the Client and every cluster class. The clusters
(deploy/) call `cluster_html` from their `_repr_html_` with what only they know (a batch
cluster's jobs, LocalCluster's processes) and mix in `ClusterDisplayMixin`; the Client mixes in
`ClientHTMLMixin`.
"""

from __future__ import annotations

import datetime
import html
from typing import Callable

from ..units import format_memory

MAX_ROWS = 50            # workers or jobs listed; the rest counted
MAX_DEATHS = 5           # the most recent ones: `client.deaths()` has them all
ASK_TIMEOUT = 5.0        # a summary that cannot reach its scheduler says so, soon


class Markup(str):
    """A string that is HTML already (made here from escaped parts)."""


def _e(value) -> str:
    return html.escape("" if value is None else str(value), quote=True)


def _link(url: str | None) -> str:
    if not url:
        return "none"
    if not str(url).startswith(("http://", "https://")):
        return _e(url)                  # not a web address: shown, never a link to follow
    return f'<a href="{_e(url)}" target="_blank" rel="noopener">{_e(url)}</a>'


def _table(head: list[str], rows: list[list[str]]) -> str:
    """A table of already-escaped cells."""
    top = "".join(f'<th style="text-align: left;">{h}</th>' for h in head)
    body = "".join("<tr>" + "".join(f'<td style="text-align: left;">{c}</td>' for c in row) + "</tr>" for row in rows)
    return f"<table><thead><tr>{top}</tr></thead><tbody>{body}</tbody></table>"


def _facts(rows: dict) -> str:
    """Label -> value (escaped here; a value already HTML is passed as `Markup`). Each label is
    written as distributed's summaries write theirs ("<strong>Total threads: </strong>"), which
    code reading a notebook's HTML may look for."""
    cells = "".join(f'<tr><th style="text-align: left;"><strong>{_e(k)}: </strong></th>'
                    f'<td style="text-align: left;">{v if isinstance(v, Markup) else _e(v)}</td></tr>'
                    for k, v in rows.items() if v is not None)
    return f"<table>{cells}</table>"


def _more(shown: int, total: int) -> str:
    return f"<p>and {total - shown} more</p>" if total > shown else ""


def _workers_section(workers: list[dict]) -> str:
    rows = [[_e(w.get("name")), _e(w.get("address")), _e(w.get("nthreads")),
             _e(format_memory(w["memory_limit"]) if w.get("memory_limit") else "no limit"),
             _e(w.get("status")), _e(w.get("pool"))] for w in workers[:MAX_ROWS]]
    return (f"<details><summary>Workers ({len(workers)})</summary>"
            + _table(["Name", "Address", "Threads", "Memory", "Status", "Pool"], rows)
            + _more(len(rows), len(workers)) + "</details>")


def _states(jobs: list[dict]) -> str:
    counts: dict[str, int] = {}
    for job in jobs:
        counts[str(job.get("state"))] = counts.get(str(job.get("state")), 0) + 1
    return ": " + ", ".join(f"{n} {state}" for state, n in sorted(counts.items())) if counts else ""


def _jobs_section(jobs: list[dict]) -> str:
    rows = [[_e(j.get("job_id")), _e(j.get("state")), _e(j.get("node")),
             _e(", ".join(j.get("worker_names") or j.get("workers") or [])), _e(j.get("pool")),
             _e(j.get("reason"))] for j in jobs[:MAX_ROWS]]
    return (f"<details open><summary>Jobs ({len(jobs)}{_e(_states(jobs))})</summary>"
            + _table(["Job", "State", "Node", "Workers", "Pool", "Reason"], rows)
            + _more(len(rows), len(jobs)) + "</details>")


def _deaths_section(deaths: list[dict]) -> str:
    recent = deaths[-MAX_DEATHS:][::-1]
    rows = []
    for d in recent:
        when = datetime.datetime.fromtimestamp(d["time"]).strftime("%Y-%m-%d %H:%M:%S") if d.get("time") else ""
        why = " ".join(filter(None, [d.get("text"), f"fix: {d['advice']}" if d.get("advice") else None]))
        rows.append([_e(when), _e(d.get("name") or d.get("worker")), _e(d.get("job_id")), f"<b>{_e(d.get('cause'))}</b>",
                     "charged to its task" if d.get("blame") else "not charged", _e(why)])
    return (f"<details open><summary>Recent worker deaths ({len(recent)} of {len(deaths)}; "
            "client.deaths() has them all, client.why(future) a task's)</summary>"
            + _table(["When", "Worker", "Job", "Cause", "Blame", "Explanation"], rows) + "</details>")


def summary_html(title: str, facts: dict, workers: list[dict] | None = None, jobs: list[dict] | None = None,
                 deaths: list[dict] | None = None, note: str | None = None, inner: str = "") -> str:
    """The summary of a Client or a cluster from plain facts (None: not known, left out).

    `facts`: label -> value, the header table; `workers`: scheduler_info()'s rows; `jobs`: a
    batch cluster's job rows; `deaths`: client.deaths()'s records; `note`: why something is
    missing; `inner`: another summary's HTML, shown folded (a Client's cluster)."""
    rows = dict(facts)
    if workers is not None:
        memory = sum(w.get("memory_limit") or 0 for w in workers)
        rows.update({"Workers": len(workers), "Total threads": sum(w.get("nthreads") or 0 for w in workers),
                     "Total memory": format_memory(memory) if memory else "no limit"})
    parts = [f'<div class="hpc-cluster-summary"><h3 style="text-align: left;">{_e(title)}</h3>', _facts(rows)]
    if note:
        parts.append(f"<p><i>{_e(note)}</i></p>")
    if workers:
        parts.append(_workers_section(workers))
    if jobs is not None:
        parts.append(_jobs_section(jobs))
    if deaths:
        parts.append(_deaths_section(deaths))
    if inner:
        parts.append(f"<details><summary>Cluster</summary>{inner}</details>")
    parts.append("</div>")
    return "".join(parts)


def _asked(client) -> tuple[list[dict], list[dict]]:
    return list(client.scheduler_info()["workers"].values()), client.deaths()


def cluster_html(cluster, facts: dict, jobs: Callable[[], list[dict]] | None = None) -> str:
    """A cluster's summary: its own `facts` (what only the cluster knows), the scheduler's word on
    workers and deaths (one short connection), and with `jobs`, a batch cluster's job table."""
    status = str(cluster.status)
    head = {"Status": status, "Scheduler": cluster.scheduler_address,
            "Dashboard": Markup(_link(cluster.dashboard_link)), **facts}
    title = f"{type(cluster).__name__}: {getattr(cluster, 'name', None) or cluster.scheduler_address}"
    if status != "running":
        return summary_html(title, head, note=f"the cluster is {status}")
    workers = deaths = job_rows = None
    problems = []
    try:
        with _client_class(cluster, timeout=ASK_TIMEOUT, set_as_default=False, reconnect=0) as client:
            workers, deaths = _asked(client)
    except Exception as exc:
        problems.append(f"the scheduler did not answer: {exc}")
    if jobs is not None:
        try:
            job_rows = jobs()
        except Exception as exc:
            problems.append(f"the job table could not be read: {exc}")
    return summary_html(title, head, workers, job_rows, deaths, note="; ".join(problems) or None)


# The Client class, for a cluster's summary to ask its scheduler with. client.py imports this
# module (the mixin below), so this one cannot import it back: the class registers itself here
# by mixing the mixin in (ClientHTMLMixin.__init_subclass__).
_client_class = None


class ClientHTMLMixin:
    """Client._repr_html_: the connection, and the cluster's summary (folded) when made from a
    cluster object, else the scheduler's workers and deaths as this client sees them."""

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        global _client_class
        if _client_class is None:           # the Client itself; not a user's subclass of it
            _client_class = cls

    def _repr_html_(self) -> str:
        if self.cluster is not None:
            how = f"Cluster object: {type(self.cluster).__name__}"
        elif self.cluster_file:
            how = f"Cluster file: {self.cluster_file}"
        else:
            how = "Direct"
        facts = {"Client": getattr(self, "id", None), "Status": self.status, "Connection": how,
                 "Scheduler": self.scheduler_address, "Dashboard": Markup(_link(self.dashboard_link))}
        if self.status != "running":       # distributed's words first, as its repr says them
            return summary_html("Client", facts, note=f"No scheduler connected: the client is {self.status}")
        if self.cluster is not None and hasattr(self.cluster, "_repr_html_"):
            return summary_html("Client", facts, inner=self.cluster._repr_html_())
        try:
            workers, deaths = _asked(self)
        except Exception as exc:
            return summary_html("Client", facts, note=f"the scheduler did not answer: {exc}")
        return summary_html("Client", facts, workers, None, deaths)


def find_control(widget, kind: type, description: str):
    """The widget of `kind` labelled `description` inside `widget` (a cluster's Scale button)."""
    todo: list = [widget]
    while todo:
        w = todo.pop()
        if isinstance(w, kind) and getattr(w, "description", None) == description:
            return w
        todo.extend(getattr(w, "children", ()) or ())
    return None


class ClusterDisplayMixin:
    """A cluster in a notebook: its summary, and Scale (and Adapt, where the cluster adapts)
    controls when ipywidgets 8 is installed, as dask.distributed's clusters show them. The
    summary is brought up to date after each control is used (it is not polled)."""

    _notebook_widget = None

    def _ipython_display_(self, **kwargs):
        from IPython.display import display
        summary = self._repr_html_()
        widget = self._widget(summary)
        bundle = {} if widget is None else (widget._repr_mimebundle_(**kwargs) or {})
        bundle.update({"text/plain": repr(self), "text/html": summary})
        display(bundle, raw=True)

    def _widget(self, summary: str | None = None):
        """The Status/Scaling tabs (made once per cluster), or None without ipywidgets 8."""
        try:
            import ipywidgets as w
        except ImportError:
            return None
        if int(w.__version__.split(".")[0]) < 8:
            return None                 # no public way to get an older widget's mimebundle
        summary = self._repr_html_() if summary is None else summary
        if self._notebook_widget is not None:
            self._notebook_widget.children[0].value = summary
            return self._notebook_widget
        status, message = w.HTML(summary), w.HTML("")
        layout = w.Layout(width="150px")
        request, scale = w.IntText(0, description="Workers", layout=layout), w.Button(description="Scale", layout=layout)
        rows: list = [w.HBox([request, scale])]
        adaptive: list = []             # what adapt() returned, stopped by a manual scale

        def refresh(text: str = "") -> None:
            message.value = _e(text)
            status.value = self._repr_html_()

        def on_scale(_):
            try:
                for a in adaptive:
                    a.stop()
                adaptive.clear()
                self.scale(request.value)
                refresh(f"scaled to {request.value} workers")
            except Exception as exc:
                refresh(f"scale({request.value}) failed: {exc}")
        scale.on_click(on_scale)
        if hasattr(self, "adapt"):
            lo, hi = w.IntText(0, description="Minimum", layout=layout), w.IntText(0, description="Maximum", layout=layout)
            adapt = w.Button(description="Adapt", layout=layout)

            def on_adapt(_):
                try:
                    adaptive[:] = [self.adapt(minimum=lo.value, maximum=hi.value)]
                    refresh(f"adapting between {lo.value} and {hi.value} workers")
                except Exception as exc:
                    refresh(f"adapt(minimum={lo.value}, maximum={hi.value}) failed: {exc}")
            adapt.on_click(on_adapt)
            rows.append(w.HBox([lo, hi, adapt]))
        controls = w.Accordion(rows, titles=("Manual scaling", "Adaptive scaling")[:len(rows)],
                               layout=w.Layout(min_width="500px"))
        tab = w.Tab([status, w.VBox([message, controls])], titles=("Status", "Scaling"))
        self._notebook_widget = tab
        return tab
