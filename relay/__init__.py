"""xds-relay: a caching xDS relay."""

__version__ = "0.1.0"
