"""SciWorld: ScienceWorld's elementary-science tasks (AgentGym's ``agentenv-sciworld``, 4,639 task variations).

``make()`` builds the core (``core.SciWorldEnv``) over a pool of JVMs (``pool``, sized by ``SCIWORLD_*``
environment variables) running the PyPI package ``scienceworld`` 1.2.3's simulator; ``AGENTGYM_ROUTES`` is
AgentGym's server for it (``agentgym``). See docs/environments/sciworld.md.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from typing import Any

from .agentgym import AGENTGYM_ROUTES
from .core import ActionFailed, EpisodeTooLong, SciWorldEnv
from .games import GAME_COUNT, game, python_index
from .pool import JvmPool, Simulator, SimulatorsBusy, SimulatorUnavailable

#: The Java this project's SciWorld is checked on (its recorded episodes replay identically there); older ones are
#: refused at start, newer ones served as they are.
JAVA_MAJOR = 17
JAVA_HOW = (
    "ScienceWorld's simulator is a Java program (scienceworld's jar), checked on Java 17. Debian/Ubuntu: apt-get "
    "install openjdk-17-jre-headless; on a cluster: `module load` your site's Java 17 module (the Slurm job passes "
    "PATH and JAVA_HOME on), or unpack a JDK 17 (e.g. Eclipse Temurin's tarball) on a shared filesystem and set "
    "JAVA_HOME to it or put its bin/ first on PATH"
)


def java_version(java: str) -> tuple[int, str]:
    """``(major, the version line)`` of ``java -version`` (``1.8.0_x``: 8); ``RuntimeError`` when it says none."""
    out = subprocess.run([java, "-version"], capture_output=True, text=True, timeout=60)
    text = (out.stderr or out.stdout).strip()
    match = re.search(r'version "(\d+)(?:\.(\d+))?', text)
    if out.returncode != 0 or not match:
        raise RuntimeError(f"`{java} -version` did not say its version: {text[:200]!r}")
    major = int(match.group(1))
    if major == 1 and match.group(2):
        major = int(match.group(2))
    return major, text.splitlines()[0]


def check(settings: Any) -> list[str]:
    """What stops ``serve`` (and a Ray Serve replica, and the Slurm job's node check) before a worker starts: no
    ``java`` on ``PATH`` to run the simulator's jar (py4j starts ``java``), or one older than Java 17. Without this
    check the replica would come up and its pool keep trying, every SciWorld request answered 503 "retry shortly"
    for good."""
    java = shutil.which("java")
    if java is None:
        return [f"sciworld: no `java` on PATH. {JAVA_HOW}"]
    try:
        major, line = java_version(java)
    except (RuntimeError, OSError, subprocess.TimeoutExpired) as error:
        return [f"sciworld: {error}. {JAVA_HOW}"]
    if major < JAVA_MAJOR:
        return [f"sciworld: {java} is Java {major} ({line}), older than {JAVA_MAJOR}. {JAVA_HOW}"]
    return []


def make() -> SciWorldEnv:
    """The core with a pool sized from the environment; its spare JVMs start warming now, in the background."""
    env = SciWorldEnv(JvmPool.from_env())
    env.prewarm()
    return env


__all__ = [
    "AGENTGYM_ROUTES",
    "GAME_COUNT",
    "ActionFailed",
    "EpisodeTooLong",
    "JvmPool",
    "SciWorldEnv",
    "Simulator",
    "SimulatorUnavailable",
    "SimulatorsBusy",
    "check",
    "game",
    "make",
    "python_index",
]
