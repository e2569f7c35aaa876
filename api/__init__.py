"""HTTP API (FastAPI). Not built yet: see issue 3."""
