"""Fleet benchmark: replicas of one zone behind a Service, a replica killed
and started again, and a reconnect storm with and without admission.

Three relay processes (``xds-relay run``) follow one origin (in this
process, counting its open streams); client worker processes run delta CDS
clients (:class:`tests.e2e.test_fleet.FleetClient`, each subscribed to R
clusters), which connect to a random live replica at each connect, as a
Kubernetes Service spreads connections, and reconnect declaring what they
hold.

* **Kill and rejoin** (N clients, the fleet sharing a Redis snapshot, with
  ``server.max_connection_age`` ``--age``): one replica is SIGKILLed (the
  Service stops sending it clients) and one cluster changes at the origin.
  Reported: the time from the kill until every client of the killed replica
  holds the change (served again by another replica), the worst event-loop
  lag of the replicas that took them, and resources sent again that a client
  had declared (must be 0). The replica is started again; once ready the
  Service sends it new connections. Reported: the time until no replica
  holds more than 1.5x or less than 0.5x the mean of clients (counted in
  each replica's admin ``/clients``), and the origin's open streams (one per
  live replica).
* **Reconnect storm** (M clients, a fresh fleet, no connection age): all M
  arrive at once at one replica, as when the Service's view lags a failure.
  Without admission (a token bucket that never runs dry), that replica takes
  them all; with it (``--admission RATE:BURST``, ``limits.new_streams_per_second``
  and ``limits.new_streams_burst``; the relay's defaults unless given), it
  refuses what exceeds the rate and its burst, and the refused clients back
  off (``--storm-backoff``, jittered by half) and reconnect to a random
  replica. Every client connects from 127.0.0.1, so the per-host limits are
  lifted (they stand for the zone's many hosts). Reported: the time until
  every client holds all R clusters, the worst event-loop lag of each
  replica that took clients (from ``xds_relay_event_loop_lag_seconds``,
  whose buckets bound it), where the clients ended up, and how many streams
  were refused.

Usage: ``python -m benchmarks.fleet [--clients 300] [--storm 1500]
[--resources 50] [--age 3] [--grace 0.5] [--admission RATE:BURST ...]
[--json benchmarks/results/fleet.json]``. Prints a Markdown table. When the
relay has no admission keys yet, the storm with admission is left out (and
says so).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import math
import random
import statistics
import time
import urllib.request
from collections import Counter
from collections.abc import AsyncIterator, Sequence
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from benchmarks.processes import RelayProcess, relay_process, workers
from benchmarks.report import write_results
from relay.config.models import LimitsConfig
from relay.xds_types import CLUSTER
from tests.e2e.test_fleet import CountingOrigin, FleetClient, Service, even
from tests.harness import cluster, eventually, version_of
from tests.redis_server import RedisServer

REPLICAS = 3
LAG = "xds_relay_event_loop_lag_seconds_bucket"
# The clients' reconnect backoff in the kill and rejoin, as in the e2e test.
BACKOFF = 0.2
# How long any one phase may take before the benchmark gives up.
PHASE_TIMEOUT = 120.0
# Every client connects from 127.0.0.1, where a zone's come from many hosts:
# the per-host limits are lifted so that they stand for many.
HOSTS = "connections_per_host: 1000000, streams_per_host: 1000000"
# A token bucket that never runs dry: no admission.
UNLIMITED = 1_000_000


def admission_available() -> bool:
    """Whether this relay has ``limits.new_streams_per_second`` (and its burst)."""
    fields = LimitsConfig.model_fields
    return "new_streams_per_second" in fields and "new_streams_burst" in fields


def limits(admission: tuple[int, int] | None) -> str:
    """The replicas' ``limits`` section: admission at ``(rate, burst)``, or
    none (a bucket that never runs dry, where the relay has admission)."""
    if admission is not None:
        rate, burst = admission
        return (f"limits: {{{HOSTS}, new_streams_per_second: {rate}, "
                f"new_streams_burst: {burst}}}")
    if admission_available():
        return (f"limits: {{{HOSTS}, new_streams_per_second: {UNLIMITED}, "
                f"new_streams_burst: {UNLIMITED}}}")
    return f"limits: {{{HOSTS}}}"


def default_admission() -> str:
    """The relay's own ``rate:burst``, where it has admission."""
    if not admission_available():
        return "500:1000"
    fields = LimitsConfig.model_fields
    return (f"{fields['new_streams_per_second'].default}:"
            f"{fields['new_streams_burst'].default}")


