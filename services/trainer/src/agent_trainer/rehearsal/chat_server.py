"""An OpenAI-compatible chat endpoint on CPU for a Hugging Face model directory: what ``agent-train eval
--policy checkpoint --server cpu`` serves instead of sglang, so the rehearsal evaluates the merged checkpoint
through eval's own path (the checkpoint policy, its chat requests, the runner, the report).

    python -m agent_trainer.rehearsal.chat_server --model DIR --port P [--served-model-name NAME]

``GET /health``, ``GET /v1/models``, ``POST /v1/chat/completions`` (messages rendered with the model's chat
template; temperature, top_p, max_tokens, seed); one request at a time. Generation is :mod:`.generation`'s,
as in the rehearsal's rollout servers.
"""

from __future__ import annotations

import argparse
import threading
import time
import uuid
from collections.abc import Mapping, Sequence
from typing import Any

import torch
import uvicorn
from fastapi import FastAPI, HTTPException
from pydantic import BaseModel

from .generation import generate_tokens


class ChatRequest(BaseModel):
    model: str | None = None
    messages: list[dict[str, Any]]
    temperature: float = 1.0
    top_p: float = 1.0
    max_tokens: int = 256
    n: int = 1
    seed: int | None = None


def create_app(model_dir: str, served_model_name: str = "checkpoint") -> FastAPI:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    torch.set_num_threads(1)
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32, attn_implementation="sdpa")
    model.eval()
    context = int(getattr(model.config, "max_position_embeddings", 32768))
    lock = threading.Lock()
    app = FastAPI(title="webshop rehearsal chat server")

    @app.get("/health")
    def health() -> dict[str, str]:
        return {"status": "ok"}

    @app.get("/v1/models")
    def models() -> dict[str, Any]:
        return {"object": "list", "data": [{"id": served_model_name, "object": "model"}]}

    @app.post("/v1/chat/completions")
    def chat(request: ChatRequest) -> dict[str, Any]:
        rendered = tokenizer.apply_chat_template(request.messages, tokenize=True, add_generation_prompt=True)
        prompt = list(rendered["input_ids"] if isinstance(rendered, Mapping) else rendered)
        if len(prompt) >= context:
            raise HTTPException(
                400, f"maximum context length is {context} tokens; the messages have {len(prompt)}"
            )
        generator = torch.Generator().manual_seed(request.seed or 0)
        with lock:
            tokens, _, finished = generate_tokens(model, prompt, min(request.max_tokens, context - len(prompt)),
                                                  temperature=request.temperature, top_k=-1, top_p=request.top_p,
                                                  generator=generator, eos_ids={tokenizer.eos_token_id})  # fmt: skip
        text = tokenizer.decode(tokens, skip_special_tokens=True)
        return {"id": f"chatcmpl-{uuid.uuid4().hex}", "object": "chat.completion", "created": int(time.time()),
                "model": served_model_name,
                "choices": [{"index": 0, "message": {"role": "assistant", "content": text},
                             "finish_reason": "stop" if finished else "length"}],
                "usage": {"prompt_tokens": len(prompt), "completion_tokens": len(tokens),
                          "total_tokens": len(prompt) + len(tokens)}}  # fmt: skip

    return app


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description="OpenAI-compatible chat completions on CPU (rehearsal, eval)"
    )
    parser.add_argument("--model", required=True, help="a Hugging Face model directory")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--served-model-name", default="checkpoint")
    args = parser.parse_args(argv)
    uvicorn.run(
        create_app(args.model, args.served_model_name), host=args.host, port=args.port, log_level="warning"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
