"""The Dockerfiles, checked statically (no Docker engine here): hadolint, non-root final stage, pinned bases,
health checks, and a .dockerignore that sends the builder what the images COPY and nothing secret."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
DOCKERFILES = [
    REPO / "docker" / "env.Dockerfile",
    REPO / "docker" / "trainer.Dockerfile",
    REPO / "docker" / "balancer" / "Dockerfile",
    REPO / "docker" / "tensorboard.Dockerfile",
    REPO / "docker" / "trainer-verl09.Dockerfile",
]
IDS = [str(p.relative_to(REPO)) for p in DOCKERFILES]


def _instructions(path: Path) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) pairs with line continuations joined and comments dropped."""
    joined, current = [], ""
    for line in path.read_text().splitlines():
        stripped = line.strip()
        if not current and (not stripped or stripped.startswith("#")):
            continue
        if stripped.startswith("#"):
            continue  # a comment inside a continued instruction
        if stripped.endswith("\\"):
            current += stripped[:-1] + " "
            continue
        joined.append(current + stripped)
        current = ""
    pairs = []
    for text in joined:
        keyword, _, rest = text.partition(" ")
        pairs.append((keyword.upper(), rest.strip()))
    return pairs


def _from_image(path: Path, args: str) -> str:
    """The image of a FROM line, with the ARG defaults declared before the first FROM substituted."""
    defaults = {}
    for keyword, rest in _instructions(path):
        if keyword == "FROM":
            break
        if keyword == "ARG" and "=" in rest:
            name, _, value = rest.partition("=")
            defaults[name] = value
    image = next(a for a in args.split() if not a.startswith("--"))
    return re.sub(r"\$\{(\w+)\}|\$(\w+)", lambda m: defaults.get(m.group(1) or m.group(2), m.group(0)), image)


def _stage_names(path: Path) -> set[str]:
    """Names given with ``FROM ... AS name``: a FROM naming one builds on that stage, not on an image."""
    return {
        args.split()[-1]
        for keyword, args in _instructions(path)
        if keyword == "FROM" and " AS " in f" {args.upper()} "
    }


def _stage(path: Path, index: int) -> list[tuple[str, str]]:
    """The instructions of the stage starting at ``index``, after those of the stage it builds on (if any)."""
    instructions = _instructions(path)
    end = next(
        (i for i in range(index + 1, len(instructions)) if instructions[i][0] == "FROM"), len(instructions)
    )
    base = next(a for a in instructions[index][1].split() if not a.startswith("--"))
    parent = next(
        (
            i
            for i, (k, a) in enumerate(instructions[:index])
            if k == "FROM" and a.split()[-1] == base and " AS " in f" {a.upper()} "
        ),
        None,
    )
    return (_stage(path, parent) if parent is not None else []) + instructions[index:end]


def _final_stage(path: Path) -> list[tuple[str, str]]:
    """The default target's instructions (with those of the stages it builds on first)."""
    instructions = _instructions(path)
    return _stage(path, max(i for i, (keyword, _) in enumerate(instructions) if keyword == "FROM"))


