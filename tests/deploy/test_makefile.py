"""The stack targets of mk/stack.mk: they exist (`make -n`), `make help` lists them, and the GPU jobs stop with
a clear message on a machine without a GPU or a Docker engine. Real runs happen in a copy of the makefiles, so
nothing (.env, directories) is written into the repository."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
STACK_TARGETS = ["up", "down", "ps", "logs", "scale", "monitor", "stack-config", "train-test", "train-full", "eval",
                 "demo", "train-preflight", "pin-digests", "docker-standins", "test-docker", "host-checks"]  # fmt: skip
FILES = ["Makefile", "mk/stack.mk", "mk/old-names.mk", "mk/gpu.mk", "mk/environments.mk", ".env.example", "compose.yaml", "services/trainer/src/agent_trainer/gpu_plan.py",
         "scripts/host_checks.py", "configs/nginx/environments/placements.txt",
         "configs/webshop_grpo_test.yaml", "configs/webshop_grpo_train.yaml", "configs/base/grpo_test.yaml",
         "configs/base/grpo_train.yaml"]  # fmt: skip


def _included() -> bool:
    """Has the Makefile `include mk/stack.mk` yet? (Until then the targets are used with -f mk/stack.mk.)"""
    return any(
        line.split()[:2] == ["include", "mk/stack.mk"]
        for line in (REPO / "Makefile").read_text().splitlines()
    )


def _make(*args: str, cwd: Path = REPO) -> subprocess.CompletedProcess[str]:
    files = ["-f", "Makefile"] if _included() else ["-f", "Makefile", "-f", "mk/stack.mk"]
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MAKE", "MFLAGS"))}
    return subprocess.run(["make", "--no-print-directory", *files, *args], capture_output=True, text=True,
                          cwd=cwd, env=env, timeout=60)  # fmt: skip


def _can_train_here() -> bool:
    has_gpu = (
        shutil.which("nvidia-smi") is not None
        and subprocess.run(["nvidia-smi", "-L"], capture_output=True).returncode == 0
    )
    has_docker = (
        shutil.which("docker") is not None
        and subprocess.run(["docker", "info"], capture_output=True).returncode == 0
    )
    return has_gpu and has_docker


@pytest.fixture
def stack_copy(tmp_path: Path) -> Path:
    for name in FILES:
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(REPO / name, tmp_path / name)
    return tmp_path


@pytest.mark.parametrize("target", STACK_TARGETS)
def test_target_exists(target: str, stack_copy: Path) -> None:
    result = _make("-n", target, "N=3", "MODEL_PATH=/models/m", cwd=REPO)
    assert result.returncode == 0, result.stderr


def test_help_lists_the_stack_targets() -> None:
    result = _make("help")
    assert result.returncode == 0, result.stderr
    for target in STACK_TARGETS:
        assert f" {target} " in result.stdout.replace("\x1b[0m", " ").replace("\x1b[1m", " "), target


@pytest.mark.skipif(
    _can_train_here(), reason="this machine has a GPU and a Docker engine: it would really train"
)
@pytest.mark.parametrize("target", ["train-test", "train-full"])
def test_training_stops_clearly_without_gpu_or_docker(target: str, stack_copy: Path) -> None:
    if target == "train-full":  # .env.example's one GPU passes the GPU plan of the full run only with 4 ids
        (stack_copy / ".env.example").write_text(
            (stack_copy / ".env.example").read_text().replace("\nGPU_IDS=0\n", "\nGPU_IDS=0,1,2,3\n")
        )
    result = _make(target, cwd=stack_copy)
    assert result.returncode != 0
    assert f"make {target}: this machine cannot run the GPU job" in result.stderr
    assert "make demo" in result.stderr and "make preflight" in result.stderr
    assert not (stack_copy / ".env").exists(), "nothing may be prepared before the check"


@pytest.mark.skipif(_can_train_here(), reason="this machine has a GPU and a Docker engine")
def test_eval_needs_a_model_then_a_gpu(stack_copy: Path) -> None:
    usage = _make("eval", cwd=stack_copy)
    assert usage.returncode != 0 and "MODEL_PATH=" in usage.stderr
    no_gpu = _make("eval", "MODEL_PATH=/models/m", cwd=stack_copy)
    assert no_gpu.returncode != 0 and "make demo" in no_gpu.stderr


def test_an_old_compose_is_refused_before_anything_is_built(stack_copy: Path, tmp_path: Path) -> None:
    """The GPU device list override (`!override`) needs Compose >= 2.24.4: an older plugin is named, with the way
    out, before the stack or an image is built (GPU and engine stand-ins: only Compose's version is wrong)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    stubs = {
        "nvidia-smi": 'echo "GPU 0: NVIDIA H100 (UUID: GPU-0)"',
        "docker": 'case "$1 $2" in "compose version") echo 2.20.2 ;; "info "*) exit 0 ;; *) exit 9 ;; esac',
    }
    for name, body in stubs.items():
        (bin_dir / name).write_text(f"#!/bin/sh\n{body}\n")
        (bin_dir / name).chmod(0o755)
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}"}
    result = subprocess.run(["make", "--no-print-directory", "train-test", "COMPOSE=docker compose"], cwd=stack_copy,
                            env=env, capture_output=True, text=True, timeout=120)  # fmt: skip
    assert result.returncode == 2, result.stderr
    assert "Docker Compose 2.20.2 is older than 2.24.4" in result.stderr
    assert not (stack_copy / ".env").exists(), "nothing may be prepared before the check"


