"""Distributed speculative decoding: draft and target models as separate services."""

__version__ = "0.1.0"  # the installed distribution's version wins (specdec.cli.package_version)