@pytest.mark.parametrize("dockerfile", DOCKERFILES, ids=IDS)
def test_hadolint_clean(hadolint: str, dockerfile: Path) -> None:
    result = subprocess.run(
        [hadolint, "--no-color", str(dockerfile)], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_hadolint_really_lints(hadolint: str, tmp_path: Path) -> None:
    """Control: an unpinned base and an unpinned apt install are reported."""
    bad = tmp_path / "Dockerfile"
    bad.write_text("FROM python\nRUN apt-get update && apt-get install -y curl\n")
    result = subprocess.run([hadolint, "--no-color", str(bad)], capture_output=True, text=True, timeout=60)
    assert result.returncode != 0
    assert "DL3006" in result.stdout and "DL3008" in result.stdout


@pytest.mark.parametrize("dockerfile", DOCKERFILES, ids=IDS)
def test_final_stage_runs_as_non_root(dockerfile: Path) -> None:
    users = [args for keyword, args in _final_stage(dockerfile) if keyword == "USER"]
    assert users, f"{dockerfile.name}: the final stage sets no USER, so it runs as root"
    user = users[-1].split(":")[0]
    assert user not in ("root", "0"), f"{dockerfile.name} ends as {users[-1]}"


@pytest.mark.parametrize("dockerfile", DOCKERFILES, ids=IDS)
def test_base_images_are_pinned(dockerfile: Path) -> None:
    text = dockerfile.read_text()
    stages = _stage_names(dockerfile)
    for keyword, args in _instructions(dockerfile):
        if keyword != "FROM" or args.split()[0] in stages:
            continue
        image = _from_image(dockerfile, args)
        name, _, tag = image.partition("@")[0].rpartition(":")
        assert name and tag and tag != "latest", f"{dockerfile.name}: FROM {image} is not pinned to a version"
    # no placeholder digest: every digest written down is 64 hex digits; a tag-only FROM says how to pin it
    for match in re.finditer(r"@sha256:(\S*)", text):
        assert re.fullmatch(r"[0-9a-f]{64}", match.group(1).rstrip(".,;)'\"")), (
            f"{dockerfile.name}: placeholder or malformed digest @sha256:{match.group(1)}"
        )


def test_env_image_contract() -> None:
    path = REPO / "docker" / "env.Dockerfile"
    final = dict(_final_stage(path))
    assert final["ENTRYPOINT"] == '["agent-envs"]'
    assert re.fullmatch(r'\["serve", "--workers", "\d+"\]', final["CMD"])
    assert "/healthz" in final["HEALTHCHECK"] and "python" in final["HEALTHCHECK"]
    assert "WEBSHOP_CATALOG=/data/catalog" in final["ENV"] and "AGENTRL_PORT=8000" in final["ENV"]
    text = path.read_text()
    assert "--constraint constraints.txt" in text
    assert "en_core_web_sm" in text and "#sha256=" in text, "the spaCy model is pinned by hash"
    stages = _stage_names(path)
    froms = [args for k, args in _instructions(path) if k == "FROM"]
    assert [a.split()[-1] for a in froms if a.split()[0] not in stages] == [
        "build",
        "sciworld-wheels",
        "runtime",
    ]
    assert final["FROM"] == "runtime AS env", "the default target is the runtime stage, without Java"


def test_sciworld_image_contract() -> None:
    """The sciworld target: the env runtime plus Debian's headless Java 17 and scienceworld, as a non-root user,
    serving SciWorld alone with one worker (the JVM pool is per process)."""
    path = REPO / "docker" / "env.Dockerfile"
    instructions = _instructions(path)
    index = next(i for i, (k, a) in enumerate(instructions) if k == "FROM" and a == "runtime AS sciworld")
    stage = _stage(path, index)
    own = "\n".join(args for _, args in instructions[index:])
    assert "openjdk-17-jre-headless" in own and "--no-index --find-links=/sciworld-wheels scienceworld" in own
    assert [a for k, a in stage if k == "USER"][-1] == "10001:10001"
    assert dict(stage)["CMD"] == '["serve", "--workers", "1", "--envs", "sciworld"]'
    assert dict(stage)["ENTRYPOINT"] == '["agent-envs"]'


def test_trainer_image_contract() -> None:
    path = REPO / "docker" / "trainer.Dockerfile"
    instructions = _instructions(path)
    first_from = next(args for keyword, args in instructions if keyword == "FROM")
    assert _from_image(path, first_from).partition("@")[0] == "lmsysorg/sglang:v0.5.9"
    runs = [args for keyword, args in instructions if keyword == "RUN"]
    assert any("pip install --no-deps verl==0.7.1" in run for run in runs)
    assert any("--constraint image-lock.txt --constraint trainer-extra.txt" in run for run in runs)
    assert dict(instructions)["ENTRYPOINT"] == '["agent-train"]'
    constraints = (REPO / "docker" / "trainer-constraints.txt").read_text()
    pinned = re.findall(r"^([A-Za-z0-9_.-]+)==", constraints, re.MULTILINE)
    assert "numpy" in pinned
    for untouchable in ("torch", "sglang", "flash-attn", "flash_attn", "transformers", "vllm"):
        assert untouchable not in pinned, (
            f"trainer-constraints.txt must not pin {untouchable} (the image's wins)"
        )


def test_balancer_image_contract() -> None:
    path = REPO / "docker" / "balancer" / "Dockerfile"
    final = dict(_final_stage(path))
    version = re.search(r"nginx:(\d+)\.(\d+)\.(\d+)", _from_image(path, final["FROM"]))
    assert version and tuple(map(int, version.groups())) >= (1, 27, 3), "`resolve` needs nginx >= 1.27.3"
    assert "/nginx-health" in final["HEALTHCHECK"]
    assert "configs/nginx/balancer.conf.template" in path.read_text(), "the ONE template, not a copy"


@pytest.mark.parametrize("dockerfile", [DOCKERFILES[0], DOCKERFILES[2]], ids=[IDS[0], IDS[2]])
def test_builds_need_no_registry_but_the_bases(dockerfile: Path) -> None:
    """No `syntax` line (BuildKit would pull that frontend image: the engine's built-in frontend must do), and
    every FROM is a build argument with today's tag as its default, so a mirror is one setting in .env."""
    text = dockerfile.read_text()
    assert not re.search(r"^#\s*syntax\s*=", text, re.MULTILINE | re.IGNORECASE)
    instructions = _instructions(dockerfile)
    first_from = next(i for i, (keyword, _) in enumerate(instructions) if keyword == "FROM")
    declared = {rest.partition("=")[0] for keyword, rest in instructions[:first_from] if keyword == "ARG"}
    stages = _stage_names(dockerfile)
    for keyword, args in instructions:
        if keyword == "FROM" and args.split()[0] not in stages:
            image = next(a for a in args.split() if not a.startswith("--"))
            assert re.fullmatch(r"\$\{(\w+)\}", image) and image[2:-1] in declared, f"FROM {image}"


def test_env_image_spacy_model_and_ca_bundle_options() -> None:
    """SPACY_MODEL url|wheel|none, and the extra CA bundle only as a secret mount of the build stage."""
    path = REPO / "docker" / "env.Dockerfile"
    instructions = _instructions(path)
    final_from = max(i for i, (keyword, _) in enumerate(instructions) if keyword == "FROM")
    build_stage, final_stage = instructions[:final_from], instructions[final_from:]
    assert ("ARG", "SPACY_MODEL=url") in build_stage
    build_runs = " ".join(args for keyword, args in build_stage if keyword == "RUN")
    for mode in ("url|wheel)", "none)", "spacy-model/en_core_web_sm-*.whl"):
        assert mode in build_runs
    assert "--mount=type=secret,id=build_ca" in build_runs and "PIP_CERT" in build_runs
    final_text = " ".join(args for _, args in final_stage)
    assert "build_ca" not in final_text and "PIP_CERT" not in final_text
    # no CA bundle as a build argument or environment variable (those end up in the image's history/config)
    assert not any(
        keyword in ("ARG", "ENV") and re.search(r"(CERT|CA_BUNDLE|BUILD_CA)\w*=", args)
        for keyword, args in instructions
    )


# ---- .dockerignore ---------------------------------------------------------------------------------------------------
def _dockerignore_matcher(text: str):
    """BuildKit's rule: patterns apply in order, the last one matching the path or a parent decides."""
    rules = []
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        negate = line.startswith("!")
        pattern = line[1:] if negate else line
        pattern = pattern.strip("/")
        regex = ""
        i = 0
        while i < len(pattern):
            if pattern.startswith("**/", i):
                regex, i = regex + "(?:.*/)?", i + 3
            elif pattern.startswith("**", i):
                regex, i = regex + ".*", i + 2
            elif pattern[i] == "*":
                regex, i = regex + "[^/]*", i + 1
            elif pattern[i] == "?":
                regex, i = regex + "[^/]", i + 1
            else:
                regex, i = regex + re.escape(pattern[i]), i + 1
        rules.append((re.compile(regex + r"\Z"), negate))

    def excluded(path: str) -> bool:
        parts = path.strip("/").split("/")
        candidates = ["/".join(parts[: n + 1]) for n in range(len(parts))]
        result = False
        for regex, negate in rules:
            if any(regex.match(candidate) for candidate in candidates):
                result = not negate
        return result

    return excluded


def test_dockerignore_sends_what_the_images_copy_and_nothing_secret() -> None:
    excluded = _dockerignore_matcher((REPO / ".dockerignore").read_text())
    copied = []
    for dockerfile in DOCKERFILES:
        for keyword, args in _instructions(dockerfile):
            if keyword in ("COPY", "ADD") and "--from=" not in args:
                copied += [a for a in args.split()[:-1] if not a.startswith("--")]
    assert copied
    for source in copied:
        assert not excluded(source), f"{source} is COPYed but .dockerignore excludes it"
    for needed in ("services/env/pyproject.toml", "services/env/README.md", "services/env/src/agent_envs/cli/main.py",
                   "configs/nginx/balancer.conf.template", "docker/balancer/entrypoint.sh"):  # fmt: skip
        assert not excluded(needed), needed
    for private in (".env", ".venv/bin/python", "data/catalog/manifest.json", "outputs/checkpoints/x", ".git/HEAD",
                    "run/local/state_secret", "services/env/src/agent_envs.egg-info/PKG-INFO",
                    "services/env/src/agent_envs/__pycache__/app.cpython-311.pyc", "tests/conftest.py"):  # fmt: skip
        assert excluded(private), private
