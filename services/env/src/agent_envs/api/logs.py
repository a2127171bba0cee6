"""Structured logs: one JSON object per line on stderr (or plain text), including uvicorn's own messages.

Access lines (logger ``agent_envs.access``) carry ``method``, ``path``, ``status`` and ``duration_ms``; never
bodies, query strings or tokens. Successful requests are sampled (one in ``AGENTRL_ACCESS_LOG_EVERY``, default
100, marked ``sampled``); errors and slow requests always get a line (see ``api.metrics``).
"""

from __future__ import annotations

import logging
import sys
import time
from typing import Any

import orjson

_MARK = "_webshop_handler"


class JsonFormatter(logging.Formatter):
    """``{"ts", "level", "logger", "msg", "pid", ...fields}``; ``fields`` come from ``extra={"fields": {...}}``."""

    def format(self, record: logging.LogRecord) -> str:
        data: dict[str, Any] = {
            "ts": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
            + f".{int(record.msecs):03d}Z",
            "level": record.levelname,
            "logger": record.name,
            "msg": record.getMessage(),
            "pid": record.process,
        }
        fields = getattr(record, "fields", None)
        if isinstance(fields, dict):
            data.update(fields)
        if record.exc_info:
            data["exc"] = self.formatException(record.exc_info)
        try:
            return orjson.dumps(data).decode()
        except TypeError:
            return orjson.dumps({k: str(v) for k, v in data.items()}).decode()


class TextFormatter(logging.Formatter):
    def __init__(self) -> None:
        super().__init__("%(asctime)s %(levelname)s %(name)s: %(message)s")

    def format(self, record: logging.LogRecord) -> str:
        line = super().format(record)
        fields = getattr(record, "fields", None)
        if isinstance(fields, dict):
            line += " " + " ".join(f"{k}={v}" for k, v in fields.items())
        return line


def configure_logging(level: str = "INFO", fmt: str = "json") -> None:
    """Install one stderr handler on the root logger (idempotent) and route uvicorn's loggers through it."""
    root = logging.getLogger()
    for handler in list(root.handlers):
        if getattr(handler, _MARK, False):
            root.removeHandler(handler)
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter() if fmt == "json" else TextFormatter())
    setattr(handler, _MARK, True)
    root.addHandler(handler)
    root.setLevel(level)
    for name in ("uvicorn", "uvicorn.error", "uvicorn.access"):
        logger = logging.getLogger(name)
        logger.handlers.clear()
        logger.propagate = True
    logging.getLogger("uvicorn.access").disabled = True  # our access lines replace uvicorn's
    logging.getLogger("httpx").setLevel(logging.WARNING)  # no line per outgoing request (client, tests)


access_log = logging.getLogger("agent_envs.access")