def test_up_checks_the_host_before_anything_is_built(stack_copy: Path, tmp_path: Path) -> None:
    """No engine answers (a docker CLI that cannot connect): one message saying so, and compose never runs."""
    bin_dir, calls = tmp_path / "bin", tmp_path / "docker-calls"
    bin_dir.mkdir()
    (bin_dir / "docker").write_text(
        f'#!/bin/sh\necho "$*" >> {calls}\n'
        'case "$1" in info) echo "Cannot connect to the Docker daemon" >&2; exit 1 ;; esac\nexit 0\n'
    )
    (bin_dir / "docker").chmod(0o755)
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}"}
    env.pop("DOCKER_HOST", None)
    result = subprocess.run(["make", "--no-print-directory", "up", "COMPOSE=docker compose", f"VENV={tmp_path}/none"],
                            cwd=stack_copy, env=env, capture_output=True, text=True, timeout=120)  # fmt: skip
    assert result.returncode == 2, result.stderr
    assert "make up: fix these first" in result.stderr and "no Docker engine answers" in result.stderr
    assert "Cannot connect to the Docker daemon" in result.stderr
    assert not any(line.startswith("compose") for line in calls.read_text().splitlines()), (
        "nothing may be built"
    )
    skipped = subprocess.run(["make", "--no-print-directory", "-n", "up", "SKIP_HOST_CHECKS=1"], cwd=stack_copy,
                             env=env, capture_output=True, text=True, timeout=120)  # fmt: skip
    assert "host_checks.py up" not in skipped.stdout


def test_new_env_gets_the_engines_open_files_limit(stack_copy: Path) -> None:
    """AGENTRL_NOFILE in a new .env is what the engine allows (scripts/host_checks.py nofile: 65535 or lower)."""
    expected = subprocess.run(["python3", "scripts/host_checks.py", "nofile"], cwd=stack_copy, capture_output=True,
                              text=True, check=True).stdout.strip()  # fmt: skip
    assert _make(".env", cwd=stack_copy).returncode == 0
    assert f"\nAGENTRL_NOFILE={expected}\n" in (stack_copy / ".env").read_text()


@pytest.mark.parametrize("target", ["docker-standins", "test-docker"])
def test_docker_targets_install_debootstrap(target: str, tmp_path: Path) -> None:
    result = _make("-n", target, f"VENV={tmp_path}/venv")
    assert result.returncode == 0, result.stderr
    assert "install -y -qq debootstrap" in result.stdout


