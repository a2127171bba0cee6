"""The registry deploys: every registered environment's declarations (``agent_envs.envs.registry``) and the files
derived from them agree, and a real nginx routes each environment as its registration asks.

- the committed deployment files (the balancer's routes and placements, the docs' list) are what the registrations
  render to now (`agent-envs envs --write-deploy` rewrites them);
- each registration says what its package does: its AgentGym routes, its step limit, its slow calls;
- the packaging names no environment by hand: the meta-extras are the registrations' extras, and the images and
  venvs install those;
- an environment that is served but not routed stops the start (the local cluster and compose's balancer), instead
  of falling through to the catch-all location;
- a real nginx with the rendered routes sends each environment's native, slow and AgentGym requests to its
  placement's replicas, with its timeouts (stand-in replicas that name their group and answer late on request).
"""

from __future__ import annotations

import contextlib
import http.server
import importlib.util
import json
import re
import shutil
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import tomllib

from agent_envs import cluster, deploy
from agent_envs.envs import registry

REPO = Path(__file__).resolve().parents[2]
REGISTRATIONS = list(registry.registrations().values())
BUILTIN = {r.id: r for r in registry.BUILTIN}


# ---- the committed files ----------------------------------------------------------------------------------------
def test_the_committed_deployment_files_are_the_registrations() -> None:
    """configs/nginx/environments/ and docs/environments/index.md's list, as `agent-envs envs --write-deploy`
    writes them from this project's registrations."""
    for path, content in deploy.render_files(REPO, list(registry.BUILTIN)).items():
        assert path.read_text() == content, f"{path} is stale: run `agent-envs envs --write-deploy`"


def test_every_registered_environment_has_routes_of_its_own() -> None:
    """Native, slow and AgentGym locations per environment, on its placement's upstream; none left to `location /`."""
    locations = deploy.nginx_locations(REGISTRATIONS)
    for r in REGISTRATIONS:
        upstream = deploy.UPSTREAM_STICKY if r.placement == "sticky" else deploy.UPSTREAM_ANY
        native = locations.split(f"        location /{r.id}/ {{\n", 1)[1].split("}", 1)[0]
        assert f"proxy_pass http://{upstream};" in native, r.id
        if r.agentgym_routes:
            assert f"/(?:{'|'.join(r.agentgym_routes)})$ {{" in locations, r.id
    placements = (REPO / "configs" / "nginx" / "environments" / "placements.txt").read_text()
    assert [line.split() for line in placements.splitlines() if not line.startswith("#")] == [
        [r.id, r.placement] for r in registry.BUILTIN
    ]


# ---- each registration and its package -------------------------------------------------------------------------
def _app_paths(env_id: str) -> set[str]:
    """The paths the app mounts for ``env_id``, from its OpenAPI document (no runtime opened: nothing is served)."""
    from agent_envs.api.app import create_app
    from agent_envs.api.settings import Settings

    app = create_app(Settings(envs=env_id, state_secret="k3N9-pQ2_vX7zL4mR8tB-wYc5", access_log=False))
    return set(app.openapi()["paths"])


@pytest.mark.parametrize("env_id", list(BUILTIN))
def test_each_registration_says_what_its_package_does(env_id: str) -> None:
    registration = BUILTIN[env_id]
    try:
        package = registry.package(env_id)
    except ImportError as error:  # its extra is not installed here
        pytest.skip(f"{env_id}'s package cannot be imported here: {error}")
    paths = _app_paths(env_id)
    for prefix in registration.prefixes:
        for route in registration.agentgym_routes:
            assert f"{prefix}/{route}" in paths, (env_id, route)
    if registration.http is None:  # the contract's routes: the package's own list, exactly
        served = [r.path.strip("/") for r in package.AGENTGYM_ROUTES if r.path != "/"]
        assert sorted(registration.agentgym_routes) == sorted(served)
    else:  # its own routes: every AgentGym-looking route it mounts under its prefix is declared
        mounted = {p.removeprefix(f"/{env_id}/") for p in paths if p.startswith(f"/{env_id}/")}
        assert set(registration.agentgym_routes) == {p for p in mounted if "/" not in p and p}
    for (
        slow
    ) in registration.slow_paths:  # each slow path is a route of the environment (path parameters filled)
        concrete = {re.sub(r"\{[^}]+\}", "7", p) for p in paths}
        assert any(re.fullmatch(f"/{env_id}/{slow}", p) for p in concrete), (env_id, slow)


