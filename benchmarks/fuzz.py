"""Fuzz benchmark: many Hypothesis-generated clients against a relay process.

The same machinery as ``tests/fuzz`` (strategies, rules, watchers), with many
more examples, against ``xds-relay run`` in its own process so that its
memory is its own. An origin (:func:`tests.fuzz.driver.fuzz_origin`) and four
well-behaved watchers (delta and SotW, ADS and EDS) run here; every example
pushes one update of the watched resource while one generated client (either
protocol, ADS or a per-type service, stream or fetch, valid requests or not)
talks to the relay, and checks how that client's stream ended
(:func:`tests.fuzz.rules.violations`) and that every watcher received the
update, once.

Reported: examples run, how streams ended (by protocol, by what the requests
were, by status), the kinds of requests generated, watcher updates expected
and missed (must be 0) or repeated, the relay's RSS at the start, after a
warm-up and at the end (and its peak), whether it still serves a new client
and its client list and origin subscription are back to the watchers', error
lines in its log, and every example that broke a rule, as JSON that
``--replay`` runs again.

``--limits small`` (the default) runs the relay with the fuzz tests' small
limits (:data:`tests.fuzz.rules.TEST_LIMITS`), so that breaches are cheap;
``--limits default`` runs it with its defaults (breaches of them are large:
100,000 names and more).

Usage: ``python -m benchmarks.fuzz [--examples 5000] [--seed 0] [--mix any]
[--limits small|default] [--replay JSON]``
Writes a table to stdout, JSON to ``benchmarks/results/fuzz.json`` and the
broken examples to ``benchmarks/results/fuzz-broken.jsonl``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import re
import sys
import tempfile
import time
import urllib.request
from collections import Counter
from collections.abc import AsyncIterator
from datetime import datetime
from pathlib import Path
from typing import IO, Any

import grpc
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import seed as hypothesis_seed

from benchmarks.processes import RelayProcess, relay_process
from tests.fuzz.driver import FuzzRig, LoopThread, Watcher, fuzz_origin
from tests.fuzz.rules import TEST_LIMITS, Limits
from tests.fuzz.strategies import ADS_DELTA, Case, cases

RESULTS = Path(__file__).parent / "results"


def memory(pid: int) -> tuple[int, int]:
    """A process's resident set size now and at its peak, in bytes."""
    fields = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, value = line.partition(":")
        fields[key] = value.strip()
    return (int(fields["VmRSS"].split()[0]) * 1024, int(fields["VmHWM"].split()[0]) * 1024)


@contextlib.asynccontextmanager
async def fuzzed_relay(origin_port: int, limits: str, stderr: IO[bytes]
                       ) -> AsyncIterator[RelayProcess]:
    """A relay process following the origin; ``limits``: the ``limits`` keys
    (YAML flow; empty: the relay's defaults)."""
    async with relay_process("fuzz-relay", origin_port, 1.0, log_level="error", stderr=stderr,
                             sections=f"limits: {{{limits}}}" if limits else "") as relay:
        yield relay


def clients(relay: RelayProcess) -> list[dict[str, Any]]:
    with urllib.request.urlopen(f"http://127.0.0.1:{relay.admin_port}/clients",
                                timeout=5) as reply:
        listed: list[dict[str, Any]] = json.loads(reply.read())["clients"]
        return listed


def rule_of(violation: str) -> str:
    """A violation's rule, without the example's particulars."""
    kind = re.search(r"\(request \d+: ([^:]+):|\(([^:()]+):", violation)
    head = re.split(r"['\"(\[]", violation, maxsplit=1)[0]
    head = re.sub(r"\d+", "N", head).strip()
    if kind:
        head += f" [{kind.group(1) or kind.group(2)}]"
    return head


def mib(size: int) -> str:
    return f"{size / 2**20:.1f} MiB"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--examples", type=int, default=5000)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--mix", choices=("any", "valid", "invalid", "undecodable"),
                        default="any")
    parser.add_argument("--limits", choices=("small", "default"), default="small")
    parser.add_argument("--warmup", type=int, default=200,
                        help="examples after which the relay's RSS is taken as the base")
    parser.add_argument("--replay", help="a broken example's JSON: run it once and show it")
    args = parser.parse_args()

    if args.limits == "small":
        limits, flow = TEST_LIMITS.configured()
    else:
        limits, flow = Limits.defaults(), ""
    loop = LoopThread()
    stack = contextlib.AsyncExitStack()

    async def start(log: IO[bytes]) -> tuple[RelayProcess, FuzzRig]:
        origin = await fuzz_origin().start()
        stack.push_async_callback(origin.stop)
        relay = await stack.enter_async_context(fuzzed_relay(origin.port, flow, log))
        channel = grpc.aio.insecure_channel(relay.target)
        stack.push_async_callback(channel.close)
        rig = FuzzRig(origin, channel, limits)
        stack.callback(rig.close)
        await rig.start_watchers()
        return relay, rig

    with tempfile.TemporaryFile() as log:
        relay, rig = loop.run(start(log))
        try:
            if args.replay:
                replay(loop, rig, Case.from_json(args.replay))
            else:
                run(args, loop, relay, rig, log)
        finally:
            loop.run(stack.aclose())
            loop.close()


def replay(loop: LoopThread, rig: FuzzRig, case: Case) -> None:
    print(repr(case))
    outcome, broken = loop.run(rig.example(case))
    print(f"ended {outcome.code.name if outcome.code else 'never'} {outcome.details!r} "
          f"after {outcome.sent} requests")
    for judgement in outcome.judgements:
        print(f"  {judgement.verdict:7} {'; '.join(r.what for r in judgement.reasons)}")
    print("broken:" if broken else "no rule broken", *broken, sep="\n  ")


