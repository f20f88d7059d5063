"""Pure tensor functions of one speculative round: sampling, accept rule, n-gram proposer."""
