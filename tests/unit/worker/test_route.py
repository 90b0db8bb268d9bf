"""The address a worker listens on when told every interface (worker/route.py)."""

from hpc_cluster.worker.route import listen_host, source_address


def test_a_scheduler_on_loopback_gets_a_worker_on_loopback():
    assert listen_host("0.0.0.0", "tcp://127.0.0.1:8786") == "127.0.0.1"
    assert listen_host(None, "tls://127.0.0.5:8786") == "127.0.0.1"


def test_an_address_chosen_by_the_user_is_kept():
    assert listen_host("10.1.2.3", "tcp://127.0.0.1:8786") == "10.1.2.3"


def test_a_scheduler_name_that_does_not_resolve_leaves_every_interface():
    assert source_address("tcp://no-such-host.invalid:8786") is None
    assert listen_host("0.0.0.0", "tcp://no-such-host.invalid:8786") == "0.0.0.0"
