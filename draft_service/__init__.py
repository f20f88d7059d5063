"""The draft service: a gRPC worker that proposes k tokens (model or n-gram draft)."""
