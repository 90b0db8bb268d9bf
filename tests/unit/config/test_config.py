"""Site configuration: lookup order, merging, env and keyword overrides, errors with lines, CLI."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from hpc_cluster import config as cfg
from hpc_cluster.cli import main

REPO = Path(__file__).resolve().parents[3]

SYSTEM = """\
default: lab
sites:
  lab:
    batch: slurm
    queue: normal
    account: lab123
    job_script_prologue: ["module load python/3.11"]
    memory: 8GB
  gpu:
    batch: slurm
    queue: gpu
settings:
  allowed_failures: 5
"""

USER = """\
sites:
  lab:
    memory: 32GB
    walltime: "04:00:00"
"""


@pytest.fixture
def place(tmp_path):
    """A fake machine: home, XDG-less user dir, a system dir and a working directory."""
    home, etc, work = tmp_path / "home", tmp_path / "etc", tmp_path / "work"
    for d in (home, etc, work):
        d.mkdir()
    environ = {"HOME": str(home), "HPC_CLUSTER_SYSTEM_CONFIG_DIR": str(etc)}

    class Place:
        pass
    p = Place()
    p.home, p.etc, p.work, p.environ = home, etc, work, environ
    p.user_file = home / ".config" / "hpc-cluster" / "config.yaml"
    p.system_file = etc / "config.yaml"
    p.cwd_file = work / "hpc-cluster.yaml"

    def write(path: Path, text: str) -> Path:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text))
        return path
    p.write = write
    p.resolve = lambda **kw: cfg.resolve(environ=p.environ, cwd=p.work, **kw)
    return p


def parse_error(text: str, path: str = "/site/config.yaml") -> list[str]:
    with pytest.raises(cfg.ConfigError) as info:
        cfg.parse_config_text(textwrap.dedent(text), path)
    return info.value.problems


# ---------------------------------------------------------------------------- lookup order

def test_lookup_order_without_a_named_file(place):
    paths = [c.path for c in cfg.candidate_paths(environ=place.environ, cwd=place.work)]
    assert paths == [place.cwd_file, place.user_file, place.system_file]


def test_xdg_config_home_replaces_dot_config(place, tmp_path):
    place.environ["XDG_CONFIG_HOME"] = str(tmp_path / "xdg")
    paths = [c.path for c in cfg.candidate_paths(environ=place.environ, cwd=place.work)]
    assert paths[1] == tmp_path / "xdg" / "hpc-cluster" / "config.yaml"


def test_named_files_replace_the_personal_ones_but_not_the_system_file(place, tmp_path):
    place.environ["HPC_CLUSTER_CONFIG"] = str(tmp_path / "env.yaml")
    cands = cfg.candidate_paths(config=tmp_path / "explicit.yaml", environ=place.environ, cwd=place.work)
    assert [c.path for c in cands] == [tmp_path / "explicit.yaml", tmp_path / "env.yaml", place.system_file]
    assert [c.required for c in cands] == [True, True, False]


def test_found_files_in_priority_order_and_missing_ones_skipped(place):
    place.write(place.system_file, SYSTEM)
    place.write(place.cwd_file, "settings: {allowed_failures: 1}\n")
    assert cfg.find_config_files(environ=place.environ, cwd=place.work) == [place.cwd_file, place.system_file]


def test_a_named_file_that_does_not_exist_is_an_error(place, tmp_path):
    with pytest.raises(cfg.ConfigError, match=r"nope\.yaml: no such config file \(given by config="):
        place.resolve(config=tmp_path / "nope.yaml")
    place.environ["HPC_CLUSTER_CONFIG"] = str(tmp_path / "gone.yaml")
    with pytest.raises(cfg.ConfigError, match=r"gone\.yaml: no such config file \(given by \$HPC_CLUSTER_CONFIG"):
        place.resolve()


# ---------------------------------------------------------------------------- merging

def test_user_file_overrides_system_file_per_key(place):
    place.write(place.system_file, SYSTEM)
    place.write(place.user_file, USER)
    rc = place.resolve()
    assert rc.site == "lab"
    assert rc["memory"] == 32 * 10**9 and rc.raw["memory"] == "32GB"
    assert rc.sources["memory"] == f"file:{place.user_file}:3"
    assert rc["walltime"] == 4 * 3600
    # what only the lab file says still applies
    assert rc["account"] == "lab123" and rc.sources["account"] == f"file:{place.system_file}:6"
    assert rc["job_script_prologue"] == ["module load python/3.11"]
    assert rc["allowed_failures"] == 5 and rc.sources["allowed_failures"] == f"file:{place.system_file}:13"
    # No cores anywhere: dask-jobqueue's required settings stay unset (the cluster classes and
    # `up` refuse that with advice), and so does the processes split that depends on them.
    assert rc["cores"] is None and rc["processes"] is None and rc.sources["processes"] == "default"
    assert rc["walltime"] == 4 * 3600 and rc.raw["walltime"] == "04:00:00"
    assert rc.files == [str(place.user_file), str(place.system_file)]


def test_processes_default_to_about_sqrt_cores(place):
    place.write(place.user_file, "sites:\n  lab:\n    batch: slurm\n    cores: 16\n")
    rc = place.resolve()
    assert rc["processes"] == 4 and rc.sources["processes"] == "default:sqrt(cores)"
    assert place.resolve(processes=2)["processes"] == 2


def test_cwd_file_beats_user_file(place):
    place.write(place.user_file, USER)
    place.write(place.cwd_file, "sites:\n  lab:\n    memory: 64GB\n")
    rc = place.resolve()
    assert rc["memory"] == 64 * 10**9 and rc.sources["memory"].startswith(f"file:{place.cwd_file}:")
    assert rc["walltime"] == 4 * 3600


def test_explicit_file_is_read_with_the_system_file_only(place, tmp_path):
    place.write(place.system_file, SYSTEM)
    place.write(place.user_file, USER)
    explicit = place.write(tmp_path / "run.yaml", "sites:\n  lab:\n    cores: 8\n")
    rc = place.resolve(config=explicit)
    assert rc["cores"] == 8
    assert rc["memory"] == 8 * 10**9          # from the system file, not the user's 32GB
    assert rc.files == [str(explicit), str(place.system_file)]


def test_an_earlier_file_wins_even_over_a_later_files_site(place):
    # The user's `settings` beats the lab's site entry: files are layers, earlier on top.
    place.write(place.system_file, SYSTEM.replace("    memory: 8GB\n", "    memory: 8GB\n    heartbeat_ttl: 30\n"))
    place.write(place.user_file, "settings:\n  heartbeat_ttl: 10\n")
    assert place.resolve()["heartbeat_ttl"] == 10.0


def test_within_one_file_the_site_beats_settings(place):
    place.write(place.user_file, """\
        sites:
          a: {allowed_failures: 0}
          b: {}
        settings: {allowed_failures: 7}
        default: a
        """)
    assert place.resolve()["allowed_failures"] == 0
    assert place.resolve(site="b")["allowed_failures"] == 7


def test_no_files_gives_the_defaults(place):
    rc = place.resolve()
    assert rc.site is None and rc.files == []
    # The defaults, with the walltime worked out (no batch system: a bare number is seconds).
    assert rc.values == {**cfg.default_values(), "walltime": 1800}
    assert rc["max_message_bytes"] == 64 * 2**30 and rc["walltime_margin"] == 60
    assert (rc["job_name"], rc["cores"], rc["memory"], rc["shebang"]) == ("dask-worker", None, None,
                                                                         "#!/usr/bin/env bash")
    assert set(rc.sources.values()) == {"default"}


# ---------------------------------------------------------------------------- env and keywords

def test_env_overrides_files_and_is_parsed_by_type(place):
    place.write(place.system_file, SYSTEM)
    place.environ.update({
        "HPC_CLUSTER_WALLTIME": "02:00:00",
        "HPC_CLUSTER_ALLOWED_FAILURES": "2",
        "HPC_CLUSTER_NANNY": "false",
        "HPC_CLUSTER_QUEUE": "no",                 # a string, not YAML's False
        "HPC_CLUSTER_JOB_SCRIPT_PROLOGUE": '["module load a", "module load b"]',
        "HPC_CLUSTER_SSH": "{host: login.example.org, port: 2222}",
        "HPC_CLUSTER_HEARTBEAT_TTL": "2.5",
        "HPC_CLUSTER_SECRET": "runtime variables are not settings",
    })
    rc = place.resolve()
    assert rc["walltime"] == 7200 and rc.sources["walltime"] == "env:HPC_CLUSTER_WALLTIME"
    assert rc["allowed_failures"] == 2 and rc.sources["allowed_failures"] == "env:HPC_CLUSTER_ALLOWED_FAILURES"
    assert rc["nanny"] is False
    assert rc["queue"] == "no"
    assert rc["job_script_prologue"] == ["module load a", "module load b"]
    assert rc["ssh"] == {"host": "login.example.org", "port": 2222}
    assert rc["heartbeat_ttl"] == 2.5


def test_keywords_override_env_and_none_means_not_given(place):
    place.write(place.system_file, SYSTEM)
    place.environ["HPC_CLUSTER_WALLTIME"] = "02:00:00"
    rc = place.resolve(walltime="3h", queue=None, cores=16)
    assert rc["walltime"] == 3 * 3600 and rc.sources["walltime"] == "keyword"
    assert rc["queue"] == "normal" and rc.sources["queue"].startswith("file:")
    assert rc["cores"] == 16 and rc.sources["cores"] == "keyword"


def test_unknown_keyword_suggests_the_right_one(place):
    with pytest.raises(cfg.ConfigError) as info:
        place.resolve(walltim="01:00:00")
    assert str(info.value) == "unknown keyword 'walltim'; did you mean 'walltime'?"


def test_bad_keyword_value(place):
    with pytest.raises(cfg.ConfigError, match=r"memory='lots' is not a size I understand; use"):
        place.resolve(memory="lots")
    with pytest.raises(cfg.ConfigError, match=r"cores=0 must be a whole number greater than 0"):
        place.resolve(cores=0)


def test_unknown_env_variable_is_refused_with_a_suggestion(place):
    place.environ["HPC_CLUSTER_WALLTIM"] = "1h"
    with pytest.raises(cfg.ConfigError, match=r"HPC_CLUSTER_WALLTIM is not a setting; did you mean 'HPC_CLUSTER_WALLTIME'"):
        place.resolve()


@pytest.mark.parametrize("var, value, message", [
    ("HPC_CLUSTER_MEMORY", "16 parsecs", r"HPC_CLUSTER_MEMORY: memory='16 parsecs' is not a size"),
    ("HPC_CLUSTER_ALLOWED_FAILURES", "many", r"allowed_failures='many' must be a whole number >= 0"),
    ("HPC_CLUSTER_JOB_SCRIPT_PROLOGUE", "[unclosed", r"not valid YAML for a list of str"),
    ("HPC_CLUSTER_QUEUE", "", r"HPC_CLUSTER_QUEUE is set but empty"),
])
def test_bad_env_values(place, var, value, message):
    place.environ[var] = value
    with pytest.raises(cfg.ConfigError, match=message):
        place.resolve()


# ---------------------------------------------------------------------------- errors in files

def test_unknown_key_names_file_line_site_and_suggestion():
    problems = parse_error("""\
        default: mysite
        sites:
          mysite:
            batch: slurm
            cores: 4
            memory: 16GB
            walltim: "01:00:00"
        """, "/home/alice/.config/hpc-cluster/config.yaml")
    assert problems == ["/home/alice/.config/hpc-cluster/config.yaml, line 7: unknown key 'walltim' "
                        "in site 'mysite'; did you mean 'walltime'?"]


@pytest.mark.parametrize("line, expected", [
    ("memory: 16 parsecs", r"line 4: memory='16 parsecs' is not a size I understand; use .*16GiB"),
    ("walltime: soon", r"line 4: walltime='soon' is not a duration I understand; use .*HH:MM:SS"),
    ("cores: -4", r"line 4: cores=-4 must be a whole number greater than 0"),
    ("processes: 1.5", r"line 4: processes=1.5 must be a whole number greater than 0"),
    ("batch: loadleveler", r"line 4: batch='loadleveler' is not an installed batch system; installed: (.*, )?pbs, (.*, )?slurm"),
    ("nanny: maybe", r"line 4: nanny='maybe' must be true or false"),
    ("job_script_prologue: module load x", r"line 4: job_script_prologue='module load x' must be a list of strings; write \['module load x'\]"),
    ("memory_terminate_fraction: 1.5", r"line 4: memory_terminate_fraction=1.5 must be a fraction"),
    ("env: {FLAG: true}", r"line 4: env: 'FLAG'=True must be a name and a string; quote the value"),
    ("ssh: {host: h, host_key_policy: trust}", r"line 4: ssh.host_key_policy='trust' must be one of reject, auto-add, warn"),
    ("ssh: {user: alice}", r"line 4: ssh needs a host"),
    ("ssh: {host: h, port: 70000}", r"line 4: ssh.port=70000 must be a port number"),
])
def test_bad_values_name_the_line(line, expected):
    problems = parse_error(f"sites:\n  s:\n    name: x\n    {line}\n")
    assert len(problems) == 1
    assert problems[0].startswith("/site/config.yaml, line 4: ")
    assert re.search(expected, problems[0]), problems[0]


def test_nested_ssh_errors_point_at_the_nested_line():
    problems = parse_error("""\
        sites:
          s:
            ssh:
              host: login
              hots_key_policy: warn
        """)
    assert problems == ["/site/config.yaml, line 5: unknown key 'hots_key_policy' in ssh; did you mean "
                        "'host_key_policy'? (allowed: host, user, key, port, known_hosts, host_key_policy) "
                        "in site 's'"]


def test_every_problem_is_reported_at_once():
    problems = parse_error("sites:\n  s:\n    cores: 0\n    memory: x\n    queu: a\n")
    assert [p.split(":")[0].split(", ")[1] for p in problems] == ["line 3", "line 4", "line 5"]


def test_malformed_yaml_gives_file_and_line():
    problems = parse_error("sites:\n  s:\n    cores: 4\n   memory: 16GB\n")
    assert len(problems) == 1
    assert problems[0].startswith("/site/config.yaml, line 4: not valid YAML:")
    assert "indentation" in problems[0]


def test_duplicate_keys_are_refused_not_last_wins():
    problems = parse_error("sites:\n  s:\n    cores: 4\n    cores: 8\n")
    assert problems[0].startswith("/site/config.yaml, line 4: ")
    assert problems[0].endswith("key 'cores' appears twice (first on line 3); keep one")


def test_misplaced_and_unknown_top_level_keys():
    problems = parse_error("cores: 4\nsite: {}\n")
    assert problems[0] == ("/site/config.yaml, line 1: 'cores' must be inside a site (under 'sites: NAME:') "
                           "or, for scheduler/nanny knobs, under 'settings'")
    assert problems[1] == "/site/config.yaml, line 2: unknown top-level key 'site'; did you mean 'sites'?"


def test_site_only_key_in_settings_is_refused():
    problems = parse_error("settings:\n  heartbeat_ttl: 3\n  queue: normal\n")
    assert problems[0].startswith("/site/config.yaml, line 3: 'queue' cannot go in settings")


def test_a_file_that_is_not_a_map():
    assert "must be a map" in parse_error("- a\n- b\n")[0]


def test_empty_file_is_valid():
    assert cfg.parse_config_text("", "/x.yaml").sites == {}


def test_hyphens_and_aliases_name_the_same_setting():
    cf = cfg.parse_config_text("sites:\n  s:\n    job-extra-directives: ['--gres=gpu:1']\n"
                               "settings:\n  drain_margin: 120\n", "/x.yaml")
    assert cf.sites["s"]["job_extra_directives"].value == ["--gres=gpu:1"]
    assert cf.settings["walltime_margin"].value == 120
    problems = parse_error("settings:\n  drain_margin: 1\n  walltime_margin: 2\n")
    assert "'walltime_margin' and 'drain_margin' in settings are the same setting" in problems[0]


def test_relative_template_is_relative_to_its_file(tmp_path):
    cf = cfg.parse_config_text("sites:\n  s:\n    template: job.sh.j2\n", str(tmp_path / "c.yaml"))
    assert cf.sites["s"]["template"].value == str(tmp_path / "job.sh.j2")
    assert cf.sites["s"]["template"].raw == "job.sh.j2"


def test_file_errors_from_resolve_name_the_real_path(place):
    place.write(place.user_file, "sites:\n  s:\n    memroy: 4GB\n")
    with pytest.raises(cfg.ConfigError) as info:
        place.resolve()
    assert str(info.value) == (f"{place.user_file}, line 3: unknown key 'memroy' in site 's'; "
                               "did you mean 'memory'?")


# ---------------------------------------------------------------------------- site selection

def test_site_selection_order(place):
    place.write(place.system_file, SYSTEM)
    assert place.resolve().site == "lab"
    assert place.resolve().site_source == f"file:{place.system_file}:1"
    place.environ["HPC_CLUSTER_SITE"] = "gpu"
    assert place.resolve()["queue"] == "gpu"
    assert place.resolve(site="lab")["queue"] == "normal"


def test_user_default_beats_system_default(place):
    place.write(place.system_file, SYSTEM)
    place.write(place.user_file, "default: gpu\n")
    assert place.resolve().site == "gpu"


def test_the_only_site_needs_no_default(place):
    place.write(place.user_file, "sites:\n  solo: {cores: 2}\n")
    rc = place.resolve()
    assert (rc.site, rc["cores"], rc.site_source) == ("solo", 2, "the only site")


def test_several_sites_and_no_default_is_an_error(place):
    place.write(place.user_file, "sites:\n  a: {}\n  b: {}\n")
    with pytest.raises(cfg.ConfigError, match=r"sites a, b are defined .* none is the default; pass site=NAME"):
        place.resolve()


def test_missing_site_lists_the_available_ones(place):
    place.write(place.system_file, SYSTEM)
    with pytest.raises(cfg.ConfigError) as info:
        place.resolve(site="gpus")
    msg = str(info.value)
    assert "no site 'gpus' (from keyword)" in msg
    assert "available sites: gpu, lab; did you mean 'gpu'?" in msg


def test_default_naming_a_missing_site(place):
    place.write(place.user_file, "default: nowhere\nsites:\n  here: {}\n")
    with pytest.raises(cfg.ConfigError, match=rf"no site 'nowhere' \(from file:{place.user_file}:1\)"):
        place.resolve()


# ---------------------------------------------------------------------------- the table and docs

def test_every_default_passes_its_own_validator():
    for o in cfg.OPTIONS:
        if o.default is not None:
            o.check(o.name, o.default)
        if o.example is not None:
            o.check(o.name, o.example)


def test_docs_list_every_key():
    docs = (REPO / "docs" / "configuration.md").read_text()
    # Ours: a plugin's settings (fakebatch_grace, when the example plugin is installed) are its docs' business.
    missing = [o.name for o in cfg.OPTIONS if o.ours and f"`{o.name}`" not in docs]
    assert not missing, f"docs/configuration.md lacks {missing}"


def test_starter_config_is_valid_and_uses_the_detected_batch():
    cf = cfg.parse_config_text(cfg.starter_config("pbs", site="hpc", queue="workq"), "/x.yaml")
    assert cf.default.value == "hpc"
    # A walltime is kept as written in a file: how it reads depends on the batch system.
    assert {k: e.value for k, e in cf.sites["hpc"].items()} == {
        "batch": "pbs", "cores": 1, "memory": 10**9, "walltime": "01:00:00", "queue": "workq"}


# ---------------------------------------------------------------------------- CLI

@pytest.fixture
def shell(place, monkeypatch, tmp_path):
    """The process environment of `place`, for the CLI, with a PATH we control."""
    for var in list(os.environ):
        if var.startswith("HPC_CLUSTER_") or var == "XDG_CONFIG_HOME":
            monkeypatch.delenv(var)
    for k, v in place.environ.items():
        monkeypatch.setenv(k, v)
    bindir = tmp_path / "bin"
    bindir.mkdir()
    monkeypatch.setenv("PATH", str(bindir))
    monkeypatch.chdir(place.work)
    place.bindir = bindir

    def fake(name: str, script: str = "exit 0") -> None:
        path = bindir / name
        path.write_text(f"#!/bin/sh\n{script}\n")
        path.chmod(0o755)
    place.fake = fake
    return place


def test_init_detects_slurm_and_the_default_partition(shell, capsys):
    shell.fake("sbatch")
    shell.fake("sinfo", "printf 'debug\\nnormal*\\nlong\\n'")
    assert main(["config", "init"]) == 0
    text = shell.user_file.read_text()
    assert "batch: slurm" in text and "queue: normal" in text
    assert "default partition 'normal' from sinfo" in capsys.readouterr().out
    assert cfg.parse_config_text(text, str(shell.user_file)).sites["mysite"]["queue"].value == "normal"


def test_init_detects_pbs_or_falls_back_to_local(shell, tmp_path):
    shell.fake("qsub")
    assert main(["config", "init", "--path", str(tmp_path / "pbs.yaml"), "--site", "hpc"]) == 0
    assert "    batch: pbs" in (tmp_path / "pbs.yaml").read_text()
    os.remove(shell.bindir / "qsub")
    assert main(["config", "init", "--path", str(tmp_path / "local.yaml")]) == 0
    assert "    batch: local" in (tmp_path / "local.yaml").read_text()


def test_init_never_overwrites_without_force(shell, capsys):
    shell.write(shell.user_file, "# mine\n")
    assert main(["config", "init"]) == 1
    assert "already exists; not overwriting" in capsys.readouterr().err
    assert shell.user_file.read_text() == "# mine\n"
    assert main(["config", "init", "--force"]) == 0
    assert "default: mysite" in shell.user_file.read_text()


def test_check_reports_each_file_and_passes(shell, capsys):
    shell.write(shell.system_file, SYSTEM)
    shell.write(shell.user_file, USER)
    assert main(["config", "check"]) == 0
    out = capsys.readouterr().out
    assert f"{shell.cwd_file}  (not present)" in out
    assert f"{shell.user_file}  ok: sites: lab" in out
    assert f"{shell.system_file}  ok: default lab, sites: lab, gpu; settings: 1" in out
    assert "site used by default: lab" in out and "all good" in out


def test_check_fails_with_every_error(shell, capsys, monkeypatch):
    shell.write(shell.system_file, SYSTEM)
    shell.write(shell.user_file, "sites:\n  lab:\n    walltim: 1h\n")
    shell.write(shell.cwd_file, "sites: [\n")
    monkeypatch.setenv("HPC_CLUSTER_MEMORY", "16 parsecs")      # undone after the test
    assert main(["config", "check"]) == 2
    err = capsys.readouterr().err
    assert "3 problem(s)" in err
    assert f"{shell.user_file}, line 3: unknown key 'walltim' in site 'lab'; did you mean 'walltime'?" in err
    assert f"{shell.cwd_file}, line 2: not valid YAML" in err
    assert "HPC_CLUSTER_MEMORY: memory='16 parsecs'" in err


def test_check_with_a_missing_named_file(shell, capsys, tmp_path):
    assert main(["config", "check", "--config", str(tmp_path / "missing.yaml")]) == 2
    assert "missing.yaml: no such config file" in capsys.readouterr().err


def test_show_prints_values_and_sources(shell, capsys, monkeypatch):
    shell.write(shell.system_file, SYSTEM)
    shell.write(shell.user_file, USER)
    monkeypatch.setenv("HPC_CLUSTER_ALLOWED_FAILURES", "9")
    assert main(["config", "show", "--site", "lab"]) == 0
    out = capsys.readouterr().out
    assert "site: lab  (chosen by: keyword)" in out
    rows = {line.split()[0]: line for line in out.splitlines() if line.strip()}
    assert rows["memory"].split()[1] == "32GB" and rows["memory"].endswith(f"file:{shell.user_file}:3")
    assert rows["account"].endswith(f"file:{shell.system_file}:6")
    assert rows["allowed_failures"].split()[1:] == ["9", "env:HPC_CLUSTER_ALLOWED_FAILURES"]
    assert rows["processes"].split()[1:] == ["-", "default"]      # no cores: nothing to split


def test_show_writes_maps_lists_and_parsed_times(shell, capsys):
    shell.write(shell.user_file, """\
        sites:
          s:
            ssh: {host: login, user: alice}
            env: {OMP_NUM_THREADS: 1}
            walltime: 1:30:00
        settings: {heartbeat_ttl: 2m}
        """)
    assert main(["config", "show"]) == 0
    rows = {line.split()[0]: line for line in capsys.readouterr().out.splitlines() if line.strip()}
    assert "{host: login, user: alice}" in rows["ssh"]
    assert "{OMP_NUM_THREADS: 1}" in rows["env"]
    # YAML 1.1 reads 1:30:00 as the number 5400 (minutes, to SLURM): we keep clock forms as written.
    assert "1:30:00  (= 01:30:00)" in rows["walltime"]
    assert "2m  (= 120 s)" in rows["heartbeat_ttl"]


def test_show_with_an_unknown_site_fails(shell, capsys):
    shell.write(shell.system_file, SYSTEM)
    assert main(["config", "show", "--site", "nope"]) == 2
    assert "available sites: gpu, lab" in capsys.readouterr().err


def test_cli_entry_point_in_a_subprocess(place):
    place.write(place.user_file, "sites:\n  s:\n    cores: -1\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith("HPC_CLUSTER_") and k != "XDG_CONFIG_HOME"}
    env.update(place.environ, PYTHONPATH=str(REPO))
    res = subprocess.run([sys.executable, "-m", "hpc_cluster.cli", "config", "check"],
                         cwd=place.work, env=env, capture_output=True, text=True, timeout=60)
    assert res.returncode == 2
    assert f"{place.user_file}, line 3: cores=-1 must be a whole number greater than 0" in res.stderr


def test_docs_key_table_matches_the_options():
    assert cfg.options_markdown() in (REPO / "docs" / "configuration.md").read_text()