def test_setup_gets_spacys_model_or_says_why_not(tmp_path: Path) -> None:
    """A new .venv: the model from the env image's pin (or one loud warning), then the conformance check on it."""
    result = _make("-n", "setup", f"VENV={tmp_path}/venv")
    assert result.returncode == 0, result.stderr
    recipe = result.stdout[result.stdout.index("scripts/host_checks.py spacy") :]
    check = recipe.index("conformance check --traces tests/fixtures/conformance/original-seed3 --unpin nouns")
    assert check < recipe.index(f"touch {tmp_path}/venv/.spacy-model")
    assert "3) ;;" in recipe[: check + 200]  # exit 3 (heuristic nouns, said loudly): setup goes on
    wheel = _make("-n", "setup", f"VENV={tmp_path}/venv", "SPACY_MODEL_WHEEL=/x/en_core_web_sm.whl")
    assert "scripts/host_checks.py spacy --wheel /x/en_core_web_sm.whl" in wheel.stdout


def test_scale_needs_a_count(stack_copy: Path) -> None:
    result = _make("scale", "N=zero", cwd=stack_copy)
    assert result.returncode != 0
    assert "make scale N=4" in result.stderr


def test_env_file_gets_a_fresh_secret_and_is_private(stack_copy: Path) -> None:
    first = _make(".env", cwd=stack_copy)
    assert first.returncode == 0, first.stderr
    env_file = stack_copy / ".env"
    assert env_file.stat().st_mode & 0o077 == 0, ".env holds the secret: mode 600"
    secret = next(
        line for line in env_file.read_text().splitlines() if line.startswith("AGENTRL_STATE_SECRET=")
    )
    assert len(secret.partition("=")[2]) >= 32
    env_file.write_text(env_file.read_text() + "# edited\n")
    _make(".env", cwd=stack_copy)
    assert env_file.read_text().endswith("# edited\n"), "an existing .env is never overwritten"


def test_a_gpu_count_mismatch_stops_before_anything_is_built(stack_copy: Path) -> None:
    """.env.example's GPU_IDS=0 (one GPU) and the full config (tensor parallel 2, 4 GPUs): refused first, on any
    machine, GPU or not, before the stack or an image is built."""
    result = _make("train-full", cwd=stack_copy)
    assert result.returncode == 2
    assert "tensor parallel size 2" in result.stderr and "GPU_IDS=0,1,2,3" in result.stderr
    assert "nothing was built" in result.stderr
    assert "this machine cannot run the GPU job" not in result.stderr  # the plan is checked before the GPU
    assert not (stack_copy / ".env").exists()


def test_training_order_plan_then_gpu_then_stack_then_container_preflight() -> None:
    lines = _make("-n", "train-test").stdout.splitlines()

    def first(text: str) -> int:
        return next(i for i, line in enumerate(lines) if text in line)

    assert (
        first("gpu_plan.py")
        < first("nvidia-smi not found")
        < first("up --detach --build")
        < first("run --rm")
    )
    run = lines[first("run --rm")]
    assert "-f outputs/compose/gpus.yaml" in run and "--compose-override" in run and "AGENTRL_N_GPUS=" in run
    host_preflight = ("agent-train preflight --catalog", "--no-print-directory preflight")
    assert not any(text in line for line in lines for text in host_preflight), "optional: HOST_PREFLIGHT=1"
    with_host = _make("-n", "train-test", "HOST_PREFLIGHT=1").stdout
    assert "agent-train preflight" in with_host


