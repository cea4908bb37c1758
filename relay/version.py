"""What this relay is: its version, and the versions it runs on, as
``xds-relay --version`` prints them and ``xds_relay_build_info`` labels them."""

from __future__ import annotations

import platform
from importlib import metadata

__all__ = ["build_info", "package_version"]

#: The distribution whose metadata (pyproject.toml's ``version``) is the relay's version.
DISTRIBUTION = "xds-relay"


def package_version(distribution: str = DISTRIBUTION) -> str:
    """The installed version of ``distribution``; ``unknown`` when it is not
    installed (the package imported from a source tree that was never
    ``pip install``-ed)."""
    try:
        return metadata.version(distribution)
    except metadata.PackageNotFoundError:
        return "unknown"


def build_info() -> dict[str, str]:
    """The labels of ``xds_relay_build_info``: the relay's version, Python's
    and grpcio's (the one library whose version changes how clients are served)."""
    return {"version": package_version(), "python": platform.python_version(),
            "grpc": package_version("grpcio")}
