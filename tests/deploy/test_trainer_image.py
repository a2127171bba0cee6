"""The trainer image's build-time checks (docker/trainer-image-check.py), run here on CPU, and where the
Dockerfile runs them: a missing module or an unlisted dependency conflict fails the build, not the GPU run."""

from __future__ import annotations

import importlib.util
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
DOCKERFILE = REPO / "docker" / "trainer.Dockerfile"
SCRIPT = REPO / "docker" / "trainer-image-check.py"
ACCEPTED = REPO / "docker" / "trainer-accepted-conflicts.txt"
#: A training config of its own (no base) that needs no flash_attn: what a check of the rest is given.
SDPA_CONFIG = "actor_rollout_ref:\n  model:\n    override_config:\n      attn_implementation: sdpa\n"
# sglang is the one GPU-image package the CPU venv does not have
NOT_ON_CPU = ["sglang", "sglang.launch_server", "verl.workers.rollout.sglang_rollout.async_sglang_server"]


def _check_module():
    spec = importlib.util.spec_from_file_location("trainer_image_check", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_dockerfile_runs_the_checks_after_everything_is_installed() -> None:
    text = DOCKERFILE.read_text()
    # the tag, or tag@digest once `make pin-digests` has run
    assert re.search(
        r"^ARG TRAINER_BASE_IMAGE=lmsysorg/sglang:v0\.5\.9(@sha256:[0-9a-f]{64})?$", text, re.MULTILINE
    )
    assert re.search(r"^FROM \$\{TRAINER_BASE_IMAGE\}$", text, re.MULTILINE)
    check = text.index("trainer-image-check.py --configs /opt/agentrl/configs")
    assert check > text.rindex("pip install") and check > text.index("COPY configs/")
    assert "--pip-check-output pip-check.txt" in text
    assert "|| echo" not in text, "a failing check must fail the build"


def test_every_gpu_run_module_imports_here_except_sglang() -> None:
    pytest.importorskip("verl")
    result = subprocess.run([sys.executable, str(SCRIPT), "--configs", str(REPO / "configs"),
                             "--accepted-conflicts", str(ACCEPTED), "--skip", *NOT_ON_CPU],
                            capture_output=True, text=True, timeout=300)  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr
    assert "flash_attn required" not in result.stdout  # the configs choose SDPA explicitly


def test_the_cpu_builds_module_list_imports_here_with_nothing_skipped() -> None:
    """TRAINER_DEVICE=cpu: the GPU engine's modules are replaced by the CPU stand-ins (the rollout server, the
    eval's chat server, verl 0.7.1's device seams), and every module of that list imports in the CPU venv."""
    pytest.importorskip("verl")
    check = _check_module()
    modules = check.run_modules("0.7", "cpu", [], [])
    assert not set(modules) & set(check.GPU_ENGINE_MODULES)
    assert "agent_trainer.rehearsal.cpu_rollout" in modules and "agent_trainer.verl_main" in modules
    result = subprocess.run([sys.executable, str(SCRIPT), "--configs", str(REPO / "configs"), "--device", "cpu",
                             "--skip"], capture_output=True, text=True, timeout=300)  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"imported {len(modules)}/{len(modules)} modules" in result.stdout


def test_a_config_that_needs_flash_attn_makes_it_required(tmp_path: Path) -> None:
    """Each training config as it composes: an environment's file that turns remove-padding on, or a base that
    drops the attention choice (every config on it then gets verl's default, flash_attention_2)."""
    check = _check_module()
    shutil.copytree(REPO / "configs", tmp_path / "configs")
    configs = tmp_path / "configs"
    assert check.configs_need_flash_attn(configs) == []
    overlay = configs / "webshop_grpo_test.yaml"
    overlay.write_text(
        overlay.read_text().replace(
            "actor_rollout_ref:\n", "actor_rollout_ref:\n  model:\n    use_remove_padding: true\n", 1
        )
    )
    assert check.configs_need_flash_attn(configs) == [
        "webshop_grpo_test.yaml: use_remove_padding true imports flash_attn.bert_padding"
    ]
    base = configs / "base" / "grpo_train.yaml"
    base.write_text(base.read_text().replace("      attn_implementation: sdpa\n", ""))
    train = [r for r in check.configs_need_flash_attn(configs) if "flash_attention_2 (verl's default" in r]
    assert sorted(r.split(":")[0] for r in train) == sorted(p.name for p in configs.glob("*_grpo_train.yaml"))
    if importlib.util.find_spec("flash_attn") is None:
        assert check.import_errors(check.FLASH_ATTN_MODULES)[0].startswith("import flash_attn:")


def test_pip_check_fails_on_any_conflict_not_listed_with_a_reason(tmp_path: Path) -> None:
    check = _check_module()
    accepted = check.read_accepted(ACCEPTED)
    assert accepted and all(reason for _, reason in accepted)
    numpy_line = ("opencv-python-headless 4.12.0.88 has requirement numpy<2.3.0,>=2; python_version >= \"3.9\", "
                  "but you have numpy 1.26.4.")  # fmt: skip
    other = "xgrammar 0.1.27 has requirement torch>=2.10, but you have torch 2.9.1."
    assert check.unaccepted_conflicts("No broken requirements found.\n", accepted) == []
    assert check.unaccepted_conflicts(numpy_line, accepted) == []
    assert check.unaccepted_conflicts(f"{numpy_line}\n{other}\n", accepted) == [other]
    output = tmp_path / "pip-check.txt"
    output.write_text(f"{numpy_line}\n{other}\n")
    result = subprocess.run([sys.executable, str(SCRIPT), "--configs", str(tmp_path), "--accepted-conflicts",
                             str(ACCEPTED), "--pip-check-output", str(output), "--verl-line", "0.7", "--skip",
                             *check.GPU_RUN_MODULES["0.7"]], capture_output=True, text=True)  # fmt: skip
    assert result.returncode == 1 and "pip check: xgrammar" in result.stderr
    unreasoned = tmp_path / "accepted.txt"
    unreasoned.write_text("has requirement numpy\n")
    with pytest.raises(SystemExit, match="needs ' # <reason>'"):
        check.read_accepted(unreasoned)


def test_a_serve_that_does_not_fit_the_images_web_stack_fails_the_build(tmp_path: Path) -> None:
    """Both lines import Ray Serve and the env's Serve app (AGENTRL_ENV=ray): a fastapi that Ray Serve cannot use
    (here one that fails to import, as a version outside Serve's range would) fails the check, not deferred."""
    check = _check_module()
    serve = ["ray.serve", "agent_envs.ray_serve.app"]
    for line in ("0.7", "0.9"):
        assert set(serve) <= set(check.GPU_RUN_MODULES[line]), line
    fake = tmp_path / "site" / "fastapi"
    fake.mkdir(parents=True)
    (fake / "__init__.py").write_text("raise ImportError('fastapi 0.0.0: outside what Ray Serve supports')\n")
    (tmp_path / "webshop_grpo_test.yaml").write_text(SDPA_CONFIG)
    others = [m for m in check.GPU_RUN_MODULES["0.7"] if m not in serve]
    result = subprocess.run([sys.executable, str(SCRIPT), "--configs", str(tmp_path), "--verl-line", "0.7",
                             "--skip", *others], capture_output=True, text=True, timeout=300,
                            env={**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(tmp_path / "site"), os.environ.get("PYTHONPATH")]))})  # fmt: skip
    assert result.returncode == 1, result.stdout + result.stderr
    for module in serve:
        assert f"FAILED: import {module}: ImportError: fastapi 0.0.0" in result.stderr, result.stderr
    assert "deferred" not in result.stdout


