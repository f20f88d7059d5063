"""OpenAI-compatible HTTP front end: its own small aiohttp service that calls the orchestrator over gRPC."""
