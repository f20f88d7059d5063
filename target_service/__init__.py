"""The target service: a gRPC worker that verifies a whole draft in one forward pass."""
