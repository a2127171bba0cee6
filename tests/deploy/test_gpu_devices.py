"""GPU_IDS reaches the GPU services as the list `device_ids` takes: the make targets add the file gpu_plan.py
writes (compose cannot split one variable into a list), and compose renders it."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
ENV_EXAMPLE = REPO / ".env.example"
SCRIPT = REPO / "services" / "trainer" / "src" / "agent_trainer" / "gpu_plan.py"


def test_gpu_ids_become_a_device_list(compose_cmd: list[str], tmp_path: Path) -> None:
    override = tmp_path / "gpus.yaml"
    env = {"PATH": "/usr/bin:/bin", "GPU_IDS": "0,2,3"}
    plan = subprocess.run([sys.executable, str(SCRIPT), "--config", "eval", "--env-file", str(ENV_EXAMPLE),
                           "--compose-override", str(override)], capture_output=True, text=True, env=env)  # fmt: skip
    assert (plan.returncode, plan.stdout.strip()) == (0, "3"), plan.stderr
    rendered = subprocess.run(
        [*compose_cmd, "--file", str(REPO / "compose.yaml"), "--file", str(override), "--project-directory",
         str(REPO), "--env-file", str(ENV_EXAMPLE), "--profile", "train", "--profile", "eval", "config",
         "--format", "json"],
        capture_output=True, text=True, env={"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "AGENTRL_STATE_SECRET": "gpu-test-secret-0123456789"}, cwd=REPO,
    )  # fmt: skip
    assert rendered.returncode == 0, rendered.stderr
    services = json.loads(rendered.stdout)["services"]
    for name in ("trainer", "eval"):
        (device,) = services[name]["deploy"]["resources"]["reservations"]["devices"]
        assert device["device_ids"] == ["0", "2", "3"] and device["capabilities"] == ["gpu"]


def test_every_service_that_reserves_a_gpu_gets_the_device_list() -> None:
    """`make eval VERL_LINE=0.9` runs eval-verl09: a GPU service missing from GPU_SERVICES would keep
    compose.yaml's single default device whatever GPU_IDS says."""
    import yaml

    sys.path.insert(0, str(SCRIPT.parent))
    from gpu_plan import GPU_SERVICES

    compose = yaml.safe_load((REPO / "compose.yaml").read_text())
    reserving = {
        name
        for name, service in compose["services"].items()
        if (((service.get("deploy") or {}).get("resources") or {}).get("reservations") or {}).get("devices")
    }
    assert reserving and reserving == set(GPU_SERVICES)


def test_device_cpu_gives_every_gpu_service_its_cpu_build_and_no_gpu(
    compose_cmd: list[str], tmp_path: Path
) -> None:
    """`make ... DEVICE=cpu`: the same services, jobs and volumes, on the CPU build of their image (its own tag, the
    CPU base, TRAINER_DEVICE=cpu) with no GPU reservation and no unlimited locked memory; the fake GPU count."""
    override = tmp_path / "cpu.yaml"
    plan = subprocess.run([sys.executable, str(SCRIPT), "--config", "textcraft_grpo_test", "--device", "cpu",
                           "--env-file", str(ENV_EXAMPLE), "--compose-override", str(override)],
                          capture_output=True, text=True, env={"PATH": "/usr/bin:/bin"})  # fmt: skip
    assert (plan.returncode, plan.stdout.strip()) == (0, "2"), plan.stderr
    missing = subprocess.run([sys.executable, str(SCRIPT), "--config", "alfworld_grpo_test", "--device", "cpu",
                              "--env-file", str(ENV_EXAMPLE)], capture_output=True, text=True)  # fmt: skip
    assert missing.returncode == 2 and "no training config 'alfworld_grpo_test'" in missing.stderr

    def render(*files: Path) -> dict:
        rendered = subprocess.run(
            [*compose_cmd, *(a for f in files for a in ("--file", str(f))), "--project-directory", str(REPO),
             "--env-file", str(ENV_EXAMPLE), "--profile", "train", "--profile", "eval", "config", "--format", "json"],
            capture_output=True, text=True, cwd=REPO,
            env={"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "AGENTRL_STATE_SECRET": "gpu-test-secret-0123456789"},
        )  # fmt: skip
        assert rendered.returncode == 0, rendered.stderr
        return json.loads(rendered.stdout)["services"]

    gpu, cpu = render(REPO / "compose.yaml"), render(REPO / "compose.yaml", override)
    for name in ("trainer", "trainer-verl09", "eval", "eval-verl09"):
        assert "deploy" not in cpu[name] and "memlock" not in cpu[name]["ulimits"]
        assert cpu[name]["image"].endswith("-cpu:local") and cpu[name]["image"] != gpu[name]["image"]
        assert cpu[name]["build"]["args"]["TRAINER_DEVICE"] == "cpu"
        assert "webshop-trainer-cpu-base" in next(
            v for k, v in cpu[name]["build"]["args"].items() if "BASE" in k
        )
        # the job itself is the GPU run's: same script, environment, volumes, user
        for key in ("entrypoint", "command", "environment", "volumes", "user", "working_dir", "depends_on"):
            assert cpu[name].get(key) == gpu[name].get(key), (name, key)