def names_of(resources: int) -> list[str]:
    return [f"cluster-{i}" for i in range(resources)]


def state_of(origin: CountingOrigin, names: Sequence[str]) -> dict[str, str]:
    """What a client of every name holds once it is up to date."""
    return {name: origin.resources[CLUSTER][name][0] for name in names}


# -- client workers (separate processes) ----------------------------------------


def worker_main(conn: Connection, first: int, count: int, names: list[str], seed: int,
                backoff: float, jitter: float) -> None:
    asyncio.run(_worker(conn, first, count, names, seed, backoff, jitter))


async def _worker(conn: Connection, first: int, count: int, names: list[str], seed: int,
                  backoff: float, jitter: float) -> None:
    """``count`` clients, created on ``("add", first_target, state)``; the
    harness moves them with commands, answered one at a time."""
    loop = asyncio.get_running_loop()
    service = Service(rng=random.Random(seed + first))
    clients: list[FleetClient] = []
    marked: list[FleetClient] = []
    conn.send("ready")
    while (command := await loop.run_in_executor(None, conn.recv)) is not None:
        kind, *args = command
        if kind == "live":
            service.live = list(args[0])
            conn.send("ok")
        elif kind == "add":
            target, state = args
            clients = [FleetClient(f"fleet-bench-{first + i}", names, service, backoff, jitter,
                                   first=target) for i in range(count)]
            for client in clients:
                client.expect(state)
            conn.send("ok")
        elif kind == "expect":
            for client in clients:
                client.expect(args[0])
            conn.send("ok")
        elif kind == "mark":
            marked = [c for c in clients if c.target == args[0]]
            conn.send(len(marked))
        elif kind == "reached":
            waited = marked if args[0] == "marked" else clients
            with contextlib.suppress(AssertionError):
                await eventually(lambda w=waited: all(c.reached_at for c in w), PHASE_TIMEOUT)
            conn.send([c.reached_at for c in waited])
        elif kind == "tally":
            conn.send({"resent": sum(len(c.resent) for c in clients),
                       "endings": Counter(code.name for c in clients for code, _ in c.endings),
                       "details": Counter(f"{code.name}: {details}" for c in clients
                                          for code, details in c.endings),
                       "reconnects": sum(c.streams - 1 for c in clients)})
    for client in clients:
        await client.close()


# -- the harness ------------------------------------------------------------------


def admin_get(relay: RelayProcess, path: str) -> bytes:
    with urllib.request.urlopen(f"http://127.0.0.1:{relay.admin_port}{path}",
                                timeout=10) as reply:
        body: bytes = reply.read()
        return body


async def load(replicas: Sequence[RelayProcess]) -> list[int]:
    """Client streams per replica, from each one's admin ``/clients``."""
    answers = await asyncio.gather(*(asyncio.to_thread(admin_get, r, "/clients")
                                     for r in replicas))
    return [len(json.loads(answer)["clients"]) for answer in answers]


