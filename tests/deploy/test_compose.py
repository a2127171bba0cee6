"""compose.yaml: valid against the Compose specification (Docker Compose v2's own `config`, no daemon needed),
rendered with .env.example, and shaped as docs/architecture.md describes; .env.example documents every variable."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
COMPOSE_FILE = REPO / "compose.yaml"
ENV_EXAMPLE = REPO / ".env.example"
Compose = Any  # the `compose` fixture (tests/deploy/conftest.py)

CORE = {"catalog-init", "envs", "sessions", "balancer"}
PROFILED = {
    "trainer": ["train"],
    "trainer-verl09": ["train"],
    "eval": ["eval"],
    "eval-verl09": ["eval"],
    "tensorboard": ["monitor"],
    "sciworld": ["sciworld"],
}


def _published(service: dict) -> list[dict]:
    return service.get("ports") or []


def test_compose_file_is_valid_with_env_example(compose: Compose) -> None:
    for profiles in ((), compose.all_profiles):
        result = compose.run(*profiles, "config", "--quiet")
        assert result.returncode == 0, result.stderr


def test_validation_is_real_an_unknown_key_is_rejected(compose: Compose, tmp_path: Path) -> None:
    """Control: the same command rejects a file that breaks the specification."""
    broken = tmp_path / "compose.yaml"
    broken.write_text(COMPOSE_FILE.read_text().replace("    read_only: true\n", "    read_onyl: true\n", 1))
    result = compose.run("config", "--quiet", file=broken)
    assert result.returncode != 0
    assert "read_onyl" in result.stderr


def test_the_state_secret_reaches_the_replicas_by_either_name(compose: Compose) -> None:
    """compose passes it on (its new name, else its old one); it cannot also require it (compose-go evaluates a
    nested default's `:?` even when the outer name is set), so `make up`'s host check does, and the replicas refuse
    to start without one (test_host_checks, test_api_inprocess)."""
    for env in ({"AGENTRL_STATE_SECRET": compose.secret}, {"WEBSHOP_STATE_SECRET": compose.secret}):
        services = compose.config("--profile", "sciworld", env=env, secret=False)["services"]
        assert services["envs"]["environment"]["AGENTRL_STATE_SECRET"] == compose.secret
        assert services["sciworld"]["environment"]["AGENTRL_STATE_SECRET"] == compose.secret


def test_services_and_profiles(rendered: dict) -> None:
    services = rendered["services"]
    assert set(services) == CORE | set(PROFILED)
    for name in CORE:
        assert not services[name].get("profiles"), f"{name} must start with a plain `docker compose up`"
    for name, profiles in PROFILED.items():
        assert services[name]["profiles"] == profiles


def test_catalog_init_runs_first(rendered: dict) -> None:
    services = rendered["services"]
    init = services["catalog-init"]
    assert init["restart"] == "no"
    assert [v["target"] for v in init["volumes"]] == ["/data"]
    assert not init["volumes"][0].get("read_only"), "catalog-init writes the data volume"
    for name in ("envs", "trainer", "eval"):
        condition = services[name]["depends_on"]["catalog-init"]["condition"]
        assert condition == "service_completed_successfully", name
    assert services["envs"]["depends_on"]["catalog-init"].get("restart") is True


def test_env_replicas(rendered: dict, compose: Compose) -> None:
    webshop = rendered["services"]["envs"]
    assert webshop["deploy"]["replicas"] == 2
    assert "container_name" not in webshop, "a fixed name prevents scaling"
    assert set(webshop["networks"]) == {"envnet"}
    assert not _published(webshop) and not webshop.get("expose")
    assert webshop["environment"]["AGENTRL_STATE_SECRET"] == compose.secret
    assert webshop["environment"]["WEBSHOP_CATALOG"] == "/data/catalog"
    assert "AGENTRL_PORT" not in webshop["environment"], "the host port must not leak into the replica"
    data = next(v for v in webshop["volumes"] if v["target"] == "/data")
    assert data["read_only"] is True
    assert webshop["restart"] == "unless-stopped"
    assert any("/readyz" in part for part in webshop["healthcheck"]["test"])
    assert webshop["read_only"] is True


def test_sessions_are_durable_and_locked_down(rendered: dict) -> None:
    """The AgentGym session store keeps an append-only file, fsynced every second by default
    (SESSIONS_APPENDFSYNC), in a host directory (a restart of the store loses no acknowledged step), as a
    non-root user with a read-only root, internal only."""
    sessions = rendered["services"]["sessions"]
    command = sessions["command"]
    flags = {command[i]: command[i + 1] for i in range(1, len(command) - 1) if command[i].startswith("--")}
    assert (flags["--appendonly"], flags["--appendfsync"], flags["--save"]) == ("yes", "everysec", "")
    (data,) = sessions["volumes"]
    assert (data["type"], data["target"], flags["--dir"]) == ("bind", "/data", "/data")
    assert not data.get("read_only") and data["source"].endswith("outputs/sessions")
    assert sessions["read_only"] is True and sessions["user"].split(":")[0] not in ("0", "root")
    assert set(sessions["networks"]) == {"envnet"} and not _published(sessions)
    assert sessions["restart"] == "unless-stopped"


def test_balancer(rendered: dict) -> None:
    services = rendered["services"]
    balancer = services["balancer"]
    assert set(balancer["networks"]) == {"envnet", "default"}
    assert balancer["depends_on"]["envs"]["condition"] == "service_healthy"
    (port,) = _published(balancer)
    listen = balancer["environment"]["AGENTRL_LISTEN_PORT"]
    assert (port["target"], port["published"], port["host_ip"]) == (int(listen), "36003", "127.0.0.1")
    assert balancer["environment"]["AGENTRL_BACKEND"] == "envs:8000"
    assert balancer["environment"]["AGENTRL_RESOLVER"] == "127.0.0.11"
    assert any(f"127.0.0.1:{listen}/nginx-health" in part for part in balancer["healthcheck"]["test"])
    for name in ("trainer", "eval"):
        assert services[name]["environment"]["AGENTRL_URL"] == f"http://balancer:{listen}"
        assert services[name]["depends_on"]["balancer"]["condition"] == "service_healthy"


def test_sciworld_replicas(rendered: dict, compose: Compose) -> None:
    """SciWorld's replicas: their own image target (Java), one worker, internal network, and the balancer's
    sticky upstream pointed at them; the `webshop` replicas serve every other environment."""
    services = rendered["services"]
    sciworld = services["sciworld"]
    assert sciworld["build"]["target"] == "sciworld" and services["envs"]["build"]["target"] == "env"
    assert sciworld["image"] == "agent-envs-sciworld:local"
    assert sciworld["command"] == ["serve", "--workers", "1", "--envs", "sciworld"]
    assert sciworld["deploy"]["replicas"] == 2 and set(sciworld["networks"]) == {"envnet"}
    assert not _published(sciworld) and sciworld["read_only"] is True
    assert sciworld["environment"]["AGENTRL_STATE_SECRET"] == compose.secret
    assert sciworld["environment"]["AGENTRL_REDIS_URL"] == "redis://sessions:6379/0"
    assert sciworld["environment"]["JAVA_TOOL_OPTIONS"] == "-Xmx384m"
    balancer = services["balancer"]
    assert balancer["environment"]["AGENTRL_SCIWORLD_BACKEND"] == "sciworld:8000"
    assert balancer["depends_on"]["sciworld"]["condition"] == "service_healthy"
    assert balancer["depends_on"]["sciworld"]["required"] is False, "only with the profile sciworld"


def test_env_replicas_leave_sciworld_to_its_own(rendered: dict) -> None:
    """The `webshop` replicas serve the environments of AGENTRL_ENVS that any replica serves (their registrations'
    placement, through `serve --placement any`): SciWorld (sticky) is dropped, the rest kept in order, WebShop alone
    when nothing else is left. The filter is the one `serve` applies (`agent-envs envs --placement`)."""
    from agent_envs.cli.envs import placed

    webshop = rendered["services"]["envs"]
    assert webshop["command"] == ["serve", "--placement", "any"] and webshop.get("entrypoint") is None
    assert webshop["environment"]["AGENTRL_WORKERS"] == "4"  # serve's --workers default
    for envs, want in (
        ("webshop,textcraft,babyai,sciworld", "webshop,textcraft,babyai"),
        ("sciworld, textcraft", "textcraft"),
        ("sciworld", "webshop"),
        ("webshop", "webshop"),
    ):
        assert ",".join(placed(envs, "any")) == want, envs
    assert placed("webshop,textcraft,sciworld", "sticky") == ["sciworld"]


def test_runs_on_debians_docker_engine(rendered: dict) -> None:
    """Nothing that Compose refuses on Engine 20.10 (Debian's docker.io): healthcheck.start_interval needs 25."""
    for name, service in rendered["services"].items():
        assert "start_interval" not in service.get("healthcheck", {}), (
            f"{name}: start_interval needs Engine 25"
        )


def test_image_builds_take_base_images_and_the_ca_bundle_from_settings(compose: Compose) -> None:
    """Base images and the spaCy model source are build arguments (unset: the Dockerfiles' defaults); the extra
    CA bundle is a build secret, empty unless BUILD_CA_BUNDLE names a file."""
    default = compose.config()
    assert "args" not in default["services"]["balancer"]["build"]
    assert default["secrets"]["build_ca"]["file"] == "/dev/null"
    settings = {"PYTHON_BASE_IMAGE": "mirror.example/python:3.11", "NGINX_BASE_IMAGE": "mirror.example/nginx:1.28",
                "SPACY_MODEL": "none", "BUILD_CA_BUNDLE": "/etc/hostname"}  # fmt: skip
    config = compose.config(env=settings)
    for name in ("catalog-init", "envs"):
        build = config["services"][name]["build"]
        assert build["args"] == {"PYTHON_BASE_IMAGE": "mirror.example/python:3.11", "SPACY_MODEL": "none"}
        assert build["secrets"] == [{"source": "build_ca"}]
    assert config["services"]["balancer"]["build"]["args"] == {
        "NGINX_BASE_IMAGE": "mirror.example/nginx:1.28"
    }
    assert config["secrets"]["build_ca"]["file"] == "/etc/hostname"


def test_trainer_bases_default_to_the_dockerfiles_pins(compose: Compose) -> None:
    """Both trainer lines take their base from .env when it is set, else the Dockerfile's ARG default (the one
    `make pin-digests` rewrites to tag@digest): compose must not hard-code a tag of its own over that default."""
    default = compose.config(*compose.all_profiles)
    for name in ("trainer", "trainer-verl09"):
        assert not default["services"][name]["build"].get("args"), name
    bases = {
        "TRAINER_BASE_IMAGE": "mirror.example/sglang:v0.5.9",
        "TRAINER09_BASE_IMAGE": "mirror.example/verl:0.9",
    }
    config = compose.config(*compose.all_profiles, env=bases)
    for name, arg in (("trainer", "TRAINER_BASE_IMAGE"), ("trainer-verl09", "TRAINER09_BASE_IMAGE")):
        assert config["services"][name]["build"]["args"] == {arg: bases[arg]}, name


def test_networks(rendered: dict) -> None:
    assert rendered["networks"]["envnet"].get("internal") is True
    assert not rendered["networks"]["default"].get("internal")
    # the env replicas' service was `webshop`: its DNS name stays theirs for one release (a balancer or a client
    # configured with webshop:8000 still reaches them)
    assert rendered["services"]["envs"]["networks"]["envnet"]["aliases"] == ["webshop"]


def test_gpu_jobs(rendered: dict) -> None:
    for name in ("trainer", "trainer-verl09", "eval", "eval-verl09"):
        service = rendered["services"][name]
        (device,) = service["deploy"]["resources"]["reservations"]["devices"]
        assert device["driver"] == "nvidia" and device["capabilities"] == ["gpu"]
        assert device["device_ids"] == ["0"]
        assert service["ipc"] == "host"
        assert service["ulimits"]["nofile"] == {"soft": 65535, "hard": 65535}
        mounts = {v["target"]: v for v in service["volumes"]}
        assert mounts["/data"]["read_only"] is True
        assert not mounts["/outputs/checkpoints"].get("read_only")
        assert not mounts["/outputs/logs"].get("read_only")


def test_settings_from_the_environment_are_applied(compose: Compose) -> None:
    rendered = compose.config(
        *compose.all_profiles,
        env={"AGENTRL_REPLICAS": "3", "GPU_IDS": "0,1", "AGENTRL_PORT": "40000", "AGENTRL_BIND": "0.0.0.0",
             "DATA_DIR": "/srv/webshop-data", "AGENTRL_WORKERS": "8", "RUN_UID": "1234", "RUN_GID": "999"},
    )  # fmt: skip
    services = rendered["services"]
    assert services["envs"]["deploy"]["replicas"] == 3
    assert services["envs"]["environment"]["AGENTRL_WORKERS"] == "8"
    assert services["envs"]["command"] == ["serve", "--placement", "any"]  # --workers: $AGENTRL_WORKERS
    assert services["trainer"]["deploy"]["resources"]["reservations"]["devices"][0]["device_ids"] == ["0,1"]
    (port,) = services["balancer"]["ports"]
    assert (port["published"], port["host_ip"]) == ("40000", "0.0.0.0")
    assert services["catalog-init"]["volumes"][0]["source"] == "/srv/webshop-data"
    assert services["trainer"]["user"] == "1234:999"


def test_only_the_balancer_publishes_the_environment(rendered: dict) -> None:
    """The replicas are reachable only through nginx; TensorBoard (a UI, profile monitor) stays on loopback."""
    publishing = {name for name, service in rendered["services"].items() if _published(service)}
    assert publishing == {"balancer", "tensorboard"}
    (port,) = rendered["services"]["tensorboard"]["ports"]
    assert port["host_ip"] == "127.0.0.1"


def test_containers_run_as_non_root(rendered: dict) -> None:
    for name, service in rendered["services"].items():
        user = service.get("user")
        if user is None:
            dockerfile = REPO / service["build"]["dockerfile"]
            assert dockerfile.exists(), f"{name}: no user and no Dockerfile to take it from"
            continue  # the image's USER applies: tests/deploy/test_dockerfiles.py checks it is not root
        uid = user.split(":")[0]
        assert uid not in ("0", "root"), f"{name} runs as root"


def test_every_variable_is_documented_in_env_example() -> None:
    text = COMPOSE_FILE.read_text()
    # ${NAME}, ${NAME:-default}, ${NAME:?message} and $NAME, but not the $$ escape of container-side variables
    used = set(re.findall(r"(?<!\$)\$\{([A-Za-z_][A-Za-z0-9_]*)", text))
    used |= set(re.findall(r"(?<!\$)\$([A-Za-z_][A-Za-z0-9_]*)", text))
    documented = set(re.findall(r"^#?\s*([A-Z_][A-Z0-9_]*)=", ENV_EXAMPLE.read_text(), re.MULTILINE))
    # an old name that a new one falls back to (${AGENTRL_X:-${WEBSHOP_X:-...}}: test_old_setting_names)
    used -= {f"WEBSHOP_{name[len('AGENTRL_') :]}" for name in documented if name.startswith("AGENTRL_")}
    assert used, "no variables found: the pattern is broken"
    assert not used - documented, (
        f"used by compose.yaml but missing from .env.example: {sorted(used - documented)}"
    )
    users = text + (REPO / "mk" / "stack.mk").read_text()
    unused = {name for name in documented if not re.search(rf"\b{name}\b", users)}
    assert not unused, f"documented in .env.example but used nowhere: {sorted(unused)}"


def test_env_example_has_no_secret_value() -> None:
    """A real value would be copied into every deployment: the secret must be made per deployment."""
    assert re.search(r"^AGENTRL_STATE_SECRET=$", ENV_EXAMPLE.read_text(), re.MULTILINE)
