"""`specrt serve`: OpenAI-compatible HTTP over the engine (extra `serve`: FastAPI, uvicorn,
prometheus-client). The runtime core never imports this package."""