def test_eval_accepts_the_three_model_forms_and_says_so(stack_copy: Path) -> None:
    usage = _make("eval", cwd=stack_copy)
    assert "hub id" in usage.stderr and "/outputs/checkpoints/webshop_grpo_test" in usage.stderr
    for model in (
        "Qwen/Qwen2.5-1.5B-Instruct",
        "/models/m",
        "/outputs/checkpoints/webshop_grpo_test/global_step_8",
    ):
        shown = _make("-n", "eval", f"MODEL_PATH={model}").stdout.replace("\\\n", " ")
        run = next(line for line in shown.splitlines() if "run --rm" in line)
        assert f'EVAL_MODEL_PATH="{model}"' in run and "-f outputs/compose/gpus.yaml" in run


def test_eval_runs_in_the_image_of_the_verl_line_that_wrote_the_checkpoint() -> None:
    """A verl 0.9.1 checkpoint is merged by 0.9.1's merger under its torch: VERL_LINE=0.9 picks eval-verl09."""
    for line, service in (("0.7", "eval"), ("0.9", "eval-verl09")):
        shown = _make("-n", "eval", "MODEL_PATH=/outputs/checkpoints/x", f"VERL_LINE={line}").stdout
        run = next(row for row in shown.replace("\\\n", " ").splitlines() if "run --rm" in row)
        assert run.rstrip().endswith(f" {service}"), run
    assert _make("eval", "MODEL_PATH=x", "VERL_LINE=0.8").returncode == 2


@pytest.mark.parametrize(
    ("args", "config", "data_envs", "served"),
    [
        (["train-test"], "webshop_grpo_test", "webshop", "webshop"),
        (["train-test", "ENV=webshop"], "webshop_grpo_test", "webshop", "webshop"),
        (["train-full", "ENV=webshop"], "webshop_grpo_train", "webshop", "webshop"),
        (["train-test", "ENV=textcraft"], "textcraft_grpo_test", "textcraft", "textcraft,webshop"),
        (["train-full", "ENV=babyai"], "babyai_grpo_train", "babyai", "babyai,webshop"),
        (["train-test", "ENV=sciworld"], "sciworld_grpo_test", "sciworld", "sciworld,webshop"),
        (
            ["train-test", "ENV=mixed"],
            "mixed_grpo_test",
            "textcraft,babyai,webshop",
            "babyai,textcraft,webshop",
        ),
        (
            ["train-full", "ENV=textcraft,webshop"],
            "mixed_grpo_train",
            "textcraft,webshop",
            "textcraft,webshop",
        ),
    ],
)
def test_env_picks_the_environments_config_data_and_served_environments(
    args: list[str], config: str, data_envs: str, served: str
) -> None:
    """`make train-test ENV=textcraft`: the GPU plan and the container run textcraft_grpo_test, the container
    builds TextCraft's data (TRAIN_ENVS) and `make up` serves TextCraft next to what it serves (WebShop here)."""
    for line, config_dir, service in (
        ("0.7", "configs", "trainer"),
        ("0.9", "configs/verl09", "trainer-verl09"),
    ):
        shown = _make("-n", *args, f"VERL_LINE={line}", "ENVS=webshop").stdout.replace("\\\n", " ")
        plans = [row for row in shown.splitlines() if "gpu_plan.py" in row]
        assert plans and all(
            f"--config {config} " in row and f"--config-dir {config_dir} " in row for row in plans
        )
        up = next(row for row in shown.splitlines() if "--no-print-directory -f mk/stack.mk up" in row)
        assert up.rstrip().endswith(f"up ENVS={served}"), up
        run = next(row for row in shown.splitlines() if "run --rm" in row)
        assert f"-e TRAIN_CONFIG={config} " in run and f"-e TRAIN_ENVS={data_envs} " in run
        assert run.rstrip().endswith(f" {service}"), run
        # the job's compose run sees the list `make up` served: compose then leaves the replicas and the balancer
        # running as they are (another AGENTRL_ENVS, e.g. make's exported ENVS, would recreate them without it)
        assert run.lstrip().startswith(f'AGENTRL_ENVS="{served}" '), run
    assert (REPO / "configs" / f"{config}.yaml").is_file() and (
        REPO / "configs" / "verl09" / f"{config}.yaml"
    ).is_file()


