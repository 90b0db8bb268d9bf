"""Client messages held back until the inputs they name come back (issue 16, point 4). Mixed
into the server's Scheduler.

A scheduler restarted without knowing its tasks learns them again from its peers, in whatever
order they return. A reattached client sends the keys of its finished futures (`want-keys`)
and then the specs of unfinished work, some of which take those futures as inputs. If the
worker holding such an input has not reattached yet, the key is only *awaited*
(scheduler/state/reattach.py) and the submission would fail as "input ... was released". So an
`update-graph` naming an awaited input waits here, and every later message of the same client
with it (their order is kept), until a worker brings the input or its claim window ends.
"""

from __future__ import annotations

import logging

from ..protocol.frames import ProtocolError
from ..protocol.messages import Op

logger = logging.getLogger("hpc_cluster.scheduler")


class BacklogMixin:
    def _client_op(self, cid: str, msg: dict) -> None:
        """A client's message: applied now, or held back behind an awaited input."""
        backlog = self._backlog.get(cid)
        if backlog is not None or self._awaits_inputs(msg):
            self._backlog.setdefault(cid, []).append(msg)
            return
        self._client_message(cid, msg)

    def _awaits_inputs(self, msg) -> bool:
        st = self.state
        if not st.awaited or not isinstance(msg, dict) or msg.get("op") != Op.UPDATE_GRAPH:
            return False
        tasks = msg.get("tasks")
        return isinstance(tasks, list) and any(
            isinstance(d, str) and d in st.awaited and d not in st.tasks
            for t in tasks if isinstance(t, dict) and isinstance(t.get("deps"), list) for d in t["deps"])

    def _replay_backlog(self) -> None:
        """Apply what was held back whose inputs came (or whose wait ended: then it fails as any
        submission with a missing input does)."""
        for cid in list(self._backlog):
            msgs = self._backlog.pop(cid)
            try:
                for i, msg in enumerate(msgs):
                    if self._awaits_inputs(msg):
                        self._backlog[cid] = msgs[i:]
                        break
                    self._client_message(cid, msg)
            except ProtocolError as exc:                # as if it had come now: that client is dropped
                logger.warning("dropping client %s: %s", cid, exc)
                self._backlog.pop(cid, None)
                comm = self.comms.get(cid)
                if comm is not None:
                    comm.close()
        self._flush()