def test_step_limits_are_the_cores() -> None:
    from agent_envs.api.settings import Settings

    limits = {"webshop": Settings.model_fields["max_steps"].default, "textcraft": None}
    pytest.importorskip("minigrid", reason="BabyAI: pip install -e 'services/env[babyai]'")
    if importlib.util.find_spec("gym_sokoban") is None:  # never imported: the core reads its generator's file
        pytest.skip("Sokoban: pip install -e 'services/env[sokoban]'")
    from agent_envs.envs.babyai.core import MAX_STEPS
    from agent_envs.envs.sciworld.core import MAX_ACTIONS
    from agent_envs.envs.sokoban.core import MAX_STEPS as SOKOBAN_MAX_STEPS

    limits |= {"babyai": MAX_STEPS, "sciworld": MAX_ACTIONS, "sokoban": SOKOBAN_MAX_STEPS}
    assert {env_id: r.max_steps for env_id, r in BUILTIN.items()} == limits


def test_a_registration_refuses_what_would_break_a_deployment() -> None:
    """Values end up in nginx's configuration and command lines: each is checked when the registration is made."""
    from agent_envs.envs.registration import Registration, RegistrationError

    ok = {"id": "myenv", "module": "my_env", "title": "mine"}
    Registration(**ok)
    for bad in ({"id": "my env"}, {"id": "v1"}, {"agentgym_routes": ("step; return 200",)},
                {"slow_paths": ("x { }",)}, {"system_packages": ("java && rm",)}, {"placement": "sticky"},
                {"http": "no-colon"}, {"title": "two\nlines"}, {"extra": "myenv", "requires": ("x; os.system('y')",)},
                {"requires": ("x>=1",)}, {"extra": "myenv", "pins": ("x>=1",)},
                {"extra": "myenv", "requires": ("git+https://example.com/x",)}, {"data_setting": "$(rm -rf)"}):  # fmt: skip
        with pytest.raises(RegistrationError):
            Registration(**{**ok, **bad})
    Registration(
        **ok, extra="myenv", requires=("x[y]>=1.2,<2",), pins=("x==1.5", "z==0.1"), data_setting="catalog"
    )


def test_the_environments_with_prepared_data_are_those_whose_registration_says_so() -> None:
    """What prepares data before serving (the Makefile's fragment, the demo, a Slurm job's node check) asks the
    registrations, never an environment's name."""
    assert registry.with_prepared_data(["textcraft", "webshop", "babyai"]) == ["webshop"]
    assert registry.with_prepared_data(["sokoban"]) == []
    with pytest.raises(registry.UnknownEnv):
        registry.with_prepared_data(["nosuchenv"])
    assert "PREPARED_DATA_ENVS := webshop\n" in deploy.make_fragment(REGISTRATIONS)


