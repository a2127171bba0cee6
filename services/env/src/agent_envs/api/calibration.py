"""The trivial app of ``bench-http --calibrate``: the web stack's floor, with no environment behind it.

``agent-envs serve --app-factory agent_envs.api.calibration:create_app`` runs it with exactly the server
settings of the real service (uvicorn options, workers, logging) behind the same nginx template, so the
difference between the two is what the service itself costs. ``POST /v1/step`` parses the same request body
(a pydantic model of the two strings) and answers a fixed observation with the request's state echoed back,
so the response is about as large as a real step's; ``/readyz`` and ``/healthz`` answer as the service's do.
"""

from __future__ import annotations

import orjson
from fastapi import FastAPI
from pydantic import BaseModel
from starlette.responses import Response

OBSERVATION = "WebShop [SEP] Instruction: [SEP] calibration [SEP] " + " [SEP] ".join(
    f"B0{i:08d} [SEP] A product title of a typical length, with a few words [SEP] $19.99" for i in range(10)
)
CLICKABLES = ["back to search", "next >"] + [f"b0{i:08d}" for i in range(10)]


class StepRequest(BaseModel):
    state: str
    action: str


def create_app() -> FastAPI:
    """The calibration app (a factory, as uvicorn's ``factory=True`` expects)."""
    app = FastAPI(title="WebShop calibration endpoint")

    @app.post("/v1/step")
    async def step(body: StepRequest) -> Response:
        payload = {
            "observation": OBSERVATION,
            "reward": 0.0,
            "done": False,
            "available_actions": {"has_search_bar": False, "clickables": CLICKABLES},
            "state": body.state,
            "info": {"valid": True, "steps": 1, "truncated": False},
        }
        return Response(orjson.dumps(payload), media_type="application/json")

    @app.get("/healthz")
    @app.get("/readyz")
    async def ready() -> Response:
        return Response(b'{"status":"ok"}', media_type="application/json")

    return app
