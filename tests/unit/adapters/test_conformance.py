"""Our own adapters through the adapter test kit (hpc_cluster/testing/adapter_conformance.py),
on the outputs captured from real batch systems (fixtures/*/, each with its sources)."""

from __future__ import annotations

from hpc_cluster.adapters.pbs import PBSAdapter
from hpc_cluster.adapters.slurm import SLURMAdapter
from hpc_cluster.testing.adapter_conformance import AdapterConformance, Captured, Ending
from helpers.fixtures import fixture



class TestSLURM(AdapterConformance):
    adapter_class = SLURMAdapter
    entry_point = "slurm"
    script_must_contain = ("#SBATCH -J kit-job", "#SBATCH -p kit-queue", "#SBATCH -A kit-account",
                           "#SBATCH --cpus-per-task=3", "#SBATCH --mem=2G", "#SBATCH -t 01:30:00")
    submit_output = Captured("sbatch", fixture("slurm", "sbatch_parsable.txt"))
    submitted_job_id = "39"
    status_outputs = [Captured("squeue", fixture("slurm", "squeue_all.txt"))]
    status_expected = {"39": "completed", "40": "failed", "42": "out-of-memory", "43": "running",
                       "44": "cancelled", "45": "preempted"}
    accounting_outputs = [Captured("sacct", fixture("slurm", "sacct_all.txt"))]
    endings = [
        Ending("39", "completed", exit_code=0),
        Ending("40", "failed", cause="crash", exit_code=3, registered=True),
        Ending("41", "failed", cause="crash", signal=11),
        Ending("42", "out-of-memory", cause="memory-batch"),
        Ending("43", "timeout", cause="walltime"),
        Ending("44", "cancelled", cause="cancelled"),
        Ending("45", "preempted", cause="preempted"),
        Ending("46", "failed", cause="startup", registered=False),
        Ending("50", "node-fail", cause="node-failure"),
    ]
    cancel_outputs = [Captured("scancel", "", "scancel: error: Kill job error on job id 39: Job/step already "
                               "completing or completed\n", 1)]


class TestPBS(AdapterConformance):
    adapter_class = PBSAdapter
    entry_point = "pbs"
    script_must_contain = ("#PBS -N kit-job", "#PBS -q kit-queue", "#PBS -A kit-account",
                           "#PBS -l select=1:ncpus=3:mem=2048MB", "#PBS -l walltime=01:30:00")
    submit_output = Captured("qsub", fixture("pbs", "qsub_openpbs.txt"))
    submitted_job_id = fixture("pbs", "qsub_openpbs.txt").strip()
    status_outputs = [Captured("qstat", fixture("pbs", "openpbs_qstat_xf_json_finished.json"), match="41"),
                      Captured("qstat", fixture("pbs", "openpbs_qstat_xf_json_active.json"))]
    status_expected = {"4101.pbs-head": "completed", "4104.pbs-head": "timeout"}
    accounting_outputs = status_outputs
    endings = [
        Ending("4101.pbs-head", "completed", exit_code=0),
        Ending("4102.pbs-head", "failed", cause="crash", exit_code=3),
        Ending("4103.pbs-head", "failed", cause="crash", signal=11),
        Ending("4104.pbs-head", "timeout", cause="walltime", exit_code=-29),
        Ending("4105.pbs-head", "out-of-memory", cause="memory-batch", exit_code=-27),
        Ending("4108.pbs-head", "cancelled", cause="cancelled", signal=15),
        Ending("4109.pbs-head", "cancelled", cause="cancelled", registered=False),
    ]
    cancel_outputs = [Captured("qdel", "", "qdel: Job has finished 4101.pbs-head\n", 35)]


def test_the_kit_finds_what_is_wrong_with_declared_keywords():
    from hpc_cluster.adapters.base import BatchAdapter
    from hpc_cluster.adapters.options import AdapterOption
    from hpc_cluster.adapters.lsf import LSFAdapter
    from hpc_cluster.testing.adapter_conformance import keyword_problems

    def lenient(key, value):
        return value

    class Bad(BatchAdapter):
        name = "bad"
        keywords = (
            AdapterOption("cores", "int > 0", "clashes with a core setting"),
            AdapterOption("Bad-Name", "str", "not a plain name"),
            AdapterOption("no_help", "str", " "),
            AdapterOption("odd_kind", "colour", "no check for this kind"),
            AdapterOption("anything", "str", "a check that accepts all", check=lenient),
            AdapterOption("bad_default", "int > 0", "a default its check refuses", default=0),
            AdapterOption("ncpus", "int > 0", "LSF's name, declared otherwise"),
            AdapterOption("twice", "str", "one"), AdapterOption("twice", "str", "two"),
        )
    text = "\n".join(keyword_problems(Bad, "bad"))
    for part in ("'cores' is a core setting of hpc-cluster; name yours differently, e.g. 'bad_cores'",
                 "'Bad-Name': a setting's name is lower-case", "no_help: give it help",
                 "odd_kind: kind 'colour' is none config checks by itself", "anything: its check accepts anything",
                 "bad_default: its default 0 does not pass its own check", "'twice' is declared twice",
                 "declare the setting 'ncpus' differently"):
        assert part in text, part
    assert keyword_problems(LSFAdapter, "lsf") == []

    class Quiet(BatchAdapter):          # declares none: nothing to check (and nothing refused there)
        name = "quiet"
    assert keyword_problems(Quiet, "quiet") == []
