"""Model specs, loading from every source, the embedded offline default and tokenizer fingerprints."""