# ---- packaging --------------------------------------------------------------------------------------------------
def test_an_environments_dependencies_are_its_registrations(tmp_path: Path) -> None:
    """Its extra in services/env/pyproject.toml is its registration's ``requires`` and its pins in constraints.txt
    (and, needing no system package, in the TRL venv's lock) its ``pins`` (`agent-envs envs --write-deploy` writes
    them): a changed registration leaves them stale."""
    import dataclasses

    project = tomllib.loads((REPO / "services" / "env" / "pyproject.toml").read_text())["project"]
    extras = project["optional-dependencies"]
    pins = (REPO / "constraints.txt").read_text().splitlines()
    trl_lock = {
        line.lower().replace("_", "-") for line in (REPO / "constraints-trl.txt").read_text().splitlines()
    }
    for r in registry.BUILTIN:
        if r.extra is not None:
            assert extras[r.extra] == list(r.requires), r.id
        assert all(pin in pins for pin in r.pins), r.id
        assert all(pin in trl_lock for pin in r.pins) == (not r.system_packages), (
            r.id
        )  # the TRL venv: python-only
    # a copy of the repository's two files, and Sokoban's registration with a newer pin and one more requirement
    for name in (
        "services/env/pyproject.toml",
        "constraints.txt",
        "constraints-trl.txt",
        "docs/environments/index.md",
    ):
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(REPO / name, tmp_path / name)
    regs = [
        dataclasses.replace(r, requires=(*r.requires, "pillow>=10"), pins=("gym-sokoban==0.0.7", "ImageHash==4.3.1"))
        if r.id == "sokoban" else r for r in registry.BUILTIN
    ]  # fmt: skip
    written = deploy.render_files(tmp_path, regs)
    extras = tomllib.loads(written[tmp_path / "services" / "env" / "pyproject.toml"])["project"][
        "optional-dependencies"
    ]
    assert extras["sokoban"] == ["gym-sokoban==0.0.6", "pillow>=10"] and extras["spacy"] == ["spacy>=3.7"]
    constraints = written[tmp_path / "constraints.txt"].splitlines()
    assert "gym-sokoban==0.0.7" in constraints and "gym-sokoban==0.0.6" not in constraints
    assert "werkzeug==3.1.9" in constraints  # the rest of the lock is left as it is
    # the TRL venv's lock: the changed pin replaced, the new one at its sorted place, the rest as the resolver wrote it
    before = (REPO / "constraints-trl.txt").read_text().splitlines()
    lock = written[tmp_path / "constraints-trl.txt"].splitlines()
    assert "gym-sokoban==0.0.7" in lock and "gym-sokoban==0.0.6" not in lock
    assert lock[lock.index("ImageHash==4.3.1") + 1] == "imageio==2.38.1"
    assert "Farama-Notifications==0.0.6" in lock  # BabyAI's pin, as the resolver spelled it: kept
    assert [line for line in lock if line not in ("gym-sokoban==0.0.7", "ImageHash==4.3.1")] == [
        line for line in before if line != "gym-sokoban==0.0.6"
    ]
    assert not any(
        line.startswith(("scienceworld", "py4j")) for line in lock
    )  # SciWorld needs Java: not there
    # a plugin's dependencies are its own distribution's: a registration of one that declares some is refused
    with pytest.raises(registry.RegistrationError, match="own distribution"):
        _plugins_registry({"maze": dataclasses.replace(registry.registration("sokoban"), id="maze")})


def _plugins_registry(plugins: dict) -> None:
    """The registry with these registrations as installed plugins' entry points (loaded the way it loads them)."""
    from importlib import metadata
    from unittest import mock

    points = [
        mock.Mock(spec=metadata.EntryPoint, value=f"x:{k}", load=lambda v=v: v) for k, v in plugins.items()
    ]
    for point, name in zip(points, plugins, strict=True):
        point.name = name
    registry.registrations.cache_clear()
    try:
        with mock.patch.object(registry.metadata, "entry_points", return_value=points):
            registry.registrations()
    finally:
        registry.registrations.cache_clear()


def test_packaging_installs_the_registrations_extras() -> None:
    """services/env/pyproject.toml's meta-extras are the registrations' (every environment's; those needing no system
    package), and the images and venvs install them by those names, naming no environment."""
    project = tomllib.loads((REPO / "services" / "env" / "pyproject.toml").read_text())["project"]
    extras = project["optional-dependencies"]
    builtin = list(registry.BUILTIN)
    for r in builtin:
        assert r.extra is None or r.extra in extras, (
            f"{r.id}: no extra {r.extra!r} in services/env/pyproject.toml"
        )
    assert extras["agentgym"] == [f"agent-envs[{','.join(deploy.extras(builtin))}]"]
    assert extras["python-only"] == [f"agent-envs[{','.join(deploy.extras(builtin, system_free_only=True))}]"]
    dockerfile = (REPO / "docker" / "env.Dockerfile").read_text()
    build = dockerfile.split("AS build", 1)[1].split("FROM ", 1)[0]
    assert "./services/env[spacy,python-only]" in build and "agent-envs[python-only]" in build
    assert not any(f"{extra}]" in build or f"{extra}," in build for extra in deploy.extras(builtin))
    system_stage = dockerfile.split("FROM runtime AS sciworld", 1)[1].split("FROM ", 1)[0]
    for package in deploy.system_packages(builtin):
        assert f"apt-get install --yes --no-install-recommends {package}" in system_stage
    makefile = (REPO / "Makefile").read_text()
    assert "-e 'services/env[agentgym]'" in makefile and "-e 'services/env[python-only]'" in makefile


