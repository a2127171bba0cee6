"""agent-envs: build catalogs, play and check episodes, benchmark, and serve the environment.

Run ``agent-envs COMMAND --help`` for each command's options.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

import orjson

from ..envs.webshop.core.goals import GOAL_SETS
from ..settings import default_catalog_dir


def _print_json(value: object) -> None:
    sys.stdout.write(orjson.dumps(value).decode() + "\n")
    sys.stdout.flush()


def _catalog_arg(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--catalog",
        type=Path,
        default=None,
        help="prepared catalog directory (default: $WEBSHOP_CATALOG, $CATALOG_DIR or data/catalog)",
    )


def _goal_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--goal", type=int, required=True, help="goal index (the original's session id)")
    parser.add_argument(
        "--goal-set",
        default="synthetic",
        choices=list(GOAL_SETS),
        help="goal list (default: synthetic)",
    )


def _open_env(args: argparse.Namespace):
    from ..envs.webshop.catalog.store import open_catalog
    from ..envs.webshop.core.env import WebShopEnv

    return WebShopEnv(open_catalog(args.catalog or default_catalog_dir()))


# ---- catalog ---------------------------------------------------------------------------------------------
def cmd_generate(args: argparse.Namespace) -> int:
    from ..envs.webshop.catalog.generate import generate_catalog

    if args.products < 1:  # 0 would write empty files that `catalog prepare` then rejects
        print(
            f"agent-envs catalog generate: error: --products must be at least 1 (got {args.products})",
            file=sys.stderr,
        )
        return 2
    summary = generate_catalog(args.out, products=args.products, seed=args.seed, progress=not args.quiet)
    _print_json(summary)
    return 0


def cmd_download(args: argparse.Namespace) -> int:
    from ..envs.webshop.catalog.download import download_catalog

    paths = download_catalog(args.out, full=args.full, base_url=args.base_url, progress=not args.quiet)
    _print_json({"files": [str(p) for p in paths]})
    return 0


def cmd_prepare(args: argparse.Namespace) -> int:
    from ..envs.webshop.catalog.prepare import Pins, prepare_catalog

    pinned_goals = {}
    for item in args.pin_goals or []:
        name, _, path = item.partition("=")
        if not path:
            raise SystemExit(f"--pin-goals expects SET=FILE (e.g. synthetic=goals.json), got {item!r}")
        pinned_goals[name] = Path(path)
    pins = Pins.from_files(prices=args.pin_prices, title_nouns=args.pin_title_nouns, goals=pinned_goals)
    from ..envs.webshop.core.nouns import noun_extractor_named

    try:
        extractor = None if args.pin_title_nouns else noun_extractor_named(args.nouns)
    except ValueError as error:
        raise SystemExit(f"agent-envs catalog prepare: error: {error}") from None
    manifest = prepare_catalog(
        args.raw,
        args.out or default_catalog_dir(),
        num_products=args.num_products,
        goal_sets=args.goal_sets if args.goal_sets == "auto" else tuple(args.goal_sets.split(",")),
        price_seed=args.price_seed,
        ceiling_seed=args.ceiling_seed,
        pins=pins,
        noun_extractor=extractor,
        progress=not args.quiet,
    )
    _print_json(manifest)
    return 0


def cmd_info(args: argparse.Namespace) -> int:
    from ..envs.webshop.catalog.fidelity import fidelity_limits
    from ..envs.webshop.catalog.store import open_catalog

    manifest = open_catalog(args.catalog or default_catalog_dir()).manifest
    _print_json({**manifest, "fidelity": fidelity_limits(manifest)})
    return 0


# ---- episodes --------------------------------------------------------------------------------------------
def _step_json(step, action: str | None = None) -> dict:
    data = {
        "observation": step.observation,
        "available_actions": step.available_actions,
    }
    if action is None:
        return {**data, "instruction": step.instruction}
    return {"action": action, **data, "reward": step.reward, "done": step.done, "info": step.info}


def cmd_episode(args: argparse.Namespace) -> int:
    env = _open_env(args)
    step = env.reset(args.goal, goal_set=args.goal_set)
    _print_json(_step_json(step))
    for action in args.action or []:
        step = env.step(step.state, action)
        _print_json(_step_json(step, action))
        if step.done:
            break
    return 0


def cmd_solve(args: argparse.Namespace) -> int:
    from ..envs.webshop.core.oracle import expert_actions

    actions = expert_actions(_open_env(args), args.goal, goal_set=args.goal_set)
    if not actions:
        print(f"no way found to the goal's product for goal {args.goal}", file=sys.stderr)
        return 1
    for action in actions:
        print(action)
    return 0


def cmd_play(args: argparse.Namespace) -> int:
    env = _open_env(args)
    step = env.reset(args.goal, goal_set=args.goal_set)
    print(f"Goal {args.goal}: {step.instruction}\nType an action (search[...] / click[...]), or 'quit'.\n")
    while True:
        print(step.observation.replace(" [SEP] ", "\n  "))
        print(f"\nclickables: {', '.join(step.available_actions['clickables']) or '-'}")
        try:
            action = input("> ").strip()
        except EOFError:
            return 0
        if action in ("quit", "exit"):
            return 0
        step = env.step(step.state, action)
        if not step.info["valid"]:
            print("(invalid action: nothing happens)")
        if step.done:
            print(step.observation.replace(" [SEP] ", "\n  "))
            print(f"\nreward {step.reward}  {step.info.get('reward_info')}")
            return 0


def cmd_bench_envs(args: argparse.Namespace) -> int:
    from ..envs import bench, registry

    env_ids = [name.strip() for name in (args.envs or bench.default_envs()).split(",") if name.strip()]
    unknown = [name for name in env_ids if name not in registry.contract_ids()]
    agentgym = dict(item.split("=", 1) for item in args.agentgym if "=" in item)
    if (
        unknown
        or not env_ids
        or len(agentgym) != len(args.agentgym)
        or args.episodes < 1
        or args.concurrency < 1
    ):
        print(
            f"agent-envs bench-envs: error: --envs takes {', '.join(registry.contract_ids())} (got {args.envs!r}); "
            "--agentgym ENV=URL; --episodes and --concurrency at least 1",
            file=sys.stderr,
        )
        return 2
    if agentgym:
        from ..envs import bench_agentgym

        clients = [int(n) for n in args.clients.split(",") if n.strip()]
        missing = [env_id for env_id in env_ids if env_id not in agentgym]
        if missing:
            print(
                f"agent-envs bench-envs: no --agentgym URL for {', '.join(missing)}: not measured",
                file=sys.stderr,
            )
        rows = bench_agentgym.compare(env_ids, agentgym, clients=clients, rounds=args.rounds,
                                      episodes=args.per_client, replicas=args.replicas, workers=args.workers,
                                      seed=args.seed, url=args.url, keep_alive=args.keep_alive)  # fmt: skip
        if args.json:
            _print_json(rows)
        else:
            print(bench_agentgym.markdown(rows))
        return 0 if rows and not any(row["errors"] for row in rows) else 1
    rows = bench.run(env_ids, args.episodes, args.concurrency, args.url, replicas=args.replicas)
    if args.json:
        _print_json(rows)
    else:
        print(bench.markdown(rows))
    return 0


def cmd_bench(args: argparse.Namespace) -> int:
    from ..bench import bench_generated, bench_in_process, default_cache_dir, markdown_table

    if args.products is None:
        _print_json(bench_in_process(args.catalog or default_catalog_dir(), iterations=args.iterations))
        return 0
    if args.catalog is not None:
        print("agent-envs bench: error: give --catalog or --products, not both", file=sys.stderr)
        return 2
    try:
        sizes = [int(size.replace("_", "")) for size in args.products.split(",")]
    except ValueError:
        sizes = []
    if not sizes or min(sizes) < 1000:
        print("agent-envs bench: error: --products takes sizes >= 1000, e.g. 100000,1200000", file=sys.stderr)
        return 2
    cache = args.cache_dir or default_cache_dir()
    result = bench_generated(sizes, cache, iterations=args.iterations, progress=not args.json)
    if args.json:
        _print_json(result)
    else:
        print(markdown_table(result["runs"]))
        print(f"(load average {' '.join(f'{x:.2f}' for x in result['load_avg'])}; catalogs in {cache})")
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="agent-envs", description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    catalog = commands.add_parser("catalog", help="generate, download, prepare or inspect a catalog")
    catalog_commands = catalog.add_subparsers(dest="catalog_command", required=True, metavar="ACTION")

    p = catalog_commands.add_parser("generate", help="write a generated catalog in the original raw format")
    p.add_argument("--products", type=int, default=1000, help="number of products (default 1000; up to 1.2M)")
    p.add_argument("--seed", type=int, default=0, help="random seed (same seed and size: identical files)")
    p.add_argument("--out", type=Path, required=True, help="output directory for the raw files")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    p.set_defaults(func=cmd_generate)

    p = catalog_commands.add_parser("download", help="download the original files (needs internet)")
    p.add_argument("--out", type=Path, required=True, help="directory for the raw files")
    p.add_argument(
        "--full", action="store_true", help="the full 1.18M-product catalog (5.5 GB) instead of 1k"
    )
    p.add_argument("--base-url", default=None, help=argparse.SUPPRESS)
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    p.set_defaults(func=cmd_download)

    p = catalog_commands.add_parser("prepare", help="build the prepared catalog from raw files")
    p.add_argument("--raw", type=Path, required=True, help="directory with items_shuffle*.json etc.")
    p.add_argument("--out", type=Path, default=None, help="output directory (default: the default catalog)")
    p.add_argument("--num-products", type=int, default=None, help="use only the first N raw products")
    p.add_argument(
        "--goal-sets",
        default="auto",
        help="comma-separated goal lists to build, or auto: synthetic and human goals, human only above "
        "100,000 products (synthetic goals are one per option combination)",
    )
    p.add_argument("--price-seed", type=int, default=1234, help="seed for point prices of price ranges")
    p.add_argument("--ceiling-seed", type=int, default=233, help="seed for goal price ceilings")
    p.add_argument("--pin-prices", type=Path, help="JSON {asin: price} from a reference run")
    p.add_argument("--pin-title-nouns", type=Path, help="JSON {asin: [nouns]} from a reference run")
    p.add_argument("--pin-goals", action="append", metavar="SET=FILE", help="goal list whose ceilings to pin")
    p.add_argument(
        "--nouns",
        choices=("auto", "spacy", "heuristic"),
        default="auto",
        help="title nouns: spaCy if installed else the heuristic (auto), spaCy or fail, or the heuristic",
    )
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    p.set_defaults(func=cmd_prepare)

    p = catalog_commands.add_parser("info", help="print a prepared catalog's manifest and fidelity limits")
    _catalog_arg(p)
    p.set_defaults(func=cmd_info)

    p = commands.add_parser("episode", help="run an episode in-process and print JSON lines")
    _catalog_arg(p)
    _goal_args(p)
    p.add_argument("--action", action="append", help="an action; repeat for several")
    p.add_argument(
        "--json", action="store_true", help="JSON lines output (the only format; kept for clarity)"
    )
    p.set_defaults(func=cmd_episode)

    p = commands.add_parser("play", help="play an episode at the terminal")
    _catalog_arg(p)
    _goal_args(p)
    p.set_defaults(func=cmd_play)

    p = commands.add_parser("solve", help="print the expert's actions for a goal, one per line")
    _catalog_arg(p)
    _goal_args(p)
    p.set_defaults(func=cmd_solve)

    p = commands.add_parser("bench", help="in-process benchmark: step latencies, open time, memory")
    _catalog_arg(p)
    p.add_argument(
        "--products",
        default=None,
        help="instead of --catalog: comma-separated sizes (e.g. 100000,1200000) of generated catalogs, "
        "built once into --cache-dir; prints a markdown table (JSON with --json)",
    )
    p.add_argument(
        "--cache-dir",
        type=Path,
        default=None,
        help="for --products (default: $WEBSHOP_BENCH_CACHE or ~/.cache)",
    )
    p.add_argument("--iterations", type=int, default=2000, help="timed steps per kind (default 2000)")
    p.add_argument("--json", action="store_true", help="JSON output (always for --catalog)")
    p.set_defaults(func=cmd_bench)

    p = commands.add_parser(
        "bench-envs",
        help="TextCraft, BabyAI, SciWorld: steps/s and p50/p99 in process and through the balancer",
        description="Expert episodes per environment: the core in process, the native protocol and AgentGym's "
        "requests through a balancer (a local cluster it starts, or --url), and AgentGym's own server where "
        "--agentgym names one. Prints a markdown table (JSON with --json).",
    )
    p.add_argument(
        "--envs", default=None,
        help="comma-separated (default: those of $AGENTRL_ENVS that have a core: textcraft, babyai, sciworld; "
        "else textcraft,babyai)",
    )  # fmt: skip
    p.add_argument("--episodes", type=int, default=32, help="expert episodes per environment (default 32)")
    p.add_argument("--concurrency", type=int, default=16, help="episodes in flight over HTTP (default 16)")
    p.add_argument(
        "--url", default=None, help="a running service with these environments (default: start one)"
    )
    p.add_argument("--replicas", type=int, default=2, help="replicas of the cluster it starts (default 2)")
    p.add_argument(
        "--agentgym", action="append", default=[], metavar="ENV=URL",
        help="AgentGym's own server of ENV (scripts/agentgym_servers.sh starts them): instead of the table above, "
        "ours (one process, and the deployed topology) beside it, interleaved, same actions (exit 1 on any error)",
    )  # fmt: skip
    p.add_argument("--clients", default="1,8", help="with --agentgym: client counts to measure (default 1,8)")
    p.add_argument("--rounds", type=int, default=3, help="with --agentgym: interleaved rounds (default 3)")
    p.add_argument(
        "--per-client", type=int, default=4, help="with --agentgym: episodes per client per round (default 4)"
    )
    p.add_argument(
        "--workers",
        type=int,
        default=2,
        help="with --agentgym: workers per deployed replica (make up-local's 2)",
    )
    p.add_argument(
        "--seed", type=int, default=0, help="with --agentgym: seeds the tasks and BabyAI's actions"
    )
    p.add_argument(
        "--keep-alive", action="store_true",
        help="with --agentgym: one kept-alive connection per client (default: one per request, as AgentGym's client)",
    )  # fmt: skip
    p.add_argument("--json", action="store_true", help="JSON output")
    p.set_defaults(func=cmd_bench_envs)

    from .serve import add_commands as add_serve_commands

    add_serve_commands(commands)  # serve, bench-http
    from .ray_serve import add_commands as add_ray_commands

    add_ray_commands(commands)  # serve-ray
    from .conformance import add_commands as add_conformance_commands

    add_conformance_commands(commands)  # conformance record|check
    from .envs import add_commands as add_envs_commands

    add_envs_commands(commands)  # envs
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    from ..envs.contract import EnvError
    from ..envs.webshop.catalog.raw import RawDataError
    from ..envs.webshop.catalog.store import CatalogError

    args = build_parser().parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except (RawDataError, CatalogError, EnvError, FileNotFoundError) as error:
        print(f"agent-envs: error: {error}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


def deprecated_main() -> int:
    """The command's old name, kept for one release: a deprecation line on stderr, then ``main``."""
    from ..module_aliases import renamed_command

    return renamed_command("webshop-env", "agent-envs", main)


if __name__ == "__main__":
    sys.exit(main())
