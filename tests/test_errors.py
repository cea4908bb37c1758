"""One root for the relay's own exceptions: every exception class defined in
``relay/`` derives from :class:`relay.errors.RelayError`, and the classes that
callers catch as a builtin (``ValueError``) still are one."""

from __future__ import annotations

import ast
import builtins
import importlib
import inspect
import pkgutil
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import pytest

import relay
from relay.errors import RelayError

PACKAGE = Path(relay.__file__).resolve().parent

# ``python -m relay`` runs the CLI when imported
NOT_IMPORTED = {"relay.__main__"}

BUILTIN_EXCEPTIONS = {
    name for name, value in vars(builtins).items()
    if inspect.isclass(value) and issubclass(value, BaseException)
}


def relay_modules() -> Iterator[ModuleType]:
    """Every module of the ``relay`` package, imported."""
    yield relay
    for info in pkgutil.walk_packages(relay.__path__, "relay."):
        if info.name not in NOT_IMPORTED:
            yield importlib.import_module(info.name)


def classes_in(namespace: object, module: str) -> Iterator[type]:
    """The classes defined in ``module`` reachable from ``namespace``, nested ones too."""
    for value in vars(namespace).values():
        if inspect.isclass(value) and value.__module__ == module:
            yield value
            if value is not namespace:
                yield from classes_in(value, module)


def relay_exceptions() -> list[type[BaseException]]:
    found: dict[str, type[BaseException]] = {}
    for module in relay_modules():
        for cls in classes_in(module, module.__name__):
            if issubclass(cls, BaseException):
                found[f"{cls.__module__}.{cls.__qualname__}"] = cls
    return [found[name] for name in sorted(found)]


def test_the_walk_finds_the_relays_exceptions() -> None:
    """A walk that found nothing would pass the test below vacuously."""
    names = {f"{cls.__module__}.{cls.__qualname__}" for cls in relay_exceptions()}
    assert {"relay.errors.RelayError", "relay.config.errors.ConfigError",
            "relay.protocol.outcome.ProtocolError", "relay.constraints._Malformed",
            "relay.upstream.responses.UnusableResponse"} <= names


@pytest.mark.parametrize("cls", relay_exceptions(), ids=lambda cls: cls.__qualname__)
def test_every_relay_exception_derives_from_relay_error(cls: type[BaseException]) -> None:
    assert issubclass(cls, RelayError), f"{cls.__module__}.{cls.__qualname__}"


def test_no_class_in_relay_derives_from_a_builtin_exception_alone() -> None:
    """Also the classes the import walk cannot see (defined inside a function)."""
    strays = []
    for path in sorted(PACKAGE.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if not isinstance(node, ast.ClassDef):
                continue
            bases = {base.id for base in node.bases if isinstance(base, ast.Name)}
            if bases & BUILTIN_EXCEPTIONS and "RelayError" not in bases \
                    and node.name != "RelayError":
                strays.append(f"{path.relative_to(PACKAGE.parent)}:{node.lineno} {node.name}")
    assert strays == []


@pytest.mark.parametrize("name", [
    "relay.admin.BadQuery",
    "relay.certificates.CertificateError",
    "relay.constraints.InvalidConstraints",
    "relay.persistence.entries.CorruptEntry",
    "relay.server.rest.BadRequest",
    "relay.server.rest.Unrenderable",
    "relay.server.status.UnsupportedMatcher",
])
def test_value_errors_stay_value_errors(name: str) -> None:
    """Callers catch these as ``ValueError``; the new root must not change that."""
    module, _, qualname = name.rpartition(".")
    cls = getattr(importlib.import_module(module), qualname)
    assert issubclass(cls, ValueError) and issubclass(cls, RelayError)
