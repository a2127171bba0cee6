"""scripts/host_checks.py: what `make up` and `make setup` check before anything is built, and the one message
each gives. Decisions are tested on facts read from the real files (.env.example, env.Dockerfile, /proc);
the engine-dependent probes were run against a real engine (see the README's "Run it with Docker")."""

from __future__ import annotations

import hashlib
import importlib.util
import re
import resource
import shutil
import socket
import sys
from pathlib import Path
from types import ModuleType

import pytest

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "scripts" / "host_checks.py"


def load() -> ModuleType:
    spec = importlib.util.spec_from_file_location("host_checks", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["host_checks"] = module  # dataclasses resolve their module by name
    spec.loader.exec_module(module)
    return module


hc = load()


def example_settings() -> dict[str, str]:
    """.env.example with the state secret `make up` writes into the .env it makes from it."""
    return {**hc.read_env_file(REPO / ".env.example"), "AGENTRL_STATE_SECRET": "k3N9-pQ2_vX7zL4mR8tB-wYc5"}


def test_an_empty_state_secret_is_named_and_an_old_env_files_counts(tmp_path: Path) -> None:
    facts = hc.UpFacts(settings={**example_settings(), "AGENTRL_STATE_SECRET": ""}, engine=True,
                       nofile_hard=1048576)  # fmt: skip
    assert any(p.startswith("AGENTRL_STATE_SECRET is empty") for p in hc.up_problems(facts))
    old = tmp_path / "old.env"
    old.write_text("WEBSHOP_STATE_SECRET=k3N9-pQ2_vX7zL4mR8tB-wYc5\nWEBSHOP_NOFILE=2048\n")
    settings = hc.settings_from(old, {})
    assert (
        settings["AGENTRL_STATE_SECRET"] == "k3N9-pQ2_vX7zL4mR8tB-wYc5"
        and settings["AGENTRL_NOFILE"] == "2048"
    )
    assert hc.settings_from(old, {"AGENTRL_NOFILE": "4096"})["AGENTRL_NOFILE"] == "4096"  # the new name wins


def test_env_file_is_read_as_compose_reads_it(tmp_path: Path) -> None:
    settings = example_settings()
    assert settings["AGENTRL_NOFILE"] == "65535" and settings["BUILD_CA_BUNDLE"] == ""
    assert "SPACY_MODEL" not in settings  # commented out: the Dockerfile's default
    env = tmp_path / ".env"
    env.write_text("# c\nA='quoted value'\nB=\"x\"\n\nC=plain=with=equals\n")
    assert hc.read_env_file(env) == {"A": "quoted value", "B": "x", "C": "plain=with=equals"}
    assert hc.read_env_file(tmp_path / "missing") == {}


def test_the_spacy_model_pin_is_the_env_images() -> None:
    url, sha256 = hc.spacy_model_pin()
    dockerfile = (REPO / "docker" / "env.Dockerfile").read_text()
    assert f"ARG SPACY_MODEL_URL={url}#sha256={sha256}\n" in dockerfile
    assert url.endswith("/en_core_web_sm-3.8.0-py3-none-any.whl") and re.fullmatch(r"[0-9a-f]{64}", sha256)


def test_open_files_hard_limit_is_read_from_proc() -> None:
    hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    parsed = hc.parse_nofile_hard(Path("/proc/self/limits").read_text())
    assert parsed == (None if hard == resource.RLIM_INFINITY else hard)
    assert (
        hc.parse_nofile_hard("Max open files            1024                 unlimited            files\n")
        is None
    )


def fake_proc(root: Path, pid: int, cmdline: list[str], comm: str = "dockerd") -> None:
    """A /proc entry for a process: its real limits (this process's), and the given name and command line."""
    entry = root / str(pid)
    entry.mkdir(parents=True)
    (entry / "comm").write_text(comm + "\n")
    (entry / "cmdline").write_bytes("\0".join(cmdline).encode() + b"\0")
    shutil.copy("/proc/self/limits", entry / "limits")


def test_the_engines_limit_is_the_dockerd_behind_docker_host(tmp_path: Path) -> None:
    own = hc.parse_nofile_hard(Path("/proc/self/limits").read_text())
    fake_proc(tmp_path, 10, ["dockerd", "-H", "unix:///run/test/docker.sock", "--data-root", "/x"])
    fake_proc(tmp_path, 11, ["containerd"], comm="containerd")
    assert hc.engine_nofile_hard("unix:///run/test/docker.sock", proc=tmp_path) == own
    assert hc.engine_nofile_hard("unix:///run/other.sock", proc=tmp_path) is None
    assert hc.engine_nofile_hard("tcp://10.0.0.2:2376", proc=tmp_path) is None  # a remote engine: unknown
    assert hc.engine_nofile_hard(None, proc=tmp_path) is None  # the CLI's default socket: not that dockerd's
    fake_proc(tmp_path, 12, ["/usr/bin/dockerd"])  # one on the default socket
    assert hc.engine_nofile_hard(None, proc=tmp_path) == own
    assert hc.engine_nofile_hard("unix:///var/run/docker.sock", proc=tmp_path) == own
    assert hc.engine_nofile_hard("unix:///run/docker.sock", proc=tmp_path) == own
    fake_proc(
        tmp_path, 13, ["dockerd", "--host=unix:///run/docker.sock"]
    )  # two on it: which one? not guessed
    assert hc.engine_nofile_hard(None, proc=tmp_path) is None


def test_a_new_env_gets_a_nofile_the_engine_allows() -> None:
    assert hc.fitting_nofile(None) == 65535
    assert hc.fitting_nofile(20000) == 20000
    assert hc.fitting_nofile(1048576) == 65535


def good_facts(**changes: object) -> object:
    facts = hc.UpFacts(settings=example_settings(), engine=True, nofile_hard=1048576,
                       images={"python:3.11.13-slim-bookworm": "present", "nginx:1.28.0-alpine": "pullable"})  # fmt: skip
    for key, value in changes.items():
        setattr(facts, key, value)
    return facts


def test_nothing_to_say_when_everything_is_there() -> None:
    assert hc.up_problems(good_facts()) == []


def test_every_problem_of_a_machine_like_this_one_in_one_message() -> None:
    """No registry, a TLS-intercepting proxy, GitHub unreachable, an engine started from a shell with 20000 files."""
    facts = good_facts(
        nofile_hard=20000,
        images={
            "python:3.11.13-slim-bookworm": "missing",
            "nginx:1.28.0-alpine": "missing",
            "redis:7.4.2-alpine": "present",
        },  # fmt: skip
        tls_intercepted=True,
        host_bundle="/etc/ssl/certs/ca-certificates.crt",
        spacy_url_error="[Errno -2] Name or service not known",
    )
    problems = hc.up_problems(facts)
    assert len(problems) == 4
    nofile, images, tls, spacy = problems
    assert "set AGENTRL_NOFILE=20000" in nofile and "rlimit type 7" in nofile
    assert "python:3.11.13-slim-bookworm, nginx:1.28.0-alpine" in images and "make docker-standins" in images
    assert "redis" not in images
    assert "set BUILD_CA_BUNDLE=/etc/ssl/certs/ca-certificates.crt" in tls
    assert "SPACY_MODEL=none" in spacy and "SPACY_MODEL=wheel" in spacy


def test_settings_that_fix_them_silence_them(tmp_path: Path) -> None:
    bundle = tmp_path / "ca.pem"
    bundle.write_text("-----BEGIN CERTIFICATE-----\n")
    settings = {
        **example_settings(),
        "AGENTRL_NOFILE": "20000",
        "BUILD_CA_BUNDLE": str(bundle),
        "SPACY_MODEL": "none",
    }
    facts = good_facts(settings=settings, nofile_hard=20000, tls_intercepted=True, host_bundle="/x",
                       spacy_url_error="unreachable")  # fmt: skip
    assert hc.up_problems(facts) == []


def test_bad_settings_are_named() -> None:
    settings = {**example_settings(), "AGENTRL_NOFILE": "lots", "BUILD_CA_BUNDLE": "/nonexistent/ca.pem",
                "SPACY_MODEL": "wheel"}  # fmt: skip
    problems = hc.up_problems(good_facts(settings=settings, spacy_wheels=[]))
    assert any("AGENTRL_NOFILE=lots is not a number" in p for p in problems)
    assert any("BUILD_CA_BUNDLE=/nonexistent/ca.pem is not a file" in p for p in problems)
    assert any("exactly one en_core_web_sm-*.whl" in p for p in problems)
    typo = hc.up_problems(good_facts(settings={**example_settings(), "SPACY_MODEL": "URL"}))
    assert typo == ["SPACY_MODEL must be url, wheel or none (got 'URL')"]


def test_no_engine_is_the_one_thing_to_fix_first() -> None:
    facts = hc.UpFacts(settings=example_settings(), engine=False, engine_error="Cannot connect")
    assert hc.up_problems(facts) == [
        "no Docker engine answers `docker info` (Cannot connect): start one, or point DOCKER_HOST at it"
    ]


def test_a_url_that_does_not_answer_is_reported_quickly() -> None:
    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    reason = hc.probe_url(f"http://127.0.0.1:{port}/model.whl", timeout=5)
    assert reason is not None and "refused" in reason.lower()


def test_setup_without_the_model_says_so_loudly_and_goes_on(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
) -> None:
    """The model URL does not answer (here: a closed local port): one warning with the three ways out, exit 3
    (make setup carries on), and nothing installed."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        url = f"http://127.0.0.1:{s.getsockname()[1]}/en_core_web_sm-3.8.0-py3-none-any.whl"
    monkeypatch.setattr(hc, "spacy_model_pin", lambda: (url, "0" * 64))
    monkeypatch.setattr(hc, "installed_version", lambda name: None)
    monkeypatch.setattr(hc, "SPACY_WHEEL_DIR", Path("/nonexistent"))
    installed: list[str] = []
    monkeypatch.setattr(hc, "install_spacy", lambda requirement, constraints: installed.append(requirement))
    assert hc.main(["spacy"]) == hc.HEURISTIC_EXIT
    warning = capsys.readouterr().err
    assert warning.count("WARNING") == 1 and "title nouns will be HEURISTIC" in warning and url in warning
    for fix in ("make spacy ", "make spacy SPACY_MODEL_WHEEL=FILE", "--pin-title-nouns"):
        assert fix in warning
    assert installed == []


def test_only_the_pinned_wheel_is_installed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys) -> None:
    """A wheel file is hashed first: another build of the model (other nouns) is refused, loudly, untouched."""
    wheel = tmp_path / "en_core_web_sm-3.8.0-py3-none-any.whl"
    wheel.write_bytes(b"not the official wheel")
    monkeypatch.setattr(hc, "installed_version", lambda name: None)
    installed: list[str] = []
    monkeypatch.setattr(hc, "install_spacy", lambda requirement, constraints: installed.append(requirement))
    assert hc.main(["spacy", "--wheel", str(wheel)]) == hc.HEURISTIC_EXIT
    assert "is not the pinned wheel" in capsys.readouterr().err and installed == []
    _, sha256 = hc.spacy_model_pin()
    monkeypatch.setattr(hc, "spacy_model_pin", lambda: ("https://example.invalid/m.whl", hashlib.sha256(
        wheel.read_bytes()).hexdigest()))  # fmt: skip
    assert hc.main(["spacy", "--wheel", str(wheel)]) == 0
    assert installed == [
        f"en_core_web_sm @ {wheel.as_uri()} --hash=sha256:{hashlib.sha256(wheel.read_bytes()).hexdigest()}"
    ]


def test_make_spacys_model_counts_as_spacy(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
) -> None:
    """After `make spacy` (the PyPI re-package), a later setup neither warns nor downloads: spaCy's nouns are here."""
    versions = {"spacy": "3.8.18", hc.REPACKAGED_MODEL: "3.8.0"}
    monkeypatch.setattr(hc, "installed_version", versions.get)
    monkeypatch.setattr(hc, "probe_url", lambda *a, **k: pytest.fail("nothing to download"))
    assert hc.main(["spacy"]) == 0
    out = capsys.readouterr()
    assert hc.REPACKAGED_MODEL in out.out and "HEURISTIC" not in out.err
    assert f"{hc.REPACKAGED_MODEL}==" in (REPO / "requirements-spacy-model.txt").read_text()
