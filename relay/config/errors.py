"""The config's error: where (file, line, dotted field) and what, one per line."""

from __future__ import annotations

from collections.abc import Sequence

from relay.errors import RelayError

__all__ = ["ConfigError", "format_error"]


def format_error(file: str, line: int | None, field: str, problem: str) -> str:
    """``file:line: field: problem``, leaving out the parts that are absent."""
    where = f"{file}:{line}" if line is not None else file
    parts = [part for part in (where, field, problem) if part]
    return ": ".join(parts)


class ConfigError(RelayError):
    """An invalid or unreadable config.

    ``file``, ``line`` (1-based, ``None`` when unknown), ``field`` (dotted path
    such as ``upstream.address``, ``""`` for whole-document problems) and
    ``problem`` describe the first error; ``errors`` holds every error found
    (``[self]`` when there is only one). ``str()`` shows all of them, one per
    line, as ``file:line: field: problem``.
    """

    file: str
    line: int | None
    field: str
    problem: str
    errors: list[ConfigError]

    def __init__(
        self,
        file: str,
        line: int | None,
        field: str,
        problem: str,
        *,
        errors: Sequence[ConfigError] | None = None,
    ) -> None:
        self.file = file
        self.line = line
        self.field = field
        self.problem = problem
        self.errors = list(errors) if errors else [self]
        super().__init__(str(self))

    def __str__(self) -> str:
        if self.errors == [self]:
            return format_error(self.file, self.line, self.field, self.problem)
        return "\n".join(str(error) for error in self.errors)

    @classmethod
    def collect(cls, errors: Sequence[ConfigError]) -> ConfigError:
        """One error standing for ``errors`` (sorted by line): the first one's
        attributes, with all of them in ``errors`` and ``str()``."""
        ordered = sorted(errors, key=lambda e: (e.line is None, e.line or 0, e.field))
        if len(ordered) == 1:
            return ordered[0]
        first = ordered[0]
        return cls(first.file, first.line, first.field, first.problem, errors=ordered)
