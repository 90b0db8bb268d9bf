"""Running the hpc-cluster command line in the test's process, as a user types it."""

from __future__ import annotations

from hpc_cluster.cli import main


def run_cli(capsys, *argv) -> tuple[int, str, str]:
    """(exit code, stdout, stderr) of `hpc-cluster ARGV...`; argparse's exits (--help, a usage
    error) give their code like any other."""
    try:
        code = main(list(argv))
    except SystemExit as e:
        code = e.code
    out, err = capsys.readouterr()
    return code, out, err