@pytest.mark.parametrize(
    ("served_before", "env", "served"),
    [
        ("babyai", "babyai", "babyai"),
        ("textcraft", "babyai", "babyai,textcraft"),
        ("webshop", "babyai", "babyai,webshop"),
    ],
)
def test_a_run_serves_its_environments_next_to_the_served_ones_and_no_other(
    served_before: str, env: str, served: str
) -> None:
    """`make up ENVS=babyai` then `make train-test ENV=babyai`: BabyAI alone is served (WebShop was added to every
    run's list; the run's preflight reuses a service that serves the run's environments)."""
    for target in ("train-test", "train-full", "train-preflight"):
        shown = _make("-n", target, f"ENV={env}", f"ENVS={served_before}").stdout.replace("\\\n", " ")
        up = next(row for row in shown.splitlines() if "--no-print-directory -f mk/stack.mk up" in row)
        assert up.rstrip().endswith(f"up ENVS={served}"), up
        run = next(row for row in shown.splitlines() if "run --rm" in row)
        assert run.lstrip().startswith(f'AGENTRL_ENVS="{served}" '), run
    shown = _make("-n", "eval", "MODEL_PATH=/m", f"ENV={env}", f"ENVS={served_before}").stdout
    run = next(row for row in shown.replace("\\\n", " ").splitlines() if "run --rm" in row)
    assert run.lstrip().startswith(f'AGENTRL_ENVS="{served}" '), run


def test_a_run_keeps_what_the_running_stack_serves(tmp_path: Path) -> None:
    """`make up ENVS=babyai,textcraft` then `make train-test ENV=babyai` (no ENVS): the run serves what the running
    stack serves (its balancer's AGENTRL_ENVS), so compose re-creates nothing; when none runs, .env's list or the
    run's environments alone. The engine here is a stand-in answering as docker would."""
    compose, docker = tmp_path / "compose", tmp_path / "docker"
    compose.write_text('#!/bin/sh\n[ "$1 $2 $3" = "ps -q balancer" ] && echo 0d37beab591f\n')
    docker.write_text('#!/bin/sh\nprintf "PATH=/usr/bin\\nAGENTRL_ENVS=babyai,textcraft\\nHOME=/h\\n"\n')
    for script in (compose, docker):
        script.chmod(0o755)
    engine = [f"COMPOSE={compose}", f"DOCKER={docker}"]
    for target in ("train-test", "eval"):
        shown = _make("-n", target, "ENV=babyai", "MODEL_PATH=/m", *engine).stdout.replace("\\\n", " ")
        run = next(row for row in shown.splitlines() if "run --rm" in row)
        assert 'AGENTRL_ENVS="babyai,textcraft"' in run, run
    compose.write_text(
        "#!/bin/sh\nexit 0\n"
    )  # no stack runs (and no .env list): the run's environments alone
    shown = _make("-n", "train-test", "ENV=babyai", *engine).stdout.replace("\\\n", " ")
    assert 'AGENTRL_ENVS="babyai"' in next(row for row in shown.splitlines() if "run --rm" in row)


def test_an_unknown_env_is_refused_before_anything_runs() -> None:
    result = _make("train-test", "ENV=textcraft,alfworld")
    assert result.returncode == 2 and "not 'alfworld'" in result.stderr
    # the registered environments, as configs/nginx/environments/placements.txt lists them (from the registry)
    from agent_envs.envs import registry

    registered = " ".join(r.id for r in registry.BUILTIN)
    assert f"a registered environment ({registered})" in result.stderr


