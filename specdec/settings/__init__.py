"""Typed, range-checked settings of every service, read from the environment (pydantic-settings).

Callers import them from :mod:`specdec.config`; the table of variables is docs/configuration.md, written by
``python -m specdec.settings.docs`` from these models.
"""
