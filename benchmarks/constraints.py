"""Constraint evaluation benchmark: cold versus memoized matching, and variant selection.

A resource with three variants (canary, prod-or-staging, and a default for
clients that send no ``env``), a fleet of subscribers falling into 30
parameter groups, each subscriber's ``Params`` built by ``params_of`` from
its own dict (as every stream does from its locators).
Measured, as evaluations (one ``matches`` call) per second:

* ``cold compile+match``: compile a message never seen (or no longer alive)
  and evaluate it once against new parameters: an origin update's cost;
* ``cold match``: evaluate compiled constraints against parameters not in
  the memo (memo cleared between repeats): a new client's cost;
* ``memoized match``: 3 variants x every subscriber, memo warm: the
  per-subscriber cost of a fan-out (``Params`` from ``params_of``, which
  shares one object per distinct parameter set);
* ``memoized match, unshared``: the same with every subscriber holding its
  own equal frozenset, so each memo hit compares sets element by element;
* ``select_variant``: one selection among the 3 variants per subscriber,
  memo warm (reported per selection; each is 3 evaluations);
* ``proto walk (no compile)``: for scale, a direct recursive evaluation
  over the protobuf message, what a relay without compilation would do.

Each row is the median of several repeats timed with ``time.perf_counter``
(garbage collection off while timing, as ``timeit`` does).

Usage: ``python -m benchmarks.constraints [--subscribers 10000] [--repeats 7]``
Writes a table to stdout and JSON to ``benchmarks/results/constraints.json``.
"""

from __future__ import annotations

import argparse
import gc
import json
import platform
import statistics
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from envoy.service.discovery.v3 import discovery_pb2

from relay.constraints import (
    Constraints,
    Params,
    compile_constraints,
    params_of,
    select_variant,
)

D = discovery_pb2.DynamicParameterConstraints
Single = D.SingleConstraint
List = D.ConstraintList

GROUPS = 30
ENVS = ["canary", "prod", "staging", "dev", None]  # None: the client sends no env
REGIONS = ["us-east", "us-west", "eu-west", "ap-south", None, "sa-east"]


def eq(key: str, value: str) -> Any:
    return D(constraint=Single(key=key, value=value))


def exists(key: str) -> Any:
    return D(constraint=Single(key=key, exists=Single.Exists()))


def variant_messages(tag: str = "") -> list[Any]:
    """Three mutually exclusive variants; ``tag`` makes a distinct (uncached) set."""
    return [
        D(and_constraints=List(constraints=[eq("env", "canary" + tag), exists("region")])),
        D(or_constraints=List(constraints=[eq("env", "prod" + tag), eq("env", "staging" + tag)])),
        D(not_constraints=exists("env" + tag)),
    ]


