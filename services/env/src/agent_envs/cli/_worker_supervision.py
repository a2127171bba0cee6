"""uvicorn's worker process with a longer liveness-ping timeout (see ``serve.patient_worker_supervision``).

A module of its own: the worker's target is a method of this class, so the class must be importable by name in
the spawned worker (a class defined inside a function cannot be pickled).
"""

from __future__ import annotations

from uvicorn.supervisors.multiprocess import Process


class PatientProcess(Process):
    """uvicorn's ``Process`` whose ``is_alive`` waits ``ping_timeout_s`` for the worker's answer."""

    ping_timeout_s = 30.0

    def is_alive(self, timeout: float = 5) -> bool:
        return super().is_alive(max(timeout, self.ping_timeout_s))
