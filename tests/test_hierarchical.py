"""Hierarchical all_reduce (``backends/mpi/hierarchical.py``) on a cluster of two
network-namespace "nodes" of two ranks each (``hostfiles/netns_cluster.py``, as
``tests/test_cluster.py`` builds it; the module's fixture makes and removes it).

The values: every dtype and op the path takes, sizes that do and do not divide by the ranks per
node, the general path's buffers (a Tensor, a strided view, ``async_op``), against the exact
reduction and raw MPI's, every rank's bits equal (``tests/hier_job.py check``). The switches.
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


@pytest.mark.parametrize("ranks,layout", [(4, "even"), (3, "uneven")])
def test_values_match_the_exact_reduction_on_every_rank(hosts, tmp_path: Path, ranks: int,
                                                        layout: str) -> None:
    """2 + 2 ranks: the split scheme; 2 + 1 ranks: the leaders' scheme."""
    out = _job(hosts, tmp_path, {"MPITENSOR_HIERARCHICAL": "on"}, "check", layout, ranks=ranks)
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


@pytest.mark.parametrize("nbytes,calls,round_robin,ratio", [
    # ranks numbered host by host; 2 KiB: MPI's recursive doubling sends each rank's whole
    # buffer across (2 N a host), the hierarchical path each rank's half (N a host)
    (2048, 200, False, 0.5),
    # round robin: recursive halving pairs ranks on different hosts first (2 N a host)
    (4 << 20, 4, True, 0.5),
    # host by host, 4 MiB: recursive halving pairs host-mates first, and already sends N a
    # host; the hierarchical path sends the same, no more
    (4 << 20, 4, False, 1.0),
])
def test_inter_node_bytes(hosts, tmp_path: Path, nbytes: int, calls: int,
                          round_robin: bool, ratio: float) -> None:
    """Each host's link sends ``ratio`` x the flat path's bytes (1/ranks-per-node where MPI's
    algorithm sends a rank's data across per rank), give or take HEADERS per message."""
    out = _job(hosts, tmp_path, {"MPITENSOR_HIERARCHICAL": "on"}, "bytes",
               str(nbytes / (1 << 20)), str(calls), round_robin=round_robin)
    windows = 2  # the job alternates two windows of each kind
    for flat, hier, idle in _bytes(out):
        # payload a host sends per call: 2 ranks x (the flat path: N each where ratio is 1/2,
        # else N/2 each; the hierarchical path: N/2 each): one message per rank and call
        payload_hier = nbytes
        assert flat >= payload_hier / ratio * calls * windows, (flat, hier, idle)
        slack = 2 * HEADERS * calls * windows + idle + PER_BYTE * payload_hier * calls * windows
        assert abs(hier - ratio * flat) <= slack, (flat, hier, idle, slack)
        assert hier >= payload_hier * calls * windows, (flat, hier, idle)