@pytest.mark.skipif(
    _can_train_here(), reason="this machine has a GPU and a Docker engine: it would really train"
)
def test_any_registered_environment_is_accepted_and_one_without_a_config_is_told_which_file(
    stack_copy: Path,
) -> None:
    """ENV takes any environment the registry lists (a plugin's, once `agent-envs envs --write-deploy` wrote it
    into placements.txt); without a training config of its own on that line, the run stops before anything else,
    naming the file to write. With the file there, the run goes on (here: to the GPU check)."""
    placements = stack_copy / "configs" / "nginx" / "environments" / "placements.txt"
    placements.write_text(placements.read_text() + "sokoban any\n")
    for target, line, expected in (("train-test", "0.7", "configs/sokoban_grpo_test.yaml"),
                                   ("train-full", "0.9", "configs/verl09/sokoban_grpo_train.yaml")):  # fmt: skip
        result = _make(target, "ENV=sokoban", f"VERL_LINE={line}", cwd=stack_copy)
        assert result.returncode == 2, result.stderr
        assert (
            f"make {target}: ENV=sokoban has no training config {expected} (verl {line} line)"
            in result.stderr
        )
        assert "docs/environments/adding.md" in result.stderr and "this machine cannot" not in result.stderr
        assert "agent-train configs --write" in result.stderr  # what writes it from the spec's recipe
    preflight = _make("train-preflight", "ENV=sokoban", "CONFIG=full", cwd=stack_copy)
    assert (
        preflight.returncode == 2 and "no training config configs/sokoban_grpo_train.yaml" in preflight.stderr
    )
    shutil.copy(
        REPO / "configs" / "textcraft_grpo_test.yaml", stack_copy / "configs" / "sokoban_grpo_test.yaml"
    )
    result = _make("train-test", "ENV=sokoban", cwd=stack_copy)
    assert result.returncode != 0 and "make train-test: this machine cannot run the GPU job" in result.stderr
    assert "no training config" not in result.stderr


def test_make_up_serves_the_environments_named(stack_copy: Path) -> None:
    """`make up` hands compose the environments (ENVS=..., else .env's AGENTRL_ENVS, else webshop) and turns the
    SciWorld replicas' profile on exactly when a sticky environment (placements.txt: SciWorld) is named;
    down/ps/logs always cover that profile."""

    def up_line(*args: str) -> str:
        result = _make("-n", "up", "SKIP_HOST_CHECKS=1", "COMPOSE=compose", *args, cwd=stack_copy)
        assert result.returncode == 0, result.stderr
        return next(line for line in result.stdout.splitlines() if " up --detach" in line)

    (stack_copy / ".env").write_text((REPO / ".env.example").read_text())
    assert up_line().startswith('AGENTRL_ENVS="webshop" compose  up ')
    assert up_line("ENVS=webshop,textcraft,sciworld").startswith(
        'AGENTRL_ENVS="webshop,textcraft,sciworld" compose --profile sciworld up '
    )
    (stack_copy / ".env").write_text(
        (REPO / ".env.example")
        .read_text()
        .replace("\nAGENTRL_ENVS=webshop\n", "\nAGENTRL_ENVS=babyai,sciworld\n")
    )
    assert up_line().startswith('AGENTRL_ENVS="babyai,sciworld" compose --profile sciworld up ')
    assert up_line("ENVS=textcraft").startswith('AGENTRL_ENVS="textcraft" compose  up ')
    down = _make("-n", "down", "COMPOSE=compose", cwd=stack_copy).stdout
    assert "--profile sciworld" in down


def test_eval_keeps_the_served_environments_running() -> None:
    """`make eval ENV=babyai`: its compose run sees the list `make up ENVS=...` served (WebShop's and BabyAI's)."""
    shown = _make("-n", "eval", "MODEL_PATH=x", "ENV=babyai", "ENVS=webshop").stdout.replace("\\\n", " ")
    run = next(row for row in shown.splitlines() if "run --rm" in row)
    assert run.lstrip().startswith('AGENTRL_ENVS="babyai,webshop" '), run
    up = next(row for row in shown.splitlines() if "--no-print-directory -f mk/stack.mk up" in row)
    assert up.rstrip().endswith("up ENVS=babyai,webshop"), up


