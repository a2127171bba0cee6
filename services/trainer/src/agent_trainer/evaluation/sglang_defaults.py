"""The sglang settings verl's own rollout server uses, for eval's sglang server (``--policy checkpoint``), so that
a checkpoint is evaluated by the engine configured as in training.

verl 0.9.1 (``workers/rollout/sglang_rollout/async_sglang_server.py``) sets ``attention_backend`` when none is
given: ``aiter`` on ROCm, ``flashinfer`` on sglang >= 0.5.12 (FA3's CUDA-graph capture is broken there,
sglang#22800), else ``fa3``. Left to itself, sglang 0.5.12 picks FA3 on Hopper. verl 0.7.1 always sets ``fa3``
(sglang's own choice on Hopper with the 0.7 image's sglang 0.5.9), so only the 0.9 image's eval changes.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Sequence

_PROBE = (
    "import json, importlib.metadata as m\n"
    "try:\n    import torch; hip = torch.version.hip is not None\nexcept Exception:\n    hip = False\n"
    "print(json.dumps({'sglang': m.version('sglang'), 'hip': hip}))"
)


def verl_attention_backend(sglang_version: str, hip: bool) -> str | None:
    """verl 0.9.1's default ``attention_backend`` for this sglang (None: let sglang choose, as verl 0.7.1's fa3 is
    sglang 0.5.9's own choice on Hopper)."""
    from packaging.version import Version

    if hip:
        return "aiter"
    if Version(sglang_version) >= Version("0.5.12"):
        return "flashinfer"
    return None


def sglang_default_args(server_args: Sequence[str], python: str | None = None) -> list[str]:
    """``--attention-backend <verl's>`` unless ``server_args`` name one; [] when sglang cannot be asked."""
    if any(arg.split("=", 1)[0] == "--attention-backend" for arg in server_args):
        return []
    try:
        found = subprocess.run(
            [python or sys.executable, "-c", _PROBE], capture_output=True, text=True, timeout=300
        )
        probe = json.loads(found.stdout.strip().splitlines()[-1])
    except (OSError, subprocess.TimeoutExpired, ValueError, IndexError):
        return []
    backend = verl_attention_backend(probe["sglang"], bool(probe["hip"]))
    return ["--attention-backend", backend] if backend else []
