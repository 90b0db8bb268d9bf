"""Which files of clusters_dir() go (issue 34, point 4: daemon and SLURMCluster-*.log files piled
up, 20 after one afternoon): deploy/leftovers.py's pure selection over names, times and liveness,
and clean_ended() over real files with real processes for live daemons."""

from __future__ import annotations


import pytest

from hpc_cluster.deploy import leftovers
from hpc_cluster.deploy.leftovers import Entry, clean_ended, decide, group, kind_of
from hpc_cluster.protocol.clusterfile import clusters_dir
from helpers.leftover_files import DAY, aged, daemon_pid, left_by  # noqa: F401 (a fixture)

NOW = 1_000_000_000.0


pytestmark = pytest.mark.usefixtures("isolated_home")     # clusters_dir() under tmp


@pytest.mark.parametrize("name, is_dir, expected", [
    ("SLURMCluster-1a2b3c.log", False, ("SLURMCluster-1a2b3c", "log")),
    ("big.json", False, ("big", "cluster file")),
    ("big.previous.log", False, ("big", "previous log")),         # its cluster's, not a cluster 'big.previous'
    ("my.cluster.json", False, ("my.cluster", "cluster file")),
    ("big.scheduler.json", False, ("big", "scheduler file")),      # not the cluster file of 'big.scheduler'
    (".big.plan.json", False, ("big", "plan")),
    ("big.journal", False, ("big", "journal")),
    ("big.owner", False, ("big", "owner")),
    ("big.handover", False, ("big", "handover")),
    ("big.tls", True, ("big", "tls")),
    ("..big.plan.json.4242.tmp", False, ("big", "temporary")),
    (".big.json.4242.tmp", False, ("big", "temporary")),
    (".big.handover.17.tmp", False, ("big", "temporary")),
    (".big.scheduler.json.17.tmp", False, ("big", "temporary")),
    (".big.journal.17.compact", False, ("big", "temporary")),
    # not ours: other names, a file where we make a directory and the reverse
    ("notes.txt", False, None), ("big.json.bak", False, None), ("-big.log", False, None),
    (".big.json", False, None), ("big.tls", False, None), ("big.log", True, None), ("README", False, None),
])
def test_only_our_names_are_ours(name, is_dir, expected):
    assert kind_of(Entry(name, 1, NOW, is_dir)) == expected


def test_a_link_is_never_ours_even_with_our_name():
    assert kind_of(Entry("big.log", 1, NOW, is_link=True)) is None


def listing(*spec):
    """(name, days since changed) -> the entries of a directory listing, grouped."""
    return group(Entry(n, 10, NOW - days * DAY, n.endswith(".tls")) for n, days in spec)


def verdicts(groups, states=None, older_than=7 * DAY, **kw):
    return {v.cluster: v for v in decide(groups, states or {}, NOW, older_than, **kw)}


def test_an_ended_cluster_goes_once_its_newest_file_is_older_than_the_retention():
    got = verdicts(listing(("old.log", 8), ("recent.log", 6), ("mixed.log", 30), (".mixed.plan.json", 1)))
    assert got["old"].remove and got["old"].state == "ended" and got["old"].reason is None
    assert not got["recent"].remove and got["recent"].reason == leftovers.YOUNG
    # One cluster's files go together: a young one keeps the old ones with it.
    assert not got["mixed"].remove and got["mixed"].age == pytest.approx(DAY)
    assert got["old"].bytes == 10 and [e.name for e in got["mixed"].files] == [".mixed.plan.json", "mixed.log"]


def test_live_and_starting_clusters_stay_however_old():
    g = listing(("live.json", 30), ("live.log", 30), ("new.json", 30), ("gone.json", 30), ("gone.log", 30))
    got = verdicts(g, {"live": "running", "new": "starting", "gone": "ended"}, older_than=0)
    assert (got["live"].remove, got["live"].reason) == (False, leftovers.RUNNING)
    assert (got["new"].remove, got["new"].reason) == (False, leftovers.STARTING)
    assert got["gone"].remove


