"""``agent-envs conformance record|check``: the command-line side of agent_envs.envs.webshop.conformance."""

from __future__ import annotations

import argparse
import gzip
import importlib
import json
import sys
import tempfile
from pathlib import Path


def _episode_counts(text: str) -> dict[str, int]:
    counts: dict[str, int] = {}
    for item in text.split(","):
        name, _, number = item.partition("=")
        if name.strip() not in ("synthetic", "human") or not number.strip().isdigit():
            raise argparse.ArgumentTypeError(f"expected e.g. synthetic=90,human=30, got {text!r}")
        counts[name.strip()] = int(number)
    return counts


def _num_products(text: str) -> int | None:
    return None if text.lower() in ("all", "none") else int(text)


def cmd_record(args: argparse.Namespace) -> int:
    from ..envs.webshop.conformance.adapter import AdapterError, LocalAdapter, OriginalAdapter
    from ..envs.webshop.conformance.record import record

    try:
        if args.original is not None:
            env = OriginalAdapter(args.original, args.raw, num_products=args.num_products, seed=args.rng_seed)
            meta = {"rng": f"random.seed({args.rng_seed}) before loading", "num_products": args.num_products}
        else:
            env = LocalAdapter(args.catalog)
            meta = {"self_test": True}
    except AdapterError as error:
        print(f"agent-envs: error: {error}", file=sys.stderr)
        return 2
    try:
        summary = record(
            env,
            args.raw,
            args.out,
            episodes=args.episodes,
            seed=args.seed,
            meta=meta,
            progress=not args.quiet,
        )
    finally:
        env.close()
    print(json.dumps(summary, indent=1))
    return 0


def cmd_check(args: argparse.Namespace) -> int:
    from ..envs.webshop.conformance.check import check_traces, format_report, prepare_for_traces

    unpin = frozenset(x for x in (args.unpin or "").split(",") if x)
    with tempfile.TemporaryDirectory(prefix="webshop-conformance-") as scratch:
        catalog = args.catalog
        if catalog is None:
            catalog = Path(scratch) / "catalog"
            prepare_for_traces(
                args.traces, catalog, unpin=unpin, num_products=args.num_products, progress=not args.quiet
            )
        elif unpin:
            raise SystemExit("--unpin applies when check prepares the catalog itself (leave out --catalog)")
        summary = check_traces(
            args.traces, catalog, max_differences=args.max_differences, progress=not args.quiet
        )
    if args.summary:
        Path(args.summary).write_text(json.dumps(summary, indent=1))
    print(json.dumps(summary, indent=1) if args.json else format_report(summary))
    return 0 if summary["equal"] == summary["steps"] and summary["goals_differ"] == 0 else 1


def replayable() -> list[str]:
    """The environments whose AgentGym routes are the contract's (``AGENTGYM_ROUTES``, replayed in process by
    ``envs.agentgym``); WebShop's are its own (``conformance check`` replays the original's episodes)."""
    from ..envs import registry

    return [env_id for env_id in registry.contract_ids() if registry.registration(env_id).agentgym_routes]


def cmd_agentgym(args: argparse.Namespace) -> int:
    """Replay AgentGym's recordings of one environment, in process or against a server's ``<url>/<env>``."""
    from ..envs import registry
    from ..envs.agentgym import InProcessAgentGym, replay_trace

    traces_dir = args.traces or Path("tests/fixtures/conformance") / f"agentgym-{args.env}"
    path = traces_dir
    if traces_dir.is_dir():  # traces.jsonl, or gzipped (the larger oracle recordings)
        path = next((traces_dir / name for name in ("traces.jsonl", "traces.jsonl.gz")
                     if (traces_dir / name).exists()), traces_dir / "traces.jsonl")  # fmt: skip
    if not path.exists():
        print(f"agent-envs: error: no traces at {path} (give --traces DIR)", file=sys.stderr)
        return 2
    text = gzip.decompress(path.read_bytes()).decode() if path.suffix == ".gz" else path.read_text()
    episodes = [json.loads(line) for line in text.splitlines() if line.strip()]
    try:  # where a package keeps its AgentGym side (and the differences its docs list)
        agentgym_module = importlib.import_module(f"{registry.registration(args.env).module}.agentgym")
    except ModuleNotFoundError:
        agentgym_module = registry.package(args.env)
    documented = getattr(agentgym_module, "documented_difference", lambda difference: False)
    if args.limit:
        episodes = episodes[: args.limit]
    if args.url:
        import httpx

        base = args.url.rstrip("/") + f"/{args.env}"
        http = httpx.Client(timeout=120.0)

        def send(method: str, route: str, fields: dict | None) -> tuple[int, object]:
            if method == "GET":
                response = http.get(base + route, params=fields or {})
            else:
                response = (
                    http.post(base + route, json=fields) if fields is not None else http.post(base + route)
                )
            try:
                return response.status_code, response.json()
            except ValueError:
                return response.status_code, response.text
    else:
        env = registry.make(args.env)
        routes = registry.agentgym_routes(args.env)
    from tqdm import tqdm

    failed: list[tuple[int, list[str]]] = []
    for number, episode in enumerate(
        tqdm(episodes, disable=args.quiet, desc=f"{args.env} traces", unit="episode")
    ):
        if not args.url:
            send = InProcessAgentGym(env, routes).call  # a fresh server per episode, as the recordings were
        differences = replay_trace(episode, send, documented)
        if differences:
            failed.append((number, differences))
    summary = {"env": args.env, "episodes": len(episodes), "equal": len(episodes) - len(failed),
               "differ": [{"episode": n, "data_idx": episodes[n].get("data_idx"), "first": d[:3]}
                          for n, d in failed[: args.max_differences]]}  # fmt: skip
    print(json.dumps(summary, indent=1))
    return 0 if not failed else 1