async def lag_buckets(relay: RelayProcess, name: str = LAG) -> dict[float, float]:
    """The event-loop lag histogram's cumulative bucket counts, by upper bound
    (``name``: another histogram's buckets, its label sets added up)."""
    text = (await asyncio.to_thread(admin_get, relay, "/metrics")).decode()
    buckets: dict[float, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == name:
                le = float(sample.labels["le"])
                buckets[le] = buckets.get(le, 0.0) + sample.value
    return buckets


def worst_lag(before: dict[float, float], after: dict[float, float]) -> tuple[float, float]:
    """Bounds (low, high] of the worst lag sampled between two readings: the
    lowest bucket holding every new sample, and the one below it."""
    bounds = sorted(after)
    new = {le: after[le] - before.get(le, 0.0) for le in bounds}
    total = new[math.inf]
    low = 0.0
    for le in bounds:
        if new[le] >= total:
            return low, le
        low = le
    return low, math.inf


def lag_text(bounds: tuple[float, float]) -> str:
    low, high = bounds
    if high == math.inf:
        return f"> {low * 1000:g} ms"
    return f"{low * 1000:g}-{high * 1000:g} ms"


@contextlib.asynccontextmanager
async def replica(index: int, origin: CountingOrigin, server: str, sections: str
                  ) -> AsyncIterator[RelayProcess]:
    async with relay_process(f"fleet-bench-relay-{index}", origin.port, 0,
                             upstream_extra="backoff: {initial: 0.05s, max: 0.3s}",
                             server_extra=server, sections=sections) as relay:
        yield relay


async def until_even(replicas: Sequence[RelayProcess], timeout: float
                     ) -> tuple[float | None, list[int]]:
    """Seconds until the clients are spread evenly (None if not within
    ``timeout``), and the counts then."""
    started = time.monotonic()
    while not even(counts := await load(replicas)):
        if time.monotonic() - started > timeout:
            return None, counts
        await asyncio.sleep(0.1)
    return time.monotonic() - started, counts


def seconds_after(times: Sequence[float | None], start: float) -> dict[str, float | None]:
    """The last and the median of ``times`` after ``start`` (None if any is missing)."""
    if not times or any(t is None for t in times):
        return {"all_s": None, "median_s": None}
    after = [t - start for t in times if t is not None]
    return {"all_s": round(max(after), 3), "median_s": round(statistics.median(after), 3)}


async def kill_and_rejoin(args: argparse.Namespace, origin: CountingOrigin,
                          redis: RedisServer) -> dict[str, Any]:
    names = names_of(args.resources)
    server = f"max_connection_age: {args.age}s, max_connection_age_grace: {args.grace}s"
    sections = (f'persistence: {{redis: {{url: "{redis.url}", key_prefix: "fleet-bench"}}}}\n'
                f"{limits(None)}")
    result: dict[str, Any] = {"clients": args.clients, "age_s": args.age,
                              "grace_s": args.grace, "client_backoff_s": BACKOFF}
    async with contextlib.AsyncExitStack() as running:
        replicas = [await running.enter_async_context(replica(i, origin, server, sections))
                    for i in range(REPLICAS)]
        pool = await running.enter_async_context(
            workers(worker_main, args.clients, args.workers, names, args.seed, BACKOFF, 0.0,
                    numbered=True))

        async def ask(*command: Any) -> list[Any]:
            pool.send(command)
            return await pool.next_messages()

        await ask("live", [r.target for r in replicas])
        await ask("add", None, state_of(origin, names))
        settled = [t for ts in await ask("reached", "all") for t in ts]
        assert all(settled), "the fleet did not serve every client"
        await eventually(lambda: len(origin.followers()) == REPLICAS, PHASE_TIMEOUT)

        victim, survivors = replicas[0], replicas[1:]
        changed = cluster(names[0], timeout_s=9)
        await ask("expect", {**state_of(origin, names), names[0]: version_of(changed)})
        await ask("live", [r.target for r in survivors])
        result["killed_replica_clients"] = sum(await ask("mark", victim.target))
        before = [await lag_buckets(r) for r in survivors]
        killed = time.monotonic()
        victim.process.kill()
        victim.process.wait()
        origin.set(changed)
        times = [t for ts in await ask("reached", "marked") for t in ts]
        result["reconfigured"] = seconds_after(times, killed)
        after = [await lag_buckets(r) for r in survivors]
        result["survivor_worst_lag"] = [lag_text(worst_lag(b, a))
                                        for b, a in zip(before, after, strict=True)]
        await ask("reached", "all")
        await eventually(lambda: len(origin.followers()) == REPLICAS - 1, PHASE_TIMEOUT)
        result["origin_streams_after_kill"] = len(origin.followers())

        rejoined = await running.enter_async_context(replica(0, origin, server, sections))
        fleet = [rejoined, *survivors]
        result["load_at_rejoin"] = await load(fleet)
        await ask("live", [r.target for r in fleet])
        took, counts = await until_even(fleet, 5 * args.age)
        result["even_after_s"] = None if took is None else round(took, 2)
        result["load_when_even"] = counts
        result["origin_streams_after_rejoin"] = origin.followers()
        result["origin_streams_opened"] = len(origin.streams)
        tallies = await ask("tally")
        result["resent"] = sum(t["resent"] for t in tallies)
        result["reconnects"] = sum(t["reconnects"] for t in tallies)
        pool.send(None)
    return result


async def storm(args: argparse.Namespace, origin: CountingOrigin,
                admission: tuple[int, int] | None) -> dict[str, Any]:
    names = names_of(args.resources)
    state = state_of(origin, names)
    sections = limits(admission)
    result: dict[str, Any] = {"clients": args.storm, "admission": admission,
                              "client_backoff_s": args.storm_backoff}
    warm: list[FleetClient] = []
    async with contextlib.AsyncExitStack() as running:
        replicas = [await running.enter_async_context(
            replica(i, origin, "max_connection_age: 0s", sections)) for i in range(REPLICAS)]
        # One client each, so that every replica holds the clusters: the storm
        # is served from their caches, as after a replica's death.
        for r in replicas:
            warm.append(FleetClient(f"warm-{r.xds_port}", names, Service([r.target])))
            warm[-1].expect(state)
        await eventually(lambda: all(c.reached_at for c in warm), PHASE_TIMEOUT)
        pool = await running.enter_async_context(
            workers(worker_main, args.storm, args.workers, names, args.seed,
                    args.storm_backoff, 0.5, numbered=True))

        async def ask(*command: Any) -> list[Any]:
            pool.send(command)
            return await pool.next_messages()

        await ask("live", [r.target for r in replicas])
        before = [await lag_buckets(r) for r in replicas]
        started = time.monotonic()
        await ask("add", replicas[0].target, state)
        times = [t for ts in await ask("reached", "all") for t in ts]
        result["configured"] = seconds_after(times, started)
        after = [await lag_buckets(r) for r in replicas]
        counts = await load(replicas)
        result["load"] = [c - 1 for c in counts]  # less the warm client
        result["worst_lag"] = [lag_text(worst_lag(b, a)) if c > 1 else None
                               for b, a, c in zip(before, after, counts, strict=True)]
        tallies = await ask("tally")
        endings: Counter[str] = Counter()
        details: Counter[str] = Counter()
        for tally in tallies:
            endings.update(tally["endings"])
            details.update(tally["details"])
        result["refused"] = dict(endings)
        result["refusals"] = dict(details)
        pool.send(None)
        for client in warm:
            await client.close()
    return result


async def measure(args: argparse.Namespace) -> dict[str, Any]:
    origin = await CountingOrigin().start()
    origin.set(*(cluster(name) for name in names_of(args.resources)))
    redis = RedisServer().start()
    results: dict[str, Any] = {"resources": args.resources}
    try:
        results["kill_and_rejoin"] = await kill_and_rejoin(args, origin, redis)
        print(json.dumps({"kill_and_rejoin": results["kill_and_rejoin"]}), flush=True)
        results["storms"] = [await storm(args, origin, None)]
        print(json.dumps({"storm": results["storms"][-1]}), flush=True)
        if admission_available():
            for setting in args.admission:
                rate, burst = (int(part) for part in setting.split(":"))
                results["storms"].append(await storm(args, origin, (rate, burst)))
                print(json.dumps({"storm": results["storms"][-1]}), flush=True)
        else:
            print("this relay has no limits.new_streams_per_second: the storm with "
                  "admission is left out", flush=True)
    finally:
        redis.stop()
        await origin.stop()
    return results


def table(results: dict[str, Any]) -> str:
    kill = results["kill_and_rejoin"]
    rows = [
        ("kill: clients of the killed replica", f"{kill['killed_replica_clients']} of "
         f"{kill['clients']}"),
        ("kill: all of them served again by the others (s)",
         f"{kill['reconfigured']['all_s']} (median {kill['reconfigured']['median_s']}; "
         f"their backoff {kill['client_backoff_s']:g})"),
        ("kill: worst event-loop lag of the survivors", ", ".join(kill["survivor_worst_lag"])),
        ("kill: resources re-sent that a client declared", str(kill["resent"])),
        ("kill: origin streams open after it", str(kill["origin_streams_after_kill"])),
        (f"rejoin: clients per replica when ready, age {kill['age_s']:g}s",
         str(kill["load_at_rejoin"])),
        ("rejoin: even (none > 1.5x or < 0.5x the mean) after (s)",
         f"{kill['even_after_s']} ({kill['load_when_even']})"),
        ("rejoin: origin streams open, opened in all",
         f"{len(kill['origin_streams_after_rejoin'])}, {kill['origin_streams_opened']}"),
    ]
    for run in results["storms"]:
        label = f"storm of {run['clients']}"
        if run["admission"] is None:
            label += " without admission"
        else:
            label += " with admission ({}/s, burst {})".format(*run["admission"])
        rows += [
            (f"{label}: every client configured (s)",
             f"{run['configured']['all_s']} (median {run['configured']['median_s']})"),
            (f"{label}: worst event-loop lag per replica",
             ", ".join("-" if lag is None else lag for lag in run["worst_lag"])),
            (f"{label}: clients per replica, streams refused",
             f"{run['load']}, {sum(run['refused'].values())}"),
        ]
    if len(results["storms"]) == 1 and not admission_available():
        rows.append(("storm with admission",
                     "not run: this relay has no limits.new_streams_per_second"))
    width = max(len(label) for label, _ in rows)
    lines = [f"| {'figure':<{width}} | value |", f"| {'-' * width} | --- |"]
    lines += [f"| {label:<{width}} | {value} |" for label, value in rows]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--clients", type=int, default=300,
                        help="clients of the fleet in the kill and rejoin")
    parser.add_argument("--storm", type=int, default=1500,
                        help="clients arriving at once at one replica")
    parser.add_argument("--resources", type=int, default=50,
                        help="clusters at the origin, each client subscribed to all")
    parser.add_argument("--age", type=float, default=3.0,
                        help="server.max_connection_age of the fleet in the kill and rejoin (s)")
    parser.add_argument("--grace", type=float, default=0.5,
                        help="server.max_connection_age_grace (s)")
    parser.add_argument("--admission", action="append", metavar="RATE:BURST",
                        help="limits.new_streams_per_second and limits.new_streams_burst "
                             "of a storm with admission (repeat for several; default: the "
                             f"relay's, {default_admission()})")
    parser.add_argument("--storm-backoff", type=float, default=0.5,
                        help="a refused client's wait before reconnecting (s, jittered by half)")
    parser.add_argument("--workers", type=int, default=2, help="client processes")
    parser.add_argument("--seed", type=int, default=23)
    parser.add_argument("--json", type=Path, default=Path("benchmarks/results/fleet.json"))
    args = parser.parse_args()
    args.admission = args.admission or [default_admission()]
    results = asyncio.run(measure(args))
    print()
    print(table(results))
    write_results(args.json, "benchmarks.fleet", **results)


if __name__ == "__main__":
    main()
