"""The HTTP service: FastAPI app (native stateless protocol + AgentGym-compatible endpoints), settings, metrics.

Start it with ``agent-envs serve`` or ``uvicorn --factory agent_envs.api.app:create_app``.
"""