def run(args: argparse.Namespace, loop: LoopThread, relay: RelayProcess, rig: FuzzRig,
        log: IO[bytes]) -> None:
    pid = relay.process.pid
    rss_start, _ = memory(pid)
    rss_warm = rss_start
    baseline_upstream = {t: set(n) for t, n in rig.origin.stream.subscribed.items() if n}
    started = time.monotonic()

    @settings(max_examples=args.examples, deadline=None, database=None,
              phases=(Phase.generate,), suppress_health_check=list(HealthCheck),
              print_blob=False)
    @hypothesis_seed(args.seed)
    @given(case=cases(rig.limits, args.mix))
    def example(case: Case) -> None:
        nonlocal rss_warm
        loop.run(rig.example(case), timeout=120)
        done = rig.tally.examples
        if done == args.warmup:
            rss_warm, _ = memory(pid)
        if done % 500 == 0:
            print(f"  {done} examples, {time.monotonic() - started:.0f}s, "
                  f"relay RSS {mib(memory(pid)[0])}, {len(rig.tally.broken)} broke a rule",
                  file=sys.stderr)

    example()
    elapsed = time.monotonic() - started

    # Settled: the relay lists the watchers only, follows the origin for them
    # only, and serves a new client.
    async def settle() -> tuple[int, bool, list[str]]:
        deadline = time.monotonic() + 10
        while True:
            listed = await asyncio.to_thread(clients, relay)
            upstream = {t: set(n) for t, n in rig.origin.stream.subscribed.items() if n}
            if (len(listed) == len(rig.watchers) and upstream == baseline_upstream) or \
                    time.monotonic() > deadline:
                break
            await asyncio.sleep(0.1)
        newcomer = Watcher(rig.channel, ADS_DELTA, 99)
        await newcomer.start()
        for _ in range(500):
            if newcomer.seen:
                break
            await asyncio.sleep(0.01)
        served = newcomer.seen == [rig.version]
        newcomer.close()
        left = [f"{t}: {sorted(n - baseline_upstream.get(t, set()))[:5]}"
                for t, n in upstream.items() if n != baseline_upstream.get(t)]
        return len(listed), served, left

    listed, served, upstream_left = loop.run(settle())
    rss_end, rss_peak = memory(pid)
    log.seek(0)
    errors = [line for line in log.read().decode(errors="replace").splitlines()
              if "ERROR" in line or "Traceback" in line]
    tally = rig.tally
    rules = Counter(rule_of(v) for _, broken in tally.broken for v in broken)

    print(f"fuzz: {tally.examples} examples in {elapsed:.0f}s (seed {args.seed}, "
          f"mix {args.mix}, limits {args.limits})")
    print("\nstreams ended (protocol, requests were, status):")
    for key, count in sorted(tally.statuses.items()):
        print(f"  {key:40} {count:6}")
    print("\nrequests generated, by kind:")
    for kind, count in tally.kinds.most_common():
        print(f"  {kind:28} {count:6}")
    print(f"\nstatuses lost to gRPC's race (INTERNAL 'Internal error from Core' after the "
          f"client wrote past a refused request; tolerated): {tally.lost_statuses}")
    print(f"watcher updates: {tally.watcher_updates} expected, {tally.watcher_missed} missed, "
          f"{tally.watcher_extra} repeated")
    print(f"relay RSS: {mib(rss_start)} at start, {mib(rss_warm)} after {args.warmup} "
          f"examples, {mib(rss_end)} at the end (peak {mib(rss_peak)})")
    print(f"after the run: {listed} clients listed ({len(rig.watchers)} watchers), "
          f"new client served: {served}, origin subscription "
          f"{'back to the watchers' if not upstream_left else f'kept {upstream_left}'}")
    print(f"relay log: {len(errors)} error lines" + "".join(f"\n  {e[:200]}"
                                                             for e in errors[:5]))
    print(f"\nexamples that broke a rule: {len(tally.broken)}")
    for rule, count in rules.most_common():
        print(f"  {count:6}  {rule}")
    RESULTS.mkdir(exist_ok=True)
    with open(RESULTS / "fuzz-broken.jsonl", "w") as out:
        for case, broken in tally.broken:
            out.write(json.dumps({"broken": broken, "case": case.to_json()}) + "\n")
    shown: set[str] = set()
    for case, broken in tally.broken:
        rule = rule_of(broken[0])
        if rule in shown:
            continue
        shown.add(rule)
        print(f"\n{rule}:\n  {broken[0][:400]}\n  {case!r}".replace("\n", "\n  "))
        print(f"  replay: python -m benchmarks.fuzz --replay '{case.to_json()[:1500]}'"
              if len(case.to_json()) <= 1500 else
              "  replay: see benchmarks/results/fuzz-broken.jsonl")
    (RESULTS / "fuzz.json").write_text(json.dumps({
        "when": datetime.now().isoformat(timespec="seconds"), "examples": tally.examples,
        "seconds": round(elapsed, 1), "seed": args.seed, "mix": args.mix,
        "limits": args.limits, "statuses": dict(tally.statuses), "kinds": dict(tally.kinds),
        "watcher_updates": tally.watcher_updates, "watcher_missed": tally.watcher_missed,
        "watcher_repeated": tally.watcher_extra, "lost_statuses": tally.lost_statuses,
        "rss_start": rss_start, "rss_warm": rss_warm,
        "rss_end": rss_end, "rss_peak": rss_peak, "clients_after": listed,
        "new_client_served": served, "upstream_left": upstream_left,
        "log_errors": len(errors), "broken": len(tally.broken), "rules": dict(rules),
    }, indent=2) + "\n")


if __name__ == "__main__":
    main()
