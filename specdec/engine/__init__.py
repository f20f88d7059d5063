"""Model-side engines: per-session KV caches and the draft/target computations."""
