"""The /healthz watchdog must never end a replica that answers, even with an error status.

A replica under more load than ``--limit-concurrency`` allows answers new connections with 503 at once; that
is a busy replica, not a hung one, and the watchdog used to count those answers as misses and kill it (the
balancer then answered the load with fast 502s). Only a probe that gets no answer at all is a miss.
"""

from __future__ import annotations

import subprocess
import sys

BUSY_SCRIPT = """
import os, socket, sys, threading, time
from agent_envs.cli.serve import start_watchdog
listener = socket.socket(); listener.bind(("127.0.0.1", 0)); listener.listen(64)
port = listener.getsockname()[1]
answered = []
def serve():
    first = True
    while True:
        connection, _ = listener.accept()
        connection.recv(65536)
        status = b"200 OK" if first else b"503 Service Unavailable"  # ready once, then always over its limit
        first = False
        connection.sendall(b"HTTP/1.1 " + status + b"\\r\\ncontent-length: 2\\r\\nconnection: close\\r\\n\\r\\nno")
        connection.close()
        answered.append(status)
threading.Thread(target=serve, daemon=True).start()
os.environ["AGENTRL_WATCHDOG_FAILURES"] = "2"
start_watchdog("127.0.0.1", port, 0.2)
deadline = time.monotonic() + 30
while sum(1 for status in answered if status.startswith(b"503")) < 8 and time.monotonic() < deadline:
    time.sleep(0.1)
print("alive after", sum(1 for status in answered if status.startswith(b"503")), "answers of 503")
"""


def test_watchdog_keeps_a_replica_that_answers_503() -> None:
    result = subprocess.run([sys.executable, "-c", BUSY_SCRIPT], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, f"the watchdog ended a replica that answered 503: {result.stderr[-2000:]}"
    assert "alive after 8 answers of 503" in result.stdout, result.stdout + result.stderr[-2000:]
