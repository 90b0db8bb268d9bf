"""The dashboard's HTTP server: one page, its script and style, and the JSON it draws from.

It runs on the scheduler's own event loop, in the scheduler's process (the cluster daemon, or
LocalCluster's scheduler process: deploy/ starts it beside the Scheduler), on a port of its
own. Every request needs the cluster's dashboard token (protocol/clusterfile.py dashboard_token):
`?token=` in the URL (the link the cluster prints; the page then keeps it in a cookie and
drops it from the address bar), that cookie, or an `Authorization: Bearer` header. Anything
else gets 403. Everything it serves comes from this package: no CDN, nothing fetched.
"""

from __future__ import annotations

import errno
import hmac
import html
import json
import logging
import socket
from pathlib import Path

from tornado.httpserver import HTTPServer
from tornado.netutil import bind_sockets
from tornado.web import Application, HTTPError, RequestHandler

from ..protocol.clusterfile import dashboard_link, dashboard_token
from ..protocol.tls import loopback_only
from .views import Views

logger = logging.getLogger("hpc_cluster.dashboard")

STATIC = Path(__file__).resolve().parent / "static"
FILES = {"dashboard.js": "application/javascript; charset=utf-8", "dashboard.css": "text/css; charset=utf-8"}
# Only what this server serves may run or load: a page that fetched from elsewhere could leak.
CSP = ("default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; connect-src 'self'; "
       "base-uri 'none'; form-action 'none'; frame-ancestors 'none'")
FORBIDDEN = ("403: this dashboard needs its token. Open the link that `cluster.dashboard_link`, "
             "`client.dashboard_link` or `hpc-cluster status` prints (http://host:port/?token=...).\n")


class _Handler(RequestHandler):
    """Every request: the token first, then no caching, no sniffing, no framing."""

    def initialize(self, dashboard: "Dashboard") -> None:
        self.dashboard = dashboard

    def set_default_headers(self) -> None:
        self.set_header("Content-Security-Policy", CSP)
        self.set_header("X-Content-Type-Options", "nosniff")
        self.set_header("Referrer-Policy", "no-referrer")          # the token never travels in a Referer
        self.set_header("Cache-Control", "no-store")

    def prepare(self) -> None:
        d = self.dashboard
        given = self.get_query_argument("token", None)
        if given is not None and d.accepts(given):
            # The cookie is named after the port: two clusters' dashboards on one host are two
            # cookies (a cookie's scope is the host, not the port).
            self.set_cookie(d.cookie, d.token, httponly=True, samesite="Strict", path="/")
            return
        auth = self.request.headers.get("Authorization", "")
        if d.accepts(self.get_cookie(d.cookie)) or (auth.startswith("Bearer ") and d.accepts(auth[7:].strip())):
            return
        raise HTTPError(403)

    def write_error(self, status_code: int, **kwargs) -> None:
        self.set_header("Content-Type", "text/plain; charset=utf-8")
        self.finish(FORBIDDEN if status_code == 403 else f"{status_code}: {self._reason}\n")

    def send_json(self, value) -> None:
        self.set_header("Content-Type", "application/json; charset=utf-8")
        try:
            text = json.dumps(value, default=str, allow_nan=False, separators=(",", ":"))
        except ValueError:             # NaN or inf (not JSON) from a peer's number: null instead, the slow way
            text = json.dumps(_finite(value), default=str, allow_nan=False, separators=(",", ":"))
        self.finish(text)


class PageHandler(_Handler):
    def get(self) -> None:
        self.set_header("Content-Type", "text/html; charset=utf-8")
        self.finish(self.dashboard.page())


class StaticHandler(_Handler):
    def get(self, name: str) -> None:
        if name not in FILES:
            raise HTTPError(404)
        self.set_header("Content-Type", FILES[name])
        self.finish(self.dashboard.file(name))


class ApiHandler(_Handler):
    def get(self, what: str) -> None:
        views = self.dashboard.views
        answer = {"workers": views.workers, "tasks": views.tasks, "jobs": views.jobs, "deaths": views.deaths}.get(what)
        if answer is None:
            raise HTTPError(404)
        self.send_json(answer())


class MemoryHandler(_Handler):
    def get(self, death_id: str) -> None:
        found = self.dashboard.views.death_memory(int(death_id))
        if found is None:
            raise HTTPError(404)
        self.send_json(found)


def _finite(value):
    """NaN and infinities (JSON has neither) as null, anywhere in the answer."""
    if isinstance(value, float):
        return value if value == value and value not in (float("inf"), float("-inf")) else None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_finite(v) for v in value]
    return value


