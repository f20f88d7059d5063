"""Orchestrator service: tokenizes, keeps sessions in Redis, drives speculative rounds and streams text."""
