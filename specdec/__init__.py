"""Distributed speculative decoding: draft and target models as separate services."""

import os

__version__ = "0.1.0"  # the installed distribution's version wins (specdec.cli.package_version)

# torch's CPU threads are a GNU OpenMP (libgomp) team, which reads GOMP_SPINCOUNT once, when torch loads: so it
# is set here, before any module of this package imports torch (a value in the environment wins). After each
# parallel region the team's idle threads spin that many times before they sleep. libgomp's default (300,000
# spins: about 1 ms on AMD EPYC, more where PAUSE is slow) keeps a core busy after every forward, and with as
# many torch threads as cores the orchestrator and the service's own event loop wait for it: on the 2-core
# machine a 2-thread round's overhead was 2.2 ms with the default and 1.4 ms with 20,000, forwards within noise
# (docs/performance.md, "Where the per-round overhead goes").
os.environ.setdefault("GOMP_SPINCOUNT", "20000")
