"""The trainer and eval containers run as RUN_UID (make writes `id -u` into .env), which the images do not know:
a real `torch.compile` (inductor, CPU) must work in a process whose uid has no passwd entry, with the
environment compose gives those containers.

torch 2.9 / 2.11 (the trainer images) name inductor's cache directory after `getpass.getuser()`, which raises
`KeyError: getpwuid(): uid not found` for such a uid unless USER or LOGNAME is set (pytorch/pytorch#140765);
verl compiles its entropy function by default, so a run would die at its first compiled call. The torch here
(2.13) has a fallback, so the job also asserts what those versions rely on: `getpass.getuser()` answers, and
the compiled code is cached where compose says (the cache volume). The process runs in a user namespace
(util-linux `unshare`) as a uid that /etc/passwd lacks, so it still reads this checkout's Python.
"""

from __future__ import annotations

import json
import os
import pwd
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

pytest.importorskip("torch")

JOB = r"""
import getpass, json, os, sys
import torch

user = getpass.getuser()  # what inductor's default_cache_dir() asks on torch 2.9 / 2.11
compiled = torch.compile(lambda x: (torch.softmax(x, -1) * torch.log_softmax(x, -1)).sum(-1), backend="inductor")
value = compiled(torch.randn(4, 16))
cache = os.environ["TORCHINDUCTOR_CACHE_DIR"]
print(json.dumps({"user": user, "uid": os.getuid(), "shape": list(value.shape),
                  "cache_files": sum(len(files) for _, _, files in os.walk(cache))}))
"""


def _unmapped_uid() -> int:
    uid = 54321
    while True:
        try:
            pwd.getpwuid(uid)
        except KeyError:
            return uid
        uid += 1


def _as_uid(uid: int) -> list[str]:
    """A command prefix that runs a process as ``uid`` in a user namespace (util-linux ``unshare``): inside it
    the uid has no passwd entry, as RUN_UID in the images, while files keep the caller's access."""
    return ["unshare", "--user", f"--map-user={uid}", f"--map-group={uid}"]


def _user_namespaces() -> bool:
    if shutil.which("unshare") is None:
        return False
    probe = subprocess.run([*_as_uid(_unmapped_uid()), "true"], capture_output=True, timeout=30)
    return probe.returncode == 0


def _job_environment(service: dict, cache: Path) -> dict[str, str]:
    """The service's environment as compose renders it, with the cache volume (/cache) at ``cache``."""
    env = {k: str(v) for k, v in (service.get("environment") or {}).items() if v is not None}
    for key, value in env.items():
        if value == "/cache" or value.startswith("/cache/"):
            env[key] = str(cache) + value[len("/cache") :]
    env["PATH"] = os.environ.get("PATH", "/usr/bin:/bin")
    env["TMPDIR"] = str(cache / "tmp")
    return env


@pytest.mark.slow
@pytest.mark.skipif(not _user_namespaces(), reason="needs util-linux unshare and user namespaces")
@pytest.mark.parametrize("name", ["trainer", "trainer-verl09", "eval", "eval-verl09"])
def test_torch_compile_works_as_an_unmapped_uid_with_the_job_environment(rendered: dict, name: str) -> None:
    uid = _unmapped_uid()
    cache = Path(tempfile.mkdtemp(prefix="job-uid-"))
    try:
        (cache / "tmp").mkdir()
        env = _job_environment(rendered["services"][name], cache)
        assert "TORCHINDUCTOR_CACHE_DIR" in env, f"{name}: compose sets no inductor cache directory"
        result = subprocess.run([*_as_uid(uid), sys.executable, "-c", JOB], env=env, cwd=str(cache),
                                capture_output=True, text=True, timeout=300)  # fmt: skip
        assert result.returncode == 0, f"{name} as uid {uid}:\n{result.stderr[-3000:]}"
        report = json.loads(result.stdout.strip().splitlines()[-1])
        assert report["uid"] == uid and report["shape"] == [4]
        assert report["user"], "getpass.getuser() gave no name"
        assert report["cache_files"] > 0, "inductor wrote nothing into the cache volume"
        # what inductor names after the user (on CPU: its precompiled headers) has a name, not the uid fallback
        # of torch >= 2.13 (older torch raises instead)
        assert not any(p.name.startswith("torchinductor_uid_") for p in (cache / "tmp").iterdir()), (
            "inductor could not tell the user's name (it fell back to uid_N)"
        )
    finally:
        shutil.rmtree(cache, ignore_errors=True)
