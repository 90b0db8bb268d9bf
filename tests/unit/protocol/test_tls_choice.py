"""TLS by default (issue 34, point 3): protocol/tls.py's choose_security reads dask's `security=`
and `protocol=` keywords against our default, keeping dask-jobqueue's meaning, and
loopback_only says which LocalCluster hosts stay plain TCP. Pure; no cluster."""

from __future__ import annotations

import pytest
from distributed.security import Security as DaskSecurity

from hpc_cluster.protocol.tls import Security, choose_security, loopback_only

MINE = Security("/ca.pem", "/cert.pem", "/key.pem")


@pytest.mark.parametrize("security, protocol, default, wanted", [
    (None, None, True, True),                 # nothing asked: the default (a batch cluster's)
    (None, None, False, None),                # a site's `security: false`, or LocalCluster on loopback
    (False, None, True, None),                # security=False wins over the default
    (True, None, False, True),                # and security=True too
    (MINE, None, True, MINE),
    (MINE, "tls://", False, MINE),            # dask-jobqueue's pair
    (None, "tls://", False, True),            # tls alone: a certificate made for the cluster
    (None, "tls", False, True),
    (None, "tcp://", True, None),             # tcp alone: plain TCP, as asked
    (None, "TCP", True, None),
    (None, "", True, True),                   # an empty protocol asks for nothing
])
def test_keywords_against_the_default(security, protocol, default, wanted):
    assert choose_security(security, protocol, default) == wanted


def test_a_dask_security_that_asks_for_nothing_leaves_the_default():
    assert choose_security(DaskSecurity(), None, True) is True
    assert choose_security(DaskSecurity(), None, False) is None
    asks = DaskSecurity(require_encryption=True)
    assert choose_security(asks, None, False) is asks        # refused later, saying what it lacks


@pytest.mark.parametrize("security, protocol, message", [
    (False, "tls://", r"protocol='tls://' asks for TLS and security=False turns it off"),
    (True, "tcp://", r"protocol='tcp://' is plain TCP, but security=True asks for TLS"),
    (MINE, "tcp", r"protocol='tcp' is plain TCP, but security=Security"),
    (None, "ucx://", r"protocol='ucx://': hpc-cluster speaks TLS \(the default\) or plain TCP"),
    (None, "inproc://", r"use 'tls://' or 'tcp://'"),
    (None, "wss://", r"no websocket transport"),
])
def test_contradictions_and_other_transports_are_refused(security, protocol, message):
    with pytest.raises(ValueError, match=message):
        choose_security(security, protocol, True)


@pytest.mark.parametrize("host, alone", [
    ("127.0.0.1", True), ("127.0.1.1", True), ("::1", True), ("localhost", True),
    ("0.0.0.0", False), ("::", False), ("", False), (None, False),
    ("192.0.2.7", False), ("10.1.2.3", False),
    ("no-such-host.invalid", False),          # cannot tell: not loopback, so TLS
])
def test_loopback_only(host, alone):
    assert loopback_only(host) is alone