def add_commands(commands: argparse._SubParsersAction) -> None:
    """Register ``conformance record`` and ``conformance check`` on the top-level parser."""
    conformance = commands.add_parser(
        "conformance", help="record episodes from the original WebShop, or check recorded traces here"
    )
    actions = conformance.add_subparsers(dest="conformance_command", required=True, metavar="ACTION")

    p = actions.add_parser(
        "record", help="play the reproducible episode set and write traces plus prices, goals and title nouns"
    )
    source = p.add_mutually_exclusive_group(required=True)
    source.add_argument(
        "--original", type=Path, help="your own checkout of princeton-nlp/WebShop (index built)"
    )
    source.add_argument(
        "--catalog", type=Path, help="self-test: record this project's env on a prepared catalog"
    )
    p.add_argument(
        "--raw", type=Path, required=True, help="the raw files (items_shuffle*.json, ...) to play on"
    )
    p.add_argument("--out", type=Path, required=True, help="output directory (fixture layout)")
    p.add_argument("--num-products", type=_num_products, default=1000, help="the original's num_products")
    p.add_argument("--episodes", type=_episode_counts, default=None, help="e.g. synthetic=90,human=30")
    p.add_argument("--seed", type=int, default=0, help="seed of the episode plan (goals and random choices)")
    p.add_argument("--rng-seed", type=int, default=1234, help="random.seed() before the original loads")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    p.set_defaults(func=cmd_record)

    p = actions.add_parser("check", help="replay traces on a prepared catalog and compare every step")
    p.add_argument(
        "--traces", type=Path, required=True, help="a recording (fixture layout, e.g. original-seed3)"
    )
    p.add_argument(
        "--catalog",
        type=Path,
        default=None,
        help="prepared catalog (default: prepare the traces' raw files pinned)",
    )
    p.add_argument(
        "--unpin", default="", help="without --catalog: nouns and/or prices to take from here, not pins"
    )
    p.add_argument("--num-products", type=_num_products, default=1000, help="num_products the traces used")
    p.add_argument("--max-differences", type=int, default=10, help="how many first differences to show")
    p.add_argument("--summary", type=Path, default=None, help="also write the summary JSON here")
    p.add_argument("--json", action="store_true", help="print the summary JSON instead of the table")
    p.add_argument("--quiet", action="store_true", help="no progress bars")
    p.set_defaults(func=cmd_check)

    p = actions.add_parser(
        "agentgym",
        help="replay AgentGym's recorded episodes of an environment served through the contract's AgentGym routes "
        "(TextCraft, BabyAI, SciWorld, plugins; in process, or --url)",
        description="Replays traces recorded from AgentGym's own server of an environment and compares every "
        "response: in process by default, or over HTTP against a running service (its base URL; the "
        "environment's prefix is added). Exit status 1 when any episode differs.",
    )
    p.add_argument("--env", required=True, choices=replayable(), help="the environment")
    p.add_argument("--traces", type=Path, default=None,
                   help="traces.jsonl[.gz] or its folder (default: tests/fixtures/conformance/agentgym-ENV)")  # fmt: skip
    p.add_argument(
        "--url", default=None, help="a running service, e.g. http://127.0.0.1:36003 (default: in process)"
    )
    p.add_argument("--limit", type=int, default=0, help="only the first N episodes")
    p.add_argument("--max-differences", type=int, default=10, help="how many differing episodes to show")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    p.set_defaults(func=cmd_agentgym)
