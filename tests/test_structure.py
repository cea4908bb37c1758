"""The shape of the code: no function in ``relay/`` runs over 60 lines.

A function that long holds several ideas; split it into helpers that each
hold one. Length is counted from the ``def`` line to the function's last
line (docstring and comments included, decorators not), as ``ast`` sees it.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import relay

PACKAGE = Path(relay.__file__).resolve().parent
MAX_LINES = 60

# Functions over MAX_LINES that are being split in their own change; each
# entry goes once its function is under the limit (the last test says when).
ALLOWED: set[str] = set()


def functions(tree: ast.AST, prefix: str = "") -> Iterator[tuple[str, int]]:
    """Every function under ``tree`` by qualified name, with its length in lines."""
    for node in ast.iter_child_nodes(tree):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            name = prefix + node.name
            assert node.end_lineno is not None
            yield name, node.end_lineno - node.lineno + 1
            yield from functions(node, f"{name}.<locals>.")
        elif isinstance(node, ast.ClassDef):
            yield from functions(node, f"{prefix}{node.name}.")
        else:
            yield from functions(node, prefix)


def function_lengths() -> dict[str, int]:
    """``"relay/module.py: Qualified.name"`` -> lines, for every function in ``relay/``."""
    lengths: dict[str, int] = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        module = path.relative_to(PACKAGE.parent).as_posix()
        for name, lines in functions(ast.parse(path.read_text(), str(path))):
            lengths[f"{module}: {name}"] = lines
    return lengths


def test_the_measure_counts_a_function_from_def_to_its_last_line() -> None:
    source = "class A:\n    def f(self):\n        x = 1\n\n        return x\n\ndef g(): pass\n"
    assert dict(functions(ast.parse(source))) == {"A.f": 4, "g": 1}


def test_the_walk_sees_the_relays_functions() -> None:
    lengths = function_lengths()
    assert "relay/server/status.py: type_sync" in lengths
    assert "relay/telemetry.py: Metrics.__init__" in lengths


def test_no_function_over_60_lines() -> None:
    long = {name: lines for name, lines in function_lengths().items()
            if lines > MAX_LINES and name not in ALLOWED}
    assert long == {}


def test_every_allowed_function_is_still_long() -> None:
    """An entry whose function was split (or renamed) leaves ALLOWED."""
    lengths = function_lengths()
    stale = sorted(name for name in ALLOWED if lengths.get(name, 0) <= MAX_LINES)
    assert stale == []


# The layers that will hold one object per origin (issue 24): a class there
# with more public methods than this holds more than one idea.
MAX_PUBLIC_METHODS = 15


def public_methods(cls: ast.ClassDef) -> list[str]:
    """A class's public methods: not properties, not alternate constructors."""
    kept = []
    for node in cls.body:
        if not isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            continue
        decorators = {ast.unparse(d) for d in node.decorator_list}
        if node.name.startswith("_") or decorators & {"property", "classmethod"}:
            continue
        kept.append(node.name)
    return kept


def test_no_class_in_upstream_or_server_over_15_public_methods() -> None:
    wide = {}
    for folder in ("upstream", "server"):
        for path in sorted((PACKAGE / folder).glob("*.py")):
            for node in ast.walk(ast.parse(path.read_text())):
                if isinstance(node, ast.ClassDef):
                    methods = public_methods(node)
                    if len(methods) > MAX_PUBLIC_METHODS:
                        wide[f"relay/{folder}/{path.name}: {node.name}"] = len(methods)
    assert wide == {}


def test_public_methods_leave_out_properties_and_constructors() -> None:
    tree = ast.parse("class C:\n"
                     "    @property\n    def p(self): ...\n"
                     "    @classmethod\n    def create(cls): ...\n"
                     "    def _private(self): ...\n"
                     "    def public(self): ...\n"
                     "    async def also(self): ...\n")
    [cls] = [n for n in ast.walk(tree) if isinstance(n, ast.ClassDef)]
    assert public_methods(cls) == ["public", "also"]
