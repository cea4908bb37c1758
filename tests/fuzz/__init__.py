"""Fuzzing a running relay with Hypothesis-generated xDS requests.

:mod:`~tests.fuzz.strategies` generates what clients send (both protocols,
ADS and the per-type services, valid and not), :mod:`~tests.fuzz.rules` says
how the relay must answer each request, :mod:`~tests.fuzz.driver` sends them
to a relay while well-behaved watchers follow the origin's updates. Used by
``tests/fuzz/test_fuzz.py`` (a bounded run in ``make test``) and
``benchmarks/fuzz.py`` (a long one, against a relay process).
"""
