"""Per-stream xDS protocol state: plain objects that consume requests and
cache changes and say what to send. No I/O happens here."""