def test_a_serve_that_imports_but_cannot_deploy_fails_the_build(monkeypatch: pytest.MonkeyPatch) -> None:
    """Ray 2.49's Serve under protobuf 7 imports, then fails to read its own deployment configs: the check puts a
    config through protobuf and back, as Serve's controller does when the env's app is deployed."""
    pytest.importorskip("ray.serve")
    from ray.serve._private.config import DeploymentConfig

    check = _check_module()
    assert check.serve_problems() == []  # this environment's Ray and protobuf

    def unreadable(cls: type, data: bytes) -> None:
        raise AttributeError("'google._upb._message.FieldDescriptor' object has no attribute 'label'")

    monkeypatch.setattr(DeploymentConfig, "from_proto_bytes", classmethod(unreadable))
    assert check.serve_problems() == [
        "ray.serve: a deployment config does not go through protobuf and back: AttributeError: "
        "'google._upb._message.FieldDescriptor' object has no attribute 'label'"
    ]


def test_the_verl09_image_runs_the_same_checks() -> None:
    text = (REPO / "docker" / "trainer-verl09.Dockerfile").read_text()
    check = text.index("trainer-image-check.py --configs /opt/agentrl/configs/verl09")
    assert check > text.rindex("pip install") and check > text.index("COPY configs/")
    assert "--verl-line 0.9" in text and "--baseline base-pip-check.txt" in text
    assert text.index("base-pip-check.txt") < text.index(
        "pip install"
    )  # recorded before anything is installed
    assert "|| echo" not in text, "a failing check must fail the build"