def group_params(group: int) -> dict[str, str]:
    """The parameters of one of the 30 groups: env x region, plus a key nobody constrains."""
    params = {"build": str(group % 3)}
    env = ENVS[group % len(ENVS)]
    region = REGIONS[group // len(ENVS) % len(REGIONS)]
    if env is not None:
        params["env"] = env
    if region is not None:
        params["region"] = region
    return params


def reference(msg: Any, params: Mapping[str, str]) -> bool:
    """Direct evaluation over the protobuf message (the uncompiled baseline)."""
    kind = msg.WhichOneof("type")
    if kind is None:
        return True
    if kind == "constraint":
        single = msg.constraint
        key: str = single.key
        if single.WhichOneof("constraint_type") == "value":
            value: str = single.value
            return params.get(key) == value
        return key in params
    if kind == "and_constraints":
        return all(reference(c, params) for c in msg.and_constraints.constraints)
    if kind == "or_constraints":
        return any(reference(c, params) for c in msg.or_constraints.constraints)
    return not reference(msg.not_constraints, params)


def median_seconds(run: Callable[[], object], repeats: int,
                   setup: Callable[[], object] | None = None) -> float:
    """Median wall time of ``run`` over ``repeats``, ``setup`` untimed before each."""
    times = []
    for _ in range(repeats):
        if setup is not None:
            setup()
        gc.collect()
        gc.disable()
        try:
            start = time.perf_counter()
            run()
            times.append(time.perf_counter() - start)
        finally:
            gc.enable()
    return statistics.median(times)


def measure(subscribers: int, repeats: int) -> dict[str, Any]:
    variants = [compile_constraints(m) for m in variant_messages()]
    subscriber_params: list[Params] = [params_of(group_params(i % GROUPS))
                                       for i in range(subscribers)]
    rows: list[dict[str, Any]] = []

    def row(name: str, evaluations: int, seconds: float, unit: str = "evaluation") -> None:
        rows.append({"case": name, "operations": evaluations, "unit": unit,
                     "seconds": seconds, "per_second": evaluations / seconds,
                     "ns_per_op": seconds / evaluations * 1e9})

    # (a) cold compile + match: each message is new to the intern table (the
    # compiled object is dropped right away), each parameter set new to it.
    cold_msgs = [m for i in range(subscribers // 3 + 1) for m in variant_messages(f"-{i}")]
    cold_params = [params_of({**group_params(i % GROUPS), "client": str(i)})
                   for i in range(len(cold_msgs))]
    pairs = list(zip(cold_msgs, cold_params, strict=True))

    def compile_and_match() -> None:
        for msg, params in pairs:
            compile_constraints(msg).matches(params)

    row("cold compile+match", len(pairs), median_seconds(compile_and_match, repeats))

    # (a') cold match: compiled constraints, parameters the memo has not seen.
    fresh = [params_of({**group_params(i % GROUPS), "client": str(i)})
             for i in range(subscribers)]

    def clear_memos() -> None:
        for c in variants:
            c._memo.clear()  # private: the benchmark needs a cold memo each repeat

    def match_cold() -> None:
        for params in fresh:
            for c in variants:
                c.matches(params)

    row("cold match (memo miss)", len(fresh) * len(variants),
        median_seconds(match_cold, repeats, clear_memos))

    # (b) memoized: 3 variants x every subscriber, memo warm.
    def match_memoized() -> None:
        for params in subscriber_params:
            for c in variants:
                c.matches(params)

    match_memoized()  # warm the memo (30 groups)
    row("memoized match", subscribers * len(variants), median_seconds(match_memoized, repeats))

    # The same, but every subscriber holds its own equal frozenset (not the
    # object params_of shares): each hit then compares sets element by element.
    unshared = [frozenset(group_params(i % GROUPS).items()) for i in range(subscribers)]

    def match_memoized_unshared() -> None:
        for params in unshared:
            for c in variants:
                c.matches(params)

    match_memoized_unshared()
    row("memoized match, unshared", subscribers * len(variants),
        median_seconds(match_memoized_unshared, repeats))

    # (c) select_variant among the 3 variants, memo warm.
    candidates: list[tuple[Constraints, str]] = [
        (c, name) for c, name in zip(variants, ["canary", "prod", "default"], strict=True)]

    def select_all() -> None:
        for params in subscriber_params:
            select_variant(candidates, params)

    select_all()
    row("select_variant (3 variants)", subscribers, median_seconds(select_all, repeats),
        unit="selection")

    # For scale: walking the protobuf tree per evaluation, no compilation.
    raw = variant_messages()
    dicts = [dict(p) for p in subscriber_params]

    def walk_proto() -> None:
        for params in dicts:
            for msg in raw:
                reference(msg, params)

    row("proto walk (no compile)", subscribers * len(raw), median_seconds(walk_proto, repeats))

    by_case = {r["case"]: r["per_second"] for r in rows}
    ratios = {
        "memoized/cold_match": by_case["memoized match"] / by_case["cold match (memo miss)"],
        "memoized/cold_compile_match":
            by_case["memoized match"] / by_case["cold compile+match"],
        "memoized/proto_walk": by_case["memoized match"] / by_case["proto walk (no compile)"],
    }
    return {"subscribers": subscribers, "groups": GROUPS, "variants": len(variants),
            "repeats": repeats, "rows": rows, "ratios": ratios}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--subscribers", type=int, default=10_000)
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results/constraints.json"))
    args = parser.parse_args()
    result = measure(args.subscribers, args.repeats)
    cold = next(r for r in result["rows"] if r["case"] == "cold match (memo miss)")
    print(f"{args.subscribers} subscribers in {GROUPS} parameter groups, "
          f"{result['variants']} variants, median of {args.repeats} repeats "
          f"(Python {platform.python_version()})\n")
    print(f"{'case':<28} {'ops':>7} {'unit':<11} {'ops/s':>12} {'ns/op':>9} {'x cold match':>13}")
    for r in result["rows"]:
        print(f"{r['case']:<28} {r['operations']:>7} {r['unit']:<11} {r['per_second']:>12,.0f} "
              f"{r['ns_per_op']:>9.0f} {r['per_second'] / cold['per_second']:>13.1f}")
    print()
    for name, ratio in result["ratios"].items():
        print(f"{name}: {ratio:.1f}x")
    result["python"] = platform.python_version()
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