@pytest.mark.parametrize("target", ["train-test", "eval"])
def test_device_cpu_runs_the_same_services_on_the_cpu_build(target: str) -> None:
    """DEVICE=cpu: the same compose service, with the CPU build's compose file (no GPU, the CPU images) and the
    CPU base image made present first; nothing else of the command differs."""
    extra = ["MODEL_PATH=x"] if target == "eval" else []
    gpu = _make("-n", target, *extra, "ENV=textcraft,babyai").stdout.replace("\\\n", " ")
    cpu = _make("-n", target, *extra, "ENV=textcraft,babyai", "DEVICE=cpu").stdout.replace("\\\n", " ")
    run_gpu = next(row for row in gpu.splitlines() if "run --rm" in row)
    run_cpu = next(row for row in cpu.splitlines() if "run --rm" in row)
    assert "outputs/compose/gpus.yaml" in run_gpu and "outputs/compose/cpu.yaml" in run_cpu
    assert run_cpu.replace("cpu.yaml", "gpus.yaml").replace("--device cpu", "--device gpu") == run_gpu
    assert any("docker/standins/build.py ensure --no-pull" in row for row in cpu.splitlines())
    assert not any("docker/standins/build.py" in row for row in gpu.splitlines())
    assert _make(target, *extra, "DEVICE=tpu").returncode == 2


def test_logs_of_the_env_replicas_by_their_old_service_name(stack_copy: Path) -> None:
    """`make logs SERVICE=webshop`: the service is `envs` now; the old name works for one release, and says so."""
    (stack_copy / ".env").write_text((stack_copy / ".env.example").read_text())
    old = _make("logs", "SERVICE=webshop", "-n", cwd=stack_copy)
    assert old.returncode == 0, old.stderr
    assert re.search(r"logs --follow --tail=200 envs$", old.stdout, re.M), old.stdout
    assert "SERVICE=webshop is the old name" in old.stderr
    new = _make("logs", "SERVICE=balancer", "-n", cwd=stack_copy)
    assert re.search(r"logs --follow --tail=200 balancer$", new.stdout, re.M) and "old name" not in new.stderr


def test_serving_targets_build_webshop_s_catalog_only_where_webshop_is_served(tmp_path: Path) -> None:
    """`make up-local ENVS=textcraft` / `make up-ray ENVS=babyai` need no WebShop catalog (the other environments'
    data comes with their packages): they used to generate and prepare one whatever ENVS said."""
    catalog = f"CATALOG_DIR={tmp_path / 'catalog'}"
    for target in ("up-local", "up-ray"):
        alone = _make("-n", target, "ENVS=textcraft,babyai", catalog)
        assert alone.returncode == 0, alone.stderr
        assert "catalog generate" not in alone.stdout and "agent_envs." in alone.stdout, alone.stdout
        with_webshop = _make("-n", target, "ENVS=textcraft,webshop", catalog)
        assert "catalog generate" in with_webshop.stdout, with_webshop.stdout


def test_which_environments_need_make_data_is_their_registrations(stack_copy: Path) -> None:
    """The Makefile names no environment: an environment whose registration reads prepared data (``data_setting``)
    gets `make data` first once `agent-envs envs --write-deploy` wrote mk/environments.mk from the registrations."""
    import dataclasses

    from agent_envs import deploy
    from agent_envs.envs import registry

    regs = [
        dataclasses.replace(r, data_setting="catalog") if r.id == "textcraft" else r for r in registry.BUILTIN
    ]
    (stack_copy / "mk" / "environments.mk").write_text(deploy.make_fragment(regs))

    def catalog_step(envs: str) -> str:  # the prerequisite up-local and up-ray get for ENVS
        shown = _make("--eval", "shown: ; @echo [$(ENVS_CATALOG)]", "shown", f"ENVS={envs}", cwd=stack_copy)
        assert shown.returncode == 0, shown.stderr
        return shown.stdout.strip()

    assert catalog_step("textcraft") == "[data]" and catalog_step("babyai,textcraft") == "[data]"
    assert catalog_step("babyai") == "[]" and catalog_step("webshop") == "[data]"
