"""Where resources come from when the relay is its own origin."""
