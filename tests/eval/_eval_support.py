"""Helpers of the eval tests (imported as ``_eval_support``; conftest puts this folder on sys.path).

``ScriptedChatServer`` is a small OpenAI-compatible chat endpoint (``POST /v1/chat/completions``) that plays a
scripted policy: it finds the goal's instruction in the first user message, looks up the expert plan for it
and answers turn ``k`` with the plan's action ``k``, wrapped in free text the way LLMs write it. Knobs:

- ``fail_next``: HTTP statuses to answer the next requests with (then normal service) to exercise retries;
- ``always_fail``: answer every request with this status (a dead endpoint);
- ``garbage_first_turn``: the first reply of these instructions names no action (an unparseable output).

Every request body is kept in ``requests`` for assertions on the exact messages.
"""

from __future__ import annotations

import json
import re
import struct
import threading
import zlib
from collections.abc import Mapping
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
SECRET = "eval-tests-state-secret-0123456789"
SAMPLES = 60  # synthetic test goals 0..59 of the generated catalog: the expert buys 59 of them exactly
_INSTRUCTION = re.compile(r"^Instruction: (.*)$", re.MULTILINE)


class ScriptedChatServer:
    """An OpenAI-compatible chat server on a free loopback port, in a background thread."""

    def __init__(self, plans: Mapping[str, list[str]]) -> None:
        self.plans = dict(plans)
        self.fail_next: list[int] = []
        self.always_fail: int | None = None
        self.garbage_first_turn: set[str] = set()
        self.requests: list[dict[str, Any]] = []
        self.statuses: list[int] = []
        self._lock = threading.Lock()
        server = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: Any) -> None:  # keep test output clean
                pass

            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))) or b"{}")
                status, payload = server.answer(self.path, body)
                data = json.dumps(payload).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        self._httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._httpd.daemon_threads = True
        self.port = self._httpd.server_address[1]
        self.base_url = f"http://127.0.0.1:{self.port}/v1"
        self._thread = threading.Thread(target=self._httpd.serve_forever, daemon=True)
        self._thread.start()

    def close(self) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()

    def reset(self) -> None:
        with self._lock:
            self.fail_next.clear()
            self.always_fail = None
            self.garbage_first_turn.clear()
            self.requests.clear()
            self.statuses.clear()

    def answer(self, path: str, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        with self._lock:
            self.requests.append(body)
            if path != "/v1/chat/completions":
                status, payload = 404, {"error": {"message": f"no route {path}"}}
            elif self.always_fail is not None:
                status, payload = self.always_fail, {"error": {"message": "scripted outage"}}
            elif self.fail_next:
                status, payload = self.fail_next.pop(0), {"error": {"message": "scripted transient failure"}}
            else:
                status, payload = 200, self._completion(body)
            self.statuses.append(status)
            return status, payload

    def _completion(self, body: dict[str, Any]) -> dict[str, Any]:
        messages = body["messages"]
        first_user = next(m["content"] for m in messages if m["role"] == "user")
        match = _INSTRUCTION.search(first_user)
        instruction = match.group(1) if match else ""
        replies = [m["content"] for m in messages if m["role"] == "assistant"]
        plan = self.plans.get(instruction, [])
        if instruction in self.garbage_first_turn and not replies:
            text = "Hmm, I am not sure what to do here."
        else:
            done = sum(1 for r in replies if "Action:" in r)
            action = plan[done] if done < len(plan) else "click[buy now]"
            text = f"The page shows what I need, so I act.\n**Action:** {action}"
        return {
            "id": "chatcmpl-test",
            "object": "chat.completion",
            "model": body.get("model", "scripted"),
            "choices": [
                {"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "stop"}
            ],
            "usage": {
                "prompt_tokens": 10 * len(messages),
                "completion_tokens": 12,
                "total_tokens": 10 * len(messages) + 12,
            },
        }


def png_is_blank(path: Path) -> bool:
    """Whether a PNG is (nearly) one flat colour, without an imaging library.

    The decompressed scanlines of a flat image hold a handful of byte values (the colour and the filter
    bytes); a page with text and charts holds hundreds.
    """
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n", f"{path} is not a PNG"
    position, chunks = 8, []
    while position < len(data):
        length = struct.unpack(">I", data[position : position + 4])[0]
        kind = data[position + 4 : position + 8]
        if kind == b"IDAT":
            chunks.append(data[position + 8 : position + 8 + length])
        position += 12 + length
    raw = zlib.decompress(b"".join(chunks))
    return len(set(raw)) < 16
