"""``agent-envs envs``: the registered environments (this project's and installed plugins'), and the deployment
files derived from them (``agent_envs.deploy``)."""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import asdict
from pathlib import Path

from .. import deploy
from ..envs import registry


def cmd_envs(args: argparse.Namespace) -> int:
    try:
        registrations = list(registry.registrations().values())
        if args.placement is not None:
            print(",".join(placed(args.of, args.placement)))
            return 0
    except (registry.UnknownEnv, registry.RegistrationError) as error:
        print(f"agent-envs envs: error: {error}", file=sys.stderr)
        return 2
    if args.write_deploy or args.check_deploy:
        return _deploy_files(Path(args.repo), write=args.write_deploy)
    if args.json:
        print(json.dumps([asdict(r) for r in registrations], indent=2))
        return 0
    print(f"{'id':<12}{'placement':<11}{'extra':<11}{'system packages':<26}title")
    for r in registrations:
        packages = ",".join(r.system_packages) or "-"
        print(f"{r.id:<12}{r.placement:<11}{r.extra or '-':<11}{packages:<26}{r.title}")
    return 0


def placed(envs: str | None, placement: str) -> list[str]:
    """The environments of ``envs`` (``AGENTRL_ENVS``'s form) with ``placement``, in order; none: the default
    environment (a replica must serve one)."""
    default = deploy.parse_envs(None)
    return deploy.served_envs(deploy.parse_envs(envs), placement) or default  # type: ignore[arg-type]


def _deploy_files(repo: Path, write: bool) -> int:
    stale = []
    for path, content in deploy.render_files(repo).items():
        if path.exists() and path.read_text() == content:
            continue
        stale.append(path)
        if write:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(content)
    for path in stale:
        print(f"{'wrote' if write else 'stale'}: {path}")
    return 1 if stale and not write else 0


def add_commands(commands: argparse._SubParsersAction) -> None:
    p = commands.add_parser(
        "envs",
        help="the registered environments and the deployment files derived from them",
        description="Lists every registered environment (this project's and installed plugins', entry point group "
        f"{registry.ENTRY_POINT_GROUP}): placement, extra, system packages. --placement prints those of a "
        "AGENTRL_ENVS list with that placement (what a replica group serves); --write-deploy writes the files "
        "derived from the registrations (the balancer's routes and placements, the docs' list, the env package's "
        "extras, the pins in constraints.txt and constraints-trl.txt), --check-deploy says which differ.",
    )
    p.add_argument("--json", action="store_true", help="every registration as JSON")
    p.add_argument("--placement", choices=["any", "sticky"], default=None,
                   help="print the environments of --of with this placement (comma-separated)")  # fmt: skip
    p.add_argument("--of", default=None, help="with --placement: a AGENTRL_ENVS list (default: webshop)")
    p.add_argument("--write-deploy", action="store_true", help="write the derived files into --repo")
    p.add_argument("--check-deploy", action="store_true", help="exit 1 when a derived file in --repo differs")
    p.add_argument("--repo", default=".", help="the repository root (default: the working directory)")
    p.set_defaults(func=cmd_envs)
