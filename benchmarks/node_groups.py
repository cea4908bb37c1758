"""Node groups benchmark (issue 26): N clients in 1, 10 and 100 groups.

The relay (``xds-relay run``, its own process) follows a scripted origin in
this process that builds its configuration per ``node.cluster``
(:class:`tests.interop.per_node.PerNodeOrigin`, as go-control-plane's
``SnapshotCache`` with a ``NodeHash`` by cluster): every cluster has the
ClusterLoadAssignment ``NAME`` on endpoints of its own. N delta streams (one
gRPC connection each, in client worker processes) subscribe to ``NAME``;
client ``i``'s node is of cluster ``g<i mod G>``, so G groups of N/G clients.
The relay groups them with ``upstream.node_groups: {key: [cluster]}``. As a
baseline measured in the same invocation, ``none``: the same N clients (one
cluster) and a relay without ``node_groups``, which asks as its own node.

A run, on a fresh relay: the N streams connect at once (the storm; each
group's first client opens the group and its origin stream); then ``rounds``
times one group's ``NAME`` changes (a different group each round) and every
client of that group notes when the new version arrived; then ``rounds``
times every group's ``NAME`` changes at once and every client notes it. Per
run:

* ``origin_streams``: streams the origin saw opened by the end of the storm
  (with groups, a relay before fad97e5 opened one of its own too, asking for
  nothing); ``origin_streams_asking``: those that asked for something (one
  per group is right); ``origin_connections``: TCP
  connections open to the origin then (the streams are multiplexed on
  them); ``storm_origin_requests``: requests that changed a subscription;
* ``storm_all_ms``: from the storm's start until every client had its first
  response (groups opened on the way); ``storm_cpu_ms``: the relay's CPU
  meanwhile;
* ``update_group_ms``: from one group's change until the last client of that
  group had it (median of rounds);
* ``update_all_ms``: from every group's change (sent in one go) until the
  last of all N clients had its group's (median of rounds);
  ``cpu_ms_per_update_all``: the relay's CPU from then until the ACKs are in
  (mean of rounds);
* ``rss_mib_idle``, ``rss_mib``: the relay's resident memory before the
  clients came and 0.5 s after the storm; ``rss_growth_kib_per_group``:
  (``rss_mib`` - ``rss_mib_idle``) / G, which holds the clients' streams too.

Across configurations, from medians: ``RSS per group beyond the first``
(``rss_mib`` at G groups less at 1 group, over G - 1: the same clients, so
the streams cancel out) and what grouping costs at one group (1 group less
``none``).

Each figure is printed as min / median over ``--runs`` runs (the
configurations alternate within a run, so that the machine's noise is
spread); every run records the 1-minute load when it ended (``load``). The
client workers share the machine with the relay and its origin (this
process): on a small machine the times are the clients' too.

Usage: ``python -m benchmarks.node_groups [--clients 1000] [--groups 1,10,100]
[--runs 3] [--rounds 3] [--workers 2] [--no-baseline] [--relay-src DIR]
[--json PATH]``; the relay runs from ``--relay-src`` (default: this checkout). A
smoke run: ``--clients 40 --groups 1,4 --runs 1 --rounds 1``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import statistics
import time
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

from envoy.service.discovery.v3 import discovery_pb2

from benchmarks.fanout import rss_kib
from benchmarks.processes import (
    NAME,
    cpu_seconds,
    new_streams,
    receive_version,
    relay_process,
    workers,
)
from benchmarks.report import revision, spread, values, write_results
from relay.xds_types import ENDPOINT
from tests.builders import endpoints, version_of
from tests.interop.per_node import PerNodeOrigin

#: The relay's node.cluster (its default): what the origin builds for it.
RELAY_CLUSTER = "xds-relay"
#: The configuration without node groups.
NONE = "none"
#: Figures per run, in the order reported, with their labels.
FIGURES = {
    "origin_streams": "origin streams opened",
    "origin_streams_asking": "origin streams asking",
    "origin_connections": "TCP connections to the origin",
    "storm_origin_requests": "storm: subscription requests to the origin",
    "storm_all_ms": "storm: all clients answered (ms)",
    "storm_cpu_ms": "storm: relay CPU (ms)",
    "update_group_ms": "update reaches all of a group's clients (ms)",
    "update_all_ms": "update of every group reaches all clients (ms)",
    "cpu_ms_per_update_all": "relay CPU per update of every group (ms)",
    "rss_mib_idle": "relay RSS before clients (MiB)",
    "rss_mib": "relay RSS after the storm (MiB)",
    "rss_growth_kib_per_group": "RSS growth per group, streams included (KiB)",
    "load": "1-minute load at the run's end",
}


def connections_to(port: int) -> int:
    """TCP connections established to ``port`` on this machine (from
    ``/proc/net/tcp``: the origin's clients are the relay alone)."""
    count = 0
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with contextlib.suppress(OSError):
            for line in Path(table).read_text().splitlines()[1:]:
                fields = line.split()
                if fields[3] == "01" and int(fields[2].rsplit(":", 1)[1], 16) == port:
                    count += 1
    return count


def cluster_of(index: int, groups: int) -> str:
    """The node cluster of client ``index`` of all, among ``groups`` groups."""
    return f"g{index % groups}"


# -- client workers (separate processes) ----------------------------------------


def worker_main(conn: Connection, first: int, count: int, target: str, groups: int) -> None:
    asyncio.run(_worker(conn, first, count, target, groups))


async def _worker(conn: Connection, first: int, count: int, target: str, groups: int) -> None:
    """Says ``"ready"``; on ``"storm"`` opens its streams at once, each of its
    client's cluster, and sends when each got its first response; then, per
    ``{cluster: version}`` it is sent, when each of its streams of those
    clusters got that cluster's version; stops on None."""
    loop = asyncio.get_running_loop()
    conn.send("ready")
    command = await loop.run_in_executor(None, conn.recv)
    assert command == "storm", command
    channels, calls = new_streams(target, count)
    clusters = [cluster_of(first + i, groups) for i in range(count)]

    async def join(index: int, call: Any) -> float:
        await call.write(discovery_pb2.DeltaDiscoveryRequest(
            node={"id": f"bench-{first + index}", "cluster": clusters[index]},
            type_url=ENDPOINT, resource_names_subscribe=[NAME]))
        return await receive_version(call, None)

    conn.send(await asyncio.gather(*(join(i, c) for i, c in enumerate(calls))))
    while True:
        command = await loop.run_in_executor(None, conn.recv)
        if command is None:
            break
        conn.send(await asyncio.gather(*(receive_version(call, command[cluster])
                                         for call, cluster in zip(calls, clusters, strict=True)
                                         if cluster in command)))
    for call in calls:
        call.cancel()
    for channel in channels:
        await channel.close()


# -- one run ------------------------------------------------------------------------


def _ms(seconds: float) -> float:
    return round(seconds * 1000, 2)


class Origin(PerNodeOrigin):
    """The per-cluster origin, with ``NAME`` for each of ``groups`` clusters (and
    for the relay's own, which the relay without groups asks as)."""

    def __init__(self, groups: int) -> None:
        super().__init__()
        self.groups = groups
        for label in [*(cluster_of(g, groups) for g in range(groups)), RELAY_CLUSTER]:
            self.change(label, 10000 + len(self.by_cluster))

    def change(self, label: str, port: int) -> str:
        """``NAME`` of ``label``'s nodes now on ``port`` (pushed): its version."""
        msg = endpoints(NAME, port)
        self.set_for(label, msg)
        return version_of(msg)


async def measure(config: str, clients: int, rounds: int, worker_count: int,
                  src: Path | None = None) -> dict[str, Any]:
    """One run of ``config`` (a number of groups, or :data:`NONE`) on a fresh relay
    (``src``'s, if given)."""
    groups = 1 if config == NONE else int(config)
    origin = await Origin(groups).start()
    # the cluster whose configuration a client of cluster g<i> gets
    served = (lambda label: RELAY_CLUSTER) if config == NONE else (lambda label: label)
    extra = "" if config == NONE else f"node_groups: {{key: [cluster], max_groups: {groups}}}"
    try:
        async with relay_process("bench-relay", origin.port, drain_period=0,
                                 upstream_extra=extra, src=src) as relay:
            pid = relay.process.pid
            await asyncio.sleep(0.5)
            rss_idle = rss_kib(pid)
            async with workers(worker_main, clients, worker_count, relay.target, groups,
                               numbered=True) as running:
                requests_before = len(origin.subscription_requests())
                cpu_before = cpu_seconds(pid)
                started = time.monotonic()
                running.send("storm")
                firsts = [t for ts in await running.next_messages() for t in ts]
                storm_cpu = cpu_seconds(pid) - cpu_before
                storm_requests = len(origin.subscription_requests()) - requests_before
                streams, asking = len(origin.streams), len(origin.asking())
                connections = connections_to(origin.port)
                await asyncio.sleep(0.5)
                rss = rss_kib(pid)
                labels = [cluster_of(g, groups) for g in range(groups)]
                one_group = []
                for round_no in range(rounds):
                    label = labels[round_no % groups]
                    port = 20000 + round_no * 128 + round_no % groups
                    running.send({label: version_of(endpoints(NAME, port))})
                    await asyncio.sleep(0.2)  # let workers start reading
                    sent = time.monotonic()
                    origin.change(served(label), port)
                    times = [t for ts in await running.next_messages() for t in ts]
                    one_group.append(max(times) - sent)
                    await asyncio.sleep(0.1)  # the last ACKs
                every, cpu = [], []
                for round_no in range(rounds):
                    ports = {label: 40000 + round_no * 128 + g for g, label in enumerate(labels)}
                    running.send({label: version_of(endpoints(NAME, port))
                                  for label, port in ports.items()})
                    await asyncio.sleep(0.2)
                    cpu_before = cpu_seconds(pid)
                    sent = time.monotonic()
                    for label, port in ports.items():
                        origin.change(served(label), port)
                    times = [t for ts in await running.next_messages() for t in ts]
                    every.append(max(times) - sent)
                    await asyncio.sleep(0.1)
                    cpu.append(cpu_seconds(pid) - cpu_before)
                running.send(None)
    finally:
        await origin.stop()
    return {
        "origin_streams": streams,
        "origin_streams_asking": asking,
        "origin_connections": connections,
        "storm_origin_requests": storm_requests,
        "storm_all_ms": _ms(max(firsts) - started),
        "storm_cpu_ms": _ms(storm_cpu),
        "update_group_ms": _ms(statistics.median(one_group)),
        "update_all_ms": _ms(statistics.median(every)),
        "cpu_ms_per_update_all": _ms(statistics.mean(cpu)),
        "rss_mib_idle": round(rss_idle / 1024, 1),
        "rss_mib": round(rss / 1024, 1),
        "rss_growth_kib_per_group": round((rss - rss_idle) / groups, 1),
        "load": os.getloadavg()[0],
    }


# -- the report -----------------------------------------------------------------------


def _number(value: float | None) -> str:
    if value is None:
        return "-"
    if isinstance(value, int) or abs(value) >= 100:
        return f"{value:.0f}"
    return f"{value:.1f}" if abs(value) >= 10 else f"{value:.2f}"


def title(config: str) -> str:
    return "no groups" if config == NONE else f"{config} group{'' if config == '1' else 's'}"


def tables(runs: dict[str, list[dict[str, Any]]], clients: int) -> str:
    """A markdown table of every figure (min / median over runs) per configuration,
    and the figures derived across configurations."""
    configs = list(runs)
    head = [f"| {clients} clients | " + " | ".join(title(c) for c in configs) + " |",
            "| --- |" + " ---: |" * len(configs)]
    lines = []
    for key, label in FIGURES.items():
        cells = []
        for config in configs:
            got = spread(values(runs[config], key))
            cells.append(f"{_number(got['min'])} / {_number(got['median'])}")
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    text = "\n".join([*head, *lines]) + "\n\nmin / median over runs.\n"
    derived = derived_figures(runs)
    if derived:
        text += "\n| across configurations (medians) | KiB |\n| --- | ---: |\n" + "\n".join(
            f"| {label} | {_number(value)} |" for label, value in derived.items()) + "\n"
    return text


def derived_figures(runs: dict[str, list[dict[str, Any]]]) -> dict[str, float]:
    """RSS per group beyond the first (same clients, so their streams cancel out)
    and what grouping costs at one group (against no groups)."""
    rss = {config: statistics.median(values(got, "rss_mib")) * 1024
           for config, got in runs.items() if values(got, "rss_mib")}
    out = {}
    if "1" in rss and NONE in rss:
        out["RSS of 1 group less no groups"] = round(rss["1"] - rss[NONE], 1)
    for config in rss:
        if config not in (NONE, "1") and "1" in rss:
            out[f"RSS per group beyond the first, {config} groups"] = round(
                (rss[config] - rss["1"]) / (int(config) - 1), 1)
    return out


async def run_all(args: argparse.Namespace) -> dict[str, list[dict[str, Any]]]:
    configs = [*([NONE] if args.baseline else []), *args.groups.split(",")]
    runs: dict[str, list[dict[str, Any]]] = {config: [] for config in configs}
    for run in range(args.runs):
        # a different configuration first in each run, to spread the machine's noise
        shift = run % len(configs)
        for config in configs[shift:] + configs[:shift]:
            result = await measure(config, args.clients, args.rounds, args.workers,
                                   args.relay_src)
            runs[config].append(result)
            print(json.dumps({"groups": config, "run": run, **result}), flush=True)
    return runs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--clients", type=int, default=1000)
    parser.add_argument("--groups", default="1,10,100", help="group counts, comma separated")
    parser.add_argument("--runs", type=int, default=3, help="runs of each configuration")
    parser.add_argument("--rounds", type=int, default=3, help="updates of each kind per run")
    parser.add_argument("--workers", type=int, default=2, help="client worker processes")
    parser.add_argument("--baseline", action=argparse.BooleanOptionalAction, default=True,
                        help="also run the relay without node_groups")
    parser.add_argument("--relay-src", type=Path, default=Path(__file__).resolve().parents[1],
                        help="the tree whose relay runs (a git worktree or export of a commit)")
    parser.add_argument("--json", type=Path, default=None, help="write every run here")
    args = parser.parse_args()
    args.relay_src = args.relay_src.resolve()
    print(f"relay at {revision(args.relay_src)} ({args.relay_src})", flush=True)
    print(f"load before: {os.getloadavg()}", flush=True)
    runs = asyncio.run(run_all(args))
    print(f"\nload after: {os.getloadavg()}\n")
    print(tables(runs, args.clients))
    if args.json is not None:
        write_results(args.json, "benchmarks.node_groups", relay_src=str(args.relay_src),
                      revision=revision(args.relay_src),
                      clients=args.clients, runs=runs, derived=derived_figures(runs))


if __name__ == "__main__":
    main()