def test_a_cluster_file_whose_liveness_was_not_asked_stays():
    got = verdicts(listing(("unasked.json", 30)), {})
    assert got["unasked"].state == "unknown" and got["unasked"].reason == leftovers.UNKNOWN
    assert not got["unasked"].remove


def test_a_resumable_cluster_stays_for_all_but_goes_with_its_age():
    g = listing(("crashed.json", 30), ("crashed.journal", 30), ("crashed.log", 30))
    states = {"crashed": "stopped"}
    spared = verdicts(g, states, older_than=0, resumable_too=False)["crashed"]
    assert (spared.remove, spared.reason) == (False, leftovers.RESUMABLE)
    assert verdicts(g, states, older_than=0, resumable_too=True)["crashed"].remove
    assert verdicts(g, states, older_than=7 * DAY)["crashed"].remove


def test_retention_never_keeps_everything_and_the_starting_name_is_left_alone():
    got = verdicts(listing(("old.log", 300)), older_than=None)
    assert got["old"].reason == leftovers.RETENTION_OFF and not got["old"].remove
    got = verdicts(listing(("mine.log", 300), ("other.log", 300)), keep=["mine"])
    assert got["mine"].reason == leftovers.THIS_START and got["other"].remove


# -- over real files -------------------------------------------------------------------

def test_clean_ended_removes_old_ended_files_and_keeps_a_live_daemons(daemon_pid):
    aged(left_by("SLURMCluster-0a0a0a", "log", "plan"), days=10)
    aged(left_by("crashed", "cluster", "log", "tls", pid=None), days=10)
    aged(left_by("alive", "cluster", "log", "plan", pid=daemon_pid), days=10)
    left_by("fresh", "log")
    (clusters_dir() / "notes.txt").write_text("the user's")
    got = {v.cluster: v for v in clean_ended(7 * DAY)}
    assert sorted(p.name for p in clusters_dir().iterdir()) == [
        ".alive.plan.json", "alive.json", "alive.log", "fresh.log", "notes.txt"]
    assert got["alive"].state == "running" and not got["alive"].remove
    assert got["crashed"].state == "ended" and {e.name for e in got["crashed"].removed} == {
        "crashed.json", "crashed.log", "crashed.tls"}


def test_a_link_out_of_the_directory_is_not_followed(tmp_path):
    outside = tmp_path / "precious"
    outside.write_text("not ours")
    d = clusters_dir()
    aged(left_by("gone", "log", "tls"), days=10)
    (d / "gone.tls" / "elsewhere").symlink_to(outside)           # inside a directory we remove
    (d / "linked.log").symlink_to(outside)                       # our name, but a link
    aged([d / "gone.tls", d / "linked.log"], days=10)
    clean_ended(0)
    assert outside.read_text() == "not ours"
    assert (d / "linked.log").is_symlink() and not (d / "gone.tls").exists()


def test_liveness_is_asked_only_of_clusters_old_enough_to_go():
    aged(left_by("old", "cluster"), days=10)
    left_by("young", "cluster")
    asked = []
    clean_ended(7 * DAY, state_of=lambda name: asked.append(name) or "ended")
    assert asked == ["old"]


def test_a_dry_run_removes_nothing():
    aged(left_by("gone", "log"), days=10)
    (v,) = clean_ended(DAY, dry_run=True)
    assert v.remove and not v.removed and (clusters_dir() / "gone.log").exists()


def test_a_cluster_that_starts_while_it_is_cleaned_keeps_its_files():
    aged(left_by("x", "log"), days=10)
    aged(left_by("y", "cluster"), days=10)

    def x_starts_meanwhile(name):             # between the choice and the removal
        left_by("x", "cluster")               # launch() writes the cluster file first
        return "ended"
    got = {v.cluster: v for v in clean_ended(DAY, state_of=x_starts_meanwhile)}
    assert got["x"].remove and not got["x"].removed and (clusters_dir() / "x.log").exists()
    assert [e.name for e in got["y"].removed] == ["y.json"]
