"""The HTTP service: FastAPI app (native stateless protocol + AgentGym-compatible endpoints), settings, metrics.

Start it with ``webshop-env serve`` or ``uvicorn --factory webshop_env.api.app:create_app``.
"""