class Dashboard:
    """The dashboard of one scheduler. `host` '' (or '0.0.0.0') listens on every interface,
    as the scheduler does with that host; port 0 takes a free one, and a port in use does too,
    with a warning (as dask's dashboard does), so a second cluster on a host still gets one.
    `jobs`: the job manager's table (a callable), for the jobs page; None on a LocalCluster."""

    def __init__(self, scheduler, secret: bytes, host: str = "127.0.0.1", port: int = 0, jobs=None,
                 name: str | None = None):
        self.scheduler, self.host, self.port = scheduler, host, port
        self.name = name                             # the cluster's, in the page's title and header
        self.token = dashboard_token(secret)
        self._secret = secret
        self.views = Views(scheduler, jobs)
        self.server: HTTPServer | None = None
        self.address: str | None = None              # http://host:port/
        self.cookie = "hpc_cluster_dashboard"
        self._files: dict[str, bytes] = {}

    def accepts(self, given: str | None) -> bool:
        return given is not None and hmac.compare_digest(given.encode("utf-8", "replace"), self.token.encode())

    def page(self) -> bytes:
        """index.html naming its cluster: with several clusters' dashboards open, which is which."""
        page = self.file("index.html")
        if not self.name:
            return page
        shown = html.escape(self.name).encode()
        return (page.replace(b"<title>hpc-cluster dashboard</title>", b"<title>" + shown + b" - hpc-cluster</title>")
                .replace(b"<h1>hpc-cluster</h1>", b'<h1>hpc-cluster <span class="cluster-name">' + shown + b"</span></h1>"))

    def file(self, name: str) -> bytes:
        if name not in self._files:                  # read once: they are small and never change
            self._files[name] = (STATIC / name).read_bytes()
        return self._files[name]

    @property
    def link(self) -> str | None:
        return None if self.address is None else dashboard_link(self.address, self._secret)

    def start(self) -> str:
        """Listen (on the running event loop); returns the link with its token."""
        app = Application([
            (r"/(?:status)?", PageHandler, {"dashboard": self}),        # /status: dask's page
            (r"/static/([A-Za-z0-9_.-]+)", StaticHandler, {"dashboard": self}),
            (r"/api/deaths/([0-9]{1,9})/memory", MemoryHandler, {"dashboard": self}),
            (r"/api/([a-z]+)", ApiHandler, {"dashboard": self}),
        ], default_handler_class=_NotFound, default_handler_args={"dashboard": self}, log_function=_log_request)
        # Answers are not compressed: the scheduler loop's CPU matters more here than bytes.
        bind = self.host if self.host not in ("", "0.0.0.0") else None
        family = socket.AF_INET6 if bind and ":" in bind else socket.AF_INET       # '::1' is IPv6
        try:
            sockets = bind_sockets(self.port, address=bind, family=family)
        except OSError as exc:
            if exc.errno != errno.EADDRINUSE or not self.port:
                raise
            logger.warning("dashboard port %d is in use; the dashboard takes another (cluster.dashboard_link and "
                           "`hpc-cluster status` show it)", self.port)
            sockets = bind_sockets(0, address=bind, family=family)
        self.server = HTTPServer(app, xheaders=False, max_body_size=4096)
        self.server.add_sockets(sockets)
        port = sockets[0].getsockname()[1]
        shown = (f"[{bind}]" if ":" in bind else bind) if bind is not None else socket.gethostname()
        self.address = f"http://{shown}:{port}/"
        self.cookie = f"hpc_cluster_dashboard_{port}"
        # Clients learn the address as they register (client.dashboard_link adds the token).
        self.scheduler.services["dashboard"] = self.address
        if loopback_only(bind):
            logger.info("dashboard at %s (its link with the token: cluster.dashboard_link, hpc-cluster status)",
                        self.address)
        else:                          # an explicit dashboard_address with a host: as asked, but said
            logger.warning("dashboard at %s over plain HTTP: its token crosses the network in clear; a "
                           "dashboard_address without a host (':8787') keeps it on 127.0.0.1, reached from "
                           "elsewhere with `ssh -L` (docs/dashboard.md)", self.address)
        return self.link

    def stop(self) -> None:
        if self.server is not None:
            self.server.stop()
            self.server = None
        self.scheduler.services.pop("dashboard", None)


def _log_request(handler: RequestHandler) -> None:
    """Only failures: tornado's access log would write a line per request (a page open asks
    every few seconds) into the scheduler's log."""
    if handler.get_status() >= 500:
        logger.warning("dashboard: %d %s (%s)", handler.get_status(), handler.request.uri.split("?")[0],
                       handler.request.remote_ip)


class _NotFound(_Handler):
    def get(self, *args) -> None:
        raise HTTPError(404)
