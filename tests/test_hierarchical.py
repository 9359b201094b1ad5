"""Hierarchical all_reduce, all_gather_into_tensor and reduce_scatter_tensor
(``backends/mpi/hierarchical*.py``) on a cluster of two network-namespace "nodes" of two ranks each
(``hostfiles/netns_cluster.py``, as ``tests/test_cluster.py`` builds it; the module's fixture
makes and removes it).

The values: every dtype and op the path takes, sizes that do and do not divide by the ranks per
node, the general path's buffers (a Tensor, a strided view, ``async_op``), against the exact
reduction and raw MPI's, every rank's bits equal; gathered blocks in rank order, with ranks
placed host by host and round robin (``tests/hier_job.py check``). The switches.
And the bytes each node's link sends (its ``eth0`` counter, read inside the namespace around
the calls only), flat against hierarchical. Needs root: skipped with the reason elsewhere.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path
from typing import Dict, Iterator, List, Tuple

import pytest

from mpitensor.distributed.launch import find_mpiexec

from .launch import run_job
from .test_cluster import _REASON, NET_ENV, netns_cluster

ROOT = Path(__file__).resolve().parent.parent
JOB = str(ROOT / "tests" / "hier_job.py")
pytestmark = pytest.mark.skipif(_REASON is not None, reason=f"namespace cluster: {_REASON}")


@pytest.fixture(scope="module")
def hosts() -> Iterator["netns_cluster.NetnsCluster"]:
    """Two namespace hosts of two slots; every namespace, link and file removed after."""
    with netns_cluster.NetnsCluster(hosts=2, slots=2) as c:
        yield c
    assert netns_cluster.leftovers(c.prefix) == []

# What a link carries beyond the payload. Per message: MPI's envelope (under 100 bytes) and,
# for a message of one segment, its TCP/IP header and the ACK segment coming back: 256 bytes
# allowed (measured: 95-130). Per byte: a 66-byte TCP/IP header per segment of at least
# 1448 bytes and an ACK for every two, at most 7 % of the payload on either path; since both
# paths pay it on their own payload, the hierarchical bytes may differ from ratio x flat by
# at most 7 % of the hierarchical payload (measured: under 0.1 %) plus the per-message terms.
HEADERS = 256
PER_BYTE = 0.07


def _job(c, tmp_path: Path, env: Dict[str, str], *args: str,
         round_robin: bool = False, ranks: int = 4) -> str:
    cmd = c.mpiexec_args(ranks, find_mpiexec())
    if round_robin:  # one rank per host in turn: ranks 0 and 2 on the first, 1 and 3 on the other
        cmd += ["-ppn", "1"]
    code, out, err, _ = run_job(cmd + [sys.executable, JOB, *args], 240, cwd=tmp_path,
                                env={**NET_ENV, **env})
    assert code == 0, out + err
    return out


@pytest.mark.parametrize("ranks,layout,round_robin", [
    (4, "even", False), (4, "even", True), (3, "uneven", False)])
def test_values_match_the_exact_reduction_on_every_rank(hosts, tmp_path: Path, ranks: int,
                                                        layout: str, round_robin: bool) -> None:
    """2 + 2 ranks: the split scheme (ranks 0-1 and 2-3 on a host, or 0, 2 and 1, 3: the
    all-gather's blocks put back in group-rank order); 2 + 1 ranks: the leaders' scheme."""
    out = _job(hosts, tmp_path, {"MPITENSOR_HIERARCHICAL": "on"}, "check", layout, ranks=ranks,
               round_robin=round_robin)
    assert sorted(re.findall(r"CHECK rank (\d) ok \d+", out)) == [str(r) for r in range(ranks)], \
        out


def test_switches_and_the_cost_model(hosts, tmp_path: Path) -> None:
    def states(env: Dict[str, str]) -> List[str]:
        out = _job(hosts, tmp_path, env, "state")
        rows = dict(re.findall(r"STATE rank (\d) (.+)", out))
        assert sorted(rows) == ["0", "1", "2", "3"], out
        return [rows[r] for r in sorted(rows)]

    assert states({"MPITENSOR_HIERARCHICAL": "off"}) == ["flat"] * 4
    assert states({"MPITENSOR_HIERARCHICAL": "on", "MPITENSOR_SHM_COLLECTIVES": "off"}) \
        == ["flat"] * 4
    # forced on: crossover 0, no model measured, the 2 KiB call went the hierarchical way
    assert states({"MPITENSOR_HIERARCHICAL": "on"}) == ["on 0 0 1"] * 4
    # auto: both paths timed, the fitted model (4 terms) and its crossover the same everywhere
    auto = states({"MPITENSOR_HIERARCHICAL": "auto"})
    assert len(set(auto)) == 1 and re.fullmatch(r"auto \d+ 4 [01]", auto[0]), auto


def _bytes(out: str) -> List[Tuple[int, int, int]]:
    rows = re.findall(r"BYTES (\S+) (\d+) (\d+) (\d+)", out)
    assert len(rows) == 2, out  # local rank 0 of each host
    return [(int(f), int(h), int(i)) for _, f, h, i in rows]


@pytest.mark.parametrize("op,nbytes,calls,round_robin,ratio", [
    # all_reduce of N bytes; the hierarchical path sends N a host (each rank N/2 across).
    # Ranks numbered host by host, 2 KiB: MPI's recursive doubling sends each rank's whole
    # buffer across (2 N a host)
    ("all_reduce", 2048, 200, False, 1 / 2),
    # round robin: recursive halving pairs ranks on different hosts first (2 N a host)
    ("all_reduce", 4 << 20, 4, True, 1 / 2),
    # host by host, 4 MiB: recursive halving pairs host-mates first and already sends N a
    # host; the hierarchical path sends the same, no more
    ("all_reduce", 4 << 20, 4, False, 1.0),
    # all_gather_into_tensor into N bytes (N/4 from each rank); the hierarchical path sends a
    # host's own two blocks across once (N/2 a host). 32 KiB: recursive doubling's last step
    # sends each rank's two blocks across (N a host)
    ("all_gather", 32 << 10, 100, False, 1 / 2),
    # 4 MiB: the ring passes three blocks over each link between hosts: one link a host host
    # by host (3N/4), two round robin (3N/2)
    ("all_gather", 4 << 20, 4, False, 2 / 3),
    ("all_gather", 4 << 20, 4, True, 1 / 3),
    # reduce_scatter_tensor from N bytes: the hierarchical path sends each local rank's node
    # sum of the other node's blocks across (N/2 a host); MPICH's flat one sends each rank's
    # blocks for the other host's ranks (N a host), at both sizes and both placements
    ("reduce_scatter", 32 << 10, 100, False, 1 / 2),
    ("reduce_scatter", 4 << 20, 4, False, 1 / 2),
    ("reduce_scatter", 4 << 20, 4, True, 1 / 2),
])
def test_inter_node_bytes(hosts, tmp_path: Path, op: str, nbytes: int, calls: int,
                          round_robin: bool, ratio: float) -> None:
    """Each host's link sends ``ratio`` x the flat path's bytes, give or take the headers."""
    out = _job(hosts, tmp_path, {"MPITENSOR_HIERARCHICAL": "on"}, "bytes",
               str(nbytes / (1 << 20)), str(calls), op, round_robin=round_robin)
    windows = 2  # the job alternates two windows of each kind
    payload_hier = nbytes if op == "all_reduce" else nbytes // 2  # a host's, per call
    # messages a host sends per call, at most: 2 ranks x 1 (all_reduce), x 3 (a ring's steps,
    # a message to each peer)
    msgs = 2 if op == "all_reduce" else 6
    for flat, hier, idle in _bytes(out):
        assert flat >= payload_hier / ratio * calls * windows, (flat, hier, idle)
        assert hier >= payload_hier * calls * windows, (flat, hier, idle)
        slack = (msgs * HEADERS + PER_BYTE * payload_hier) * calls * windows + idle
        assert abs(hier - ratio * flat) <= slack, (flat, hier, idle, slack)