def test_conflicts_the_base_image_shipped_are_accepted_and_new_ones_fail() -> None:
    check = _check_module()
    shipped = "flashinfer-python 0.4.1 has requirement nvidia-cudnn-frontend>=1.13, but you have 1.12."
    new = "verl 0.9.1 has requirement transformers<5.11, but you have transformers 5.12.0."
    assert check.unaccepted_conflicts(f"{shipped}\n{new}\n", [], baseline=f"{shipped}\n") == [new]
    assert check.unaccepted_conflicts(f"{shipped}\n", [], baseline="") == [shipped]


def test_an_import_that_needs_the_gpu_driver_is_deferred_at_build_and_fails_with_the_driver_required(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`docker build` has no libcuda.so (the NVIDIA runtime mounts it into running containers only): such a
    failure is deferred at build time, and fails the trainer job's start (--require-driver)."""
    check = _check_module()
    (tmp_path / "needs_driver.py").write_text(
        "raise ImportError('libcuda.so.1: cannot open shared object file: No such file or directory')\n"
    )
    (tmp_path / "broken.py").write_text("raise ImportError('No module named flashinfer')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    deferred: list[str] = []
    errors = check.import_errors(["needs_driver", "broken"], deferred)
    assert errors == ["import broken: ImportError: No module named flashinfer"]
    assert deferred == ["import needs_driver: ImportError: libcuda.so.1: cannot open shared object file: No such "
                        "file or directory"]  # fmt: skip
    assert len(check.import_errors(["needs_driver", "broken"])) == 2  # --require-driver: nothing deferred


def test_only_the_errors_own_message_or_its_cause_count_as_a_missing_driver(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An import that fails while handling a missing libcuda (its __context__) is a real failure; one raised from
    it (its __cause__) is the driver's."""
    check = _check_module()
    (tmp_path / "wrapped.py").write_text(
        "try:\n    raise OSError('libcuda.so.1: cannot open shared object file')\n"
        "except OSError as e:\n    raise ImportError('sgl_kernel could not load its ops') from e\n"
    )
    (tmp_path / "during.py").write_text(
        "try:\n    raise OSError('libcuda.so.1: cannot open shared object file')\n"
        "except OSError:\n    import no_such_module_here\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    deferred: list[str] = []
    errors = check.import_errors(["wrapped", "during"], deferred)
    assert [item.split(":")[0] for item in deferred] == ["import wrapped"]
    assert [item.split(":")[0] for item in errors] == ["import during"]


def test_the_images_skip_list_reaches_the_jobs_rerun(tmp_path: Path) -> None:
    """IMAGE_CHECK_SKIP is kept in the image as AGENTRL_IMAGE_CHECK_SKIP, the check's default --skip."""
    for name in ("trainer.Dockerfile", "trainer-verl09.Dockerfile"):
        assert "ENV AGENTRL_IMAGE_CHECK_SKIP=${IMAGE_CHECK_SKIP}" in (REPO / "docker" / name).read_text(), (
            name
        )
    (tmp_path / "webshop_grpo_test.yaml").write_text(SDPA_CONFIG)
    env = {**os.environ, "AGENTRL_IMAGE_CHECK_SKIP": " ".join(_check_module().GPU_RUN_MODULES["0.7"])}
    result = subprocess.run([sys.executable, str(SCRIPT), "--configs", str(tmp_path), "--verl-line", "0.7",
                             "--require-driver"], capture_output=True, text=True, env=env, timeout=120)  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr
    assert "imported 0/0 modules" in result.stdout
