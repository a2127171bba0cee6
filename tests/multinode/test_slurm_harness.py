"""The Slurm test harness itself: a real two-node cluster (munged, slurmctld, a slurmd per network namespace)
runs a two-node batch job whose ``srun`` step lands once on each node, in that node's namespace.

Needs root, ``ip`` and ``make slurm``; skips with the reason otherwise.
"""

from __future__ import annotations

import time
from pathlib import Path

from _slurm import SlurmCluster, slurm_fixture

slurm_cluster = slurm_fixture(nodes=2)

# one line per task: its host name, node, rank and the namespace's global IPv4 addresses
STEP = """#!/bin/bash
echo "step $(hostname) $SLURMD_NODENAME $SLURM_PROCID $(ip -4 -o addr show scope global | awk '{print $4}')"
"""
JOB = """#!/bin/bash
#SBATCH --job-name=harness
#SBATCH --nodes=2
#SBATCH --ntasks-per-node=1
#SBATCH --time=2
set -euo pipefail
srun --nodes=2 --ntasks=2 bash {step}
"""


def test_two_node_job_runs_one_step_per_node_namespace(slurm_cluster: SlurmCluster, tmp_path: Path) -> None:
    (tmp_path / "step.sh").write_text(STEP)
    (tmp_path / "job.sh").write_text(JOB.format(step=tmp_path / "step.sh"))
    started = time.monotonic()
    job = slurm_cluster.submit(tmp_path / "job.sh")
    info = slurm_cluster.wait(job, timeout=45)
    took = time.monotonic() - started
    assert info["JobState"] == "COMPLETED", slurm_cluster.diagnostics(job)
    assert info["ExitCode"] == "0:0", slurm_cluster.diagnostics(job)
    assert info["NodeList"] == "n[1-2]", info

    steps = [line.split() for line in slurm_cluster.output(job).splitlines() if line.startswith("step ")]
    assert len(steps) == 2, slurm_cluster.diagnostics(job)
    seen = {node: (int(rank), addrs) for _, _hostname, node, rank, *addrs in steps}
    assert set(seen) == {"n1", "n2"}, steps
    assert {rank for rank, _ in seen.values()} == {0, 1}, steps
    for node, ip in zip(slurm_cluster.names, slurm_cluster.hosts.ips, strict=True):
        # each task saw exactly its node's namespace address (the only global address there)
        assert seen[node][1] == [f"{ip}/24"], (node, ip, steps)
    print(f"2-node job {job}: submitted to COMPLETED in {took:.1f} s; steps {steps}")