def test_the_conformance_command_offers_the_contract_environments() -> None:
    from agent_envs.cli.main import build_parser

    parser = build_parser()
    conformance = parser._subparsers._group_actions[0].choices["conformance"]  # type: ignore[union-attr]
    agentgym = conformance._subparsers._group_actions[0].choices["agentgym"]  # type: ignore[union-attr]
    env = next(action for action in agentgym._actions if action.dest == "env")
    assert env.choices == [r.id for r in REGISTRATIONS if r.http is None and r.agentgym_routes]
    assert "webshop" not in env.choices and "sciworld" in env.choices


# ---- served but not routed: a loud stop -------------------------------------------------------------------------
def test_the_balancer_refuses_an_environment_it_does_not_route(tmp_path: Path) -> None:
    """compose's balancer, with AGENTRL_ENVS naming an environment its generated routes do not have: exit 65 with
    the reason, before nginx starts (else its requests would take the catch-all location)."""
    if shutil.which("envsubst") is None:
        pytest.skip("envsubst not found (Debian package gettext-base; the nginx image has it)")
    environments = tmp_path / "environments"
    shutil.copytree(REPO / "configs" / "nginx" / "environments", environments)
    placements = environments / "placements.txt"
    placements.write_text(placements.read_text().replace("babyai any\n", ""))
    result = subprocess.run(
        ["sh", str(REPO / "docker" / "balancer" / "entrypoint.sh"), "check"], capture_output=True, text=True,
        env={"PATH": "/usr/local/bin:/usr/bin:/bin", "AGENTRL_ENVS": "webshop,babyai", "NGINX_BIN": "/bin/false",
             "AGENTRL_NGINX_TEMPLATE": str(REPO / "configs" / "nginx" / "balancer.conf.template"),
             "AGENTRL_NGINX_ENVIRONMENTS": str(environments), "AGENTRL_NGINX_RUNTIME_DIR": str(tmp_path / "run")},
        timeout=60,
    )  # fmt: skip
    assert result.returncode == 65, result.stderr
    assert "AGENTRL_ENVS names babyai, which the balancer does not route" in result.stderr


def test_the_local_cluster_refuses_an_environment_it_cannot_route(tmp_path: Path) -> None:
    with pytest.raises(cluster.ClusterError, match="unknown environment 'nope'"):
        cluster.up(replicas=1, base_port=0, port=0, run_dir=tmp_path, env={"AGENTRL_ENVS": "textcraft,nope"},
                   quiet=True)  # fmt: skip
    assert not (tmp_path / "logs").exists() or not any((tmp_path / "logs").iterdir()), "nothing was started"


def test_served_but_not_routed_is_refused() -> None:
    with pytest.raises(deploy.DeployError, match="babyai served but not routed"):
        deploy.routed_check(["webshop", "babyai"], ["webshop", "textcraft"])
    deploy.routed_check(["webshop"], registry.ids())


# ---- a real nginx routes each environment as registered -------------------------------------------------------------
class _Replica(http.server.ThreadingHTTPServer):
    """A stand-in replica: answers every request with its group's name, after ``X-Delay`` seconds."""

    def __init__(self, group: str) -> None:
        self.group = group
        super().__init__(("127.0.0.1", 0), _Answer)


