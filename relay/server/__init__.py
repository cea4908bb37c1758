"""Downstream gRPC servers: ADS, the per-type discovery services, and their streams."""
