"""Distributed speculative decoding: draft and target models as separate services."""