class _Answer(http.server.BaseHTTPRequestHandler):
    def _answer(self) -> None:
        length = int(self.headers.get("content-length") or 0)
        self.rfile.read(length)
        time.sleep(float(self.headers.get("x-delay") or 0))
        body = json.dumps({"group": self.server.group, "path": self.path}).encode()  # type: ignore[attr-defined]
        self.send_response(200)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        with contextlib.suppress(BrokenPipeError):  # the balancer gave up waiting (the timeout test)
            self.wfile.write(body)

    do_GET = do_POST = _answer

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture(scope="module")
def balancer(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """nginx rendered as the local cluster renders it (every registration's routes), in front of two stand-in
    groups: the shared replicas ("any") and the sticky environments' ("sticky")."""
    try:
        nginx = cluster.nginx_binary()
    except cluster.ClusterError as error:
        pytest.skip(str(error))
    run = tmp_path_factory.mktemp("balancer")
    groups = {name: [_Replica(name) for _ in range(2)] for name in ("any", "sticky")}
    for replicas in groups.values():
        for replica in replicas:
            threading.Thread(target=replica.serve_forever, daemon=True).start()

    def servers(name: str) -> str:
        return "\n".join(f"        server 127.0.0.1:{r.server_address[1]} max_fails=1 fail_timeout=10s;"
                         for r in groups[name])  # fmt: skip

    port = cluster.free_ports(1)[0]
    conf = run / "nginx.conf"
    conf.write_text(cluster.render_nginx_conf({
        "AGENTRL_UPSTREAMS": "        zone env_upstreams 256k;\n" + servers("any"),
        "AGENTRL_AFFINITY_UPSTREAMS": "        zone affinity_upstreams 256k;\n" + servers("sticky"),
        "AGENTRL_LISTEN_PORT": f"127.0.0.1:{port}", "AGENTRL_NGINX_RUNTIME_DIR": str(run),
        "AGENTRL_NGINX_ACCESS_LOG": str(run / "access.log"), "AGENTRL_NGINX_ERROR_LOG": str(run / "error.log"),
    }))  # fmt: skip
    process = subprocess.Popen([nginx, "-p", str(run), "-c", str(conf)], stdout=subprocess.DEVNULL,
                               stderr=subprocess.DEVNULL, start_new_session=True)  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    try:
        for _ in range(200):
            if cluster.http_status(url + "/nginx-health") == 200:
                break
            time.sleep(0.05)
        yield url
    finally:
        process.terminate()
        process.wait(timeout=10)
        for replicas in groups.values():
            for replica in replicas:
                replica.shutdown()


def _slow_example(pattern: str) -> str:
    """A path a slow-path regex matches (``v1/tasks/[0-9]+/expert`` -> ``v1/tasks/7/expert``)."""
    return re.sub(r"\[\^/\]\+|\[0-9\]\+", "7", pattern)


@pytest.mark.parametrize("registration", REGISTRATIONS, ids=[r.id for r in REGISTRATIONS])
def test_nginx_routes_each_environment_to_its_placement(balancer: str, registration) -> None:
    want = registration.placement
    with httpx.Client(base_url=balancer, timeout=30) as client:
        for prefix in registration.prefixes:
            requests = [("POST", f"{prefix}/v1/step"), ("GET", f"{prefix}/v1/info")]
            requests += [("POST", f"{prefix}/{route}") for route in registration.agentgym_routes]
            requests += [("GET", f"{prefix}/{_slow_example(p)}") for p in registration.slow_paths]
            for method, path in requests:
                answer = client.request(
                    method, path, json={"id": 5, "env_idx": 5} if method == "POST" else None
                )
                assert (answer.status_code, answer.json()["group"]) == (200, want), (method, path)
        assert client.get("/readyz").json()["group"] == "any"  # the service's own routes: any replica


def test_nginx_gives_each_environment_its_timeouts(balancer: str) -> None:
    """An answer after 3 s: a sticky environment's step gets it (read timeout 60 s), so does an environment's slow
    call (10 s); a stateless environment's step does not (2 s: the balancer gives the replica up)."""
    sticky = next(r for r in REGISTRATIONS if r.placement == "sticky")
    stateless = next(r for r in REGISTRATIONS if r.placement == "any" and not r.root_alias)
    late = {"x-delay": "3"}
    with httpx.Client(base_url=balancer, timeout=60) as client:
        assert client.post(f"/{sticky.id}/v1/step", json={}, headers=late).status_code == 200
        slow = _slow_example(stateless.slow_paths[0])
        assert client.get(f"/{stateless.id}/{slow}", headers=late).status_code == 200
        assert client.post(f"/{stateless.id}/v1/step", json={}, headers=late).status_code in (502, 504)
