"""Server scaffolding shared by the draft, target and orchestrator services."""
