"""``agent-train eval`` and ``agent-train report``.

``cli.py`` wires them in with ``add_commands(subparsers)``; each parser's ``func`` takes the parsed
namespace and returns the exit status. ``main(argv)`` runs them stand-alone (``python -m
agent_trainer.eval_cli eval ...``).

``eval --env NAME`` evaluates one served environment (``evaluation.runner``: WebShop by default, TextCraft, BabyAI,
SciWorld on their test split with their trainer-side spec), and ``--env textcraft,babyai,webshop`` a mix
(``evaluation.env_runner``). What differs between environments comes from their specs: ``--max-turns`` (verl's
``max_assistant_turns``) is for environments whose rounds are verl's turn limit (``EnvSpec.max_rounds`` None:
WebShop's), ``--tasks`` for those whose tasks are the training data's split (not WebShop's goal sets).

Exit status of ``eval``: 0 complete; 1 usage or set-up error (environment unreachable, bad arguments);
2 the run finished incomplete (policy failures after retries, listed in ``metrics.json``: rerun to resume).
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from .config import TURN_TOKENS
from .rehearsal.device import on_cpu
from .turns import TRAINING_ENV_STEPS, TRAINING_MAX_ASSISTANT_TURNS, env_steps_for_turns

EXIT_OK, EXIT_ERROR, EXIT_INCOMPLETE = 0, 1, 2


def add_commands(subparsers: Any) -> None:
    """Add ``eval`` and ``report`` to ``subparsers`` (from ``ArgumentParser.add_subparsers``)."""
    from .evaluation.runner import DEFAULT_URL

    p = subparsers.add_parser(
        "eval",
        help="evaluate a policy on a split through the balancer (metrics, trajectories, report.html)",
        description="Run episodes of a split concurrently against the environment service with the training "
        "prompt and action extraction; resumable (finished episodes in --out are skipped).",
    )
    p.add_argument("--policy", required=True, choices=("expert", "random", "openai", "checkpoint"))
    p.add_argument(
        "--env",
        default=os.environ.get("EVAL_ENV") or "webshop",
        help="environment(s) to evaluate, comma-separated: webshop (default), textcraft, babyai, sciworld, or a mix "
        "(textcraft,babyai,webshop: OUT/<env>/ each, OUT/report.html over all); the test split is the "
        "training data's (agent-train data --env)",
    )
    p.add_argument("--out", type=Path, required=True, help="output directory (resumed when it holds a run)")
    p.add_argument("--url", default=DEFAULT_URL, help="environment service / balancer (default: %(default)s)")
    p.add_argument("--split", default="test", choices=("test", "eval", "train"))
    p.add_argument("--goal-set", default=None, help="synthetic or human (default: the server's default)")
    p.add_argument("--max-samples", type=int, default=None, help="first N goals of the split (default: all)")
    p.add_argument(
        "--tasks", default=None, help="comma-separated task ids of the split: only those (not WebShop)"
    )
    steps = p.add_mutually_exclusive_group()
    steps.add_argument(
        "--max-steps",
        type=int,
        default=None,
        help="actions (env steps) per episode; hitting it scores 0 (truncated). Default: "
        f"{TRAINING_ENV_STEPS}, what training allows (multi_turn.max_assistant_turns = "
        f"{TRAINING_MAX_ASSISTANT_TURNS} in both configs: verl stops after the last reply without sending it); "
        "other environments: their rounds in training (TextCraft 30, BabyAI 20, SciWorld 20)",
    )
    steps.add_argument(
        "--max-turns",
        type=int,
        default=None,
        help="the same limit given as verl's max_assistant_turns (N turns = N - 1 env steps), e.g. the value "
        "of a training run's TRAIN_EXTRA_ARGS (WebShop only)",
    )
    p.add_argument("--concurrency", type=int, default=32, help="episodes in flight")
    p.add_argument("--seed", type=int, default=0, help="random policy / sampling / bootstrap seed")
    p.add_argument(
        "--catalog",
        type=Path,
        default=None,
        help="local copy of the served catalog: goal categories, in-process expert plans",
    )
    p.add_argument("--overwrite", action="store_true", help="discard what --out holds and start afresh")
    p.add_argument("--max-policy-errors", type=int, default=3, help="stop after this many failed episodes")
    p.add_argument("--ready-timeout", type=float, default=60.0, help="seconds to wait for the environment")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.add_argument("--no-report", action="store_true", help="skip report.html")
    chat = p.add_argument_group("openai / checkpoint policies")
    chat.add_argument(
        "--base-url",
        default=os.environ.get("OPENAI_BASE_URL"),
        help="OpenAI-compatible API root, e.g. http://127.0.0.1:30000/v1",
    )
    chat.add_argument("--model", default=None, help="served model name")
    chat.add_argument("--api-key", default=None, help="bearer token (default: $OPENAI_API_KEY)")
    chat.add_argument("--temperature", type=float, default=0.1, help="the guides' 0.1 (default)")
    chat.add_argument("--top-p", type=float, default=1.0)
    chat.add_argument("--max-tokens", type=int, default=None,
                      help="new tokens per reply (default: each environment's per-turn budget in training: its test "
                      f"config's turn_tokens, WebShop's {TURN_TOKENS}; AGENTRL_TURN_TOKENS sets all, as in training)")  # fmt: skip
    chat.add_argument("--max-response-tokens", type=int, default=None,
                      help="the replies and pages after the first turn together, in tokens: the episode ends where a "
                      "reply would pass it (default: each environment's data.max_response_length in training; 0: no cap)")  # fmt: skip
    chat.add_argument("--request-timeout", type=float, default=120.0, help="seconds per model request")
    chat.add_argument("--retries", type=int, default=5, help="retries per model request")
    chat.add_argument("--retry-backoff", type=float, default=0.5, help="base of the retry backoff (s)")
    chat.add_argument(
        "--max-observation-chars",
        type=int,
        default=0,
        help="cut pages in later turns like the interaction setting of the same name (0: never)",
    )
    chat.add_argument(
        "--model-path",
        default=os.environ.get("MODEL_PATH"),
        help="checkpoint: a Hugging Face hub id, a Hugging Face model directory, or a verl checkpoint "
        "(global_step_N, or the experiment directory for its latest step; merged once into "
        "global_step_N/huggingface_merged) to serve with sglang",
    )
    chat.add_argument("--server", choices=("sglang", "cpu"), default="cpu" if on_cpu() else "sglang",
                      help="checkpoint: serve with sglang (GPU), or with a CPU chat server (a tiny model: the "
                           "rehearsal, and the CPU build of the trainer images, AGENTRL_DEVICE=cpu); default: "
                           "%(default)s")  # fmt: skip
    chat.add_argument("--server-port", type=int, default=0, help="checkpoint: sglang port (0: a free one)")
    chat.add_argument("--server-python", default=None, help="checkpoint: interpreter that has sglang")
    chat.add_argument(
        "--server-arg",
        action="append",
        default=[],
        dest="server_args",
        help="checkpoint: extra sglang argument (repeatable), e.g. --server-arg=--tp=2",
    )
    chat.add_argument(
        "--startup-timeout", type=float, default=900.0, help="checkpoint: seconds to get healthy"
    )
    p.set_defaults(func=run_eval)

    r = subparsers.add_parser(
        "report",
        help="training curves (PNG + HTML) from a run's verl metric log, or rebuild an eval's report.html",
        description="--run outputs/<experiment>: plot reward, success rate, KL, policy loss, response length, "
        "env steps per episode and invalid-action rate from verl's metric log. --eval DIR: rebuild "
        "DIR/report.html from its trajectories.",
    )
    target = r.add_mutually_exclusive_group(required=True)
    target.add_argument(
        "--run", type=Path, help="training run directory (outputs/<experiment>) or a metric file"
    )
    target.add_argument("--eval", type=Path, dest="eval_dir", help="evaluation output directory")
    r.add_argument("--out", type=Path, default=None, help="where to write (default: <run>/report)")
    r.set_defaults(func=run_report)


def max_env_steps(max_steps: int | None, max_turns: int | None) -> int:
    """Env steps per episode from ``--max-steps`` or ``--max-turns`` (verl's count), else training's."""
    if max_turns is not None:
        return env_steps_for_turns(max_turns)
    return TRAINING_ENV_STEPS if max_steps is None else max_steps


def run_eval(args: argparse.Namespace) -> int:
    """``agent-train eval``."""
    from . import envs
    from .evaluation.env_runner import default_rounds, evaluate_envs_async
    from .evaluation.policies import PolicyError
    from .evaluation.runner import EvalConfig, EvalError, PolicySpec

    try:
        env_ids = envs.parse_ids(args.env)
    except envs.UnknownEnvironment as error:
        print(f"agent-train eval: --env: {error}", file=sys.stderr)
        return EXIT_ERROR
    specs = [envs.get(env_id) for env_id in env_ids]
    rounds_are_turns = all(env.max_rounds is None for env in specs)  # verl's turn limit (WebShop's rule)
    goal_sets_only = all(env.eval_protocol == "pages" for env in specs)  # the service's goal sets: no --tasks
    if args.max_turns is not None and not rounds_are_turns:
        print("agent-train eval: --max-turns is WebShop's (verl's max_assistant_turns); give the other "
              "environments' rounds as --max-steps", file=sys.stderr)  # fmt: skip
        return EXIT_ERROR
    for name in ("max_steps", "max_turns", "max_samples", "max_tokens"):
        value = getattr(args, name)
        if value is not None and value < 1:
            print(f"agent-train eval: --{name.replace('_', '-')} must be at least 1", file=sys.stderr)
            return EXIT_ERROR
    if args.max_response_tokens is not None and args.max_response_tokens < 0:
        print("agent-train eval: --max-response-tokens must be 0 (no cap) or more", file=sys.stderr)
        return EXIT_ERROR
    if on_cpu() and not os.environ.get("AGENTRL_TURN_TOKENS"):  # the CPU build: the CPU run's per-turn budget
        from .rehearsal.device import CPU_TURN_TOKENS

        os.environ["AGENTRL_TURN_TOKENS"] = str(CPU_TURN_TOKENS)
        print(f"agent-train eval: CPU build: AGENTRL_TURN_TOKENS={CPU_TURN_TOKENS} (the CPU training run's per-turn "
              "budget) and the CPU chat server instead of sglang", file=sys.stderr)  # fmt: skip
    if specs[0].max_rounds is None or args.max_steps is not None or args.max_turns is not None:
        max_turns = max_env_steps(args.max_steps, args.max_turns)
    else:
        max_turns = default_rounds(env_ids[0])
    try:
        only = tuple(int(t) for t in args.tasks.split(",")) if args.tasks else None
    except ValueError:
        print(
            f"agent-train eval: --tasks must be comma-separated task ids, not {args.tasks!r}", file=sys.stderr
        )
        return EXIT_ERROR
    if only is not None and goal_sets_only:
        print(
            "agent-train eval: --tasks is for the other environments (WebShop: --max-samples)",
            file=sys.stderr,
        )
        return EXIT_ERROR
    config = EvalConfig(
        out=args.out,
        url=args.url,
        split=args.split,
        goal_set=args.goal_set,
        max_samples=args.max_samples,
        tasks=only,
        max_turns=max_turns,
        explicit_turns=args.max_steps is not None or args.max_turns is not None,
        max_response_tokens=args.max_response_tokens,
        concurrency=args.concurrency,
        catalog=args.catalog,
        max_policy_errors=args.max_policy_errors,
        overwrite=args.overwrite,
        ready_timeout=args.ready_timeout,
        progress=not args.no_progress,
        write_report=not args.no_report,
    )
    spec = PolicySpec(
        name=args.policy,
        seed=args.seed,
        base_url=args.base_url,
        model=args.model,
        api_key=args.api_key,
        temperature=args.temperature,
        top_p=args.top_p,
        max_tokens=args.max_tokens,
        request_timeout=args.request_timeout,
        retries=args.retries,
        backoff=args.retry_backoff,
        model_path=args.model_path,
        server_port=args.server_port,
        server=args.server,
        server_python=args.server_python,
        server_args=list(args.server_args),
        startup_timeout=args.startup_timeout,
        max_observation_chars=args.max_observation_chars,
    )
    import asyncio

    try:
        result = asyncio.run(evaluate_envs_async(config, spec, env_ids))
    except (EvalError, PolicyError) as error:
        print(f"agent-train eval: {error}", file=sys.stderr)
        return EXIT_ERROR
    m = result.metrics
    if (
        "by_env" in m or "env" in m
    ):  # a mix, or an environment played through its spec: success and mean reward
        return _report_envs(result, spec.name, args.split, config.write_report)
    # a goal set's run (WebShop's): the paper's score and the goal set
    print(
        f"{spec.name} on {args.split} ({m['config']['goal_set']} goals): score {m['score']:.1f} "
        f"[{m['score_ci95'][0]:.1f}, {m['score_ci95'][1]:.1f}]"
        f"  success {m['success_rate']:.3f}  episodes {m['episodes']}/{m['requested_episodes']}"
        f"  mean steps {m['mean_steps']:.2f}  invalid {m['invalid_action_rate']:.3f}"
    )
    print(f"  metrics       {result.metrics_path}")
    print(f"  trajectories  {result.out / 'trajectories.jsonl'}")
    if config.write_report:
        print(f"  report        {result.report_path}")
    if not result.complete:
        print(
            f"agent-train eval: INCOMPLETE: {len(result.failures)} episode(s) failed and {m['not_run']} "
            f"were not run; first error: {result.failures[0]['error'] if result.failures else 'none'}. "
            "Fix the cause and "
            "rerun the same command to resume.",
            file=sys.stderr,
        )
        return EXIT_INCOMPLETE
    return EXIT_OK


def env_line(name: str, env_id: str, metrics: dict[str, Any]) -> str:
    """One environment's figures in a line (success and mean reward with their 95 % intervals)."""
    lo, hi = metrics["success_rate_ci95"]
    return (
        f"{name} on {env_id}: success {metrics['success_rate']:.3f} [{lo:.3f}, {hi:.3f}]  mean reward "
        f"{metrics['mean_reward']:.3f} [{metrics['score_ci95'][0] / 100:.3f}, {metrics['score_ci95'][1] / 100:.3f}]"
        f"  episodes {metrics['episodes']}/{metrics.get('requested_episodes', metrics['episodes'])}"
        f"  mean steps {metrics['mean_steps']:.2f}  invalid {metrics['invalid_action_rate']:.3f}"
    )


def _report_envs(result: Any, policy: str, split: str, report: bool) -> int:
    """Print another environment's (or a mix's) figures and outputs; the exit status."""
    m = result.metrics
    per_env = m["by_env"] if "by_env" in m else {m["env"]: m}
    for env_id, metrics in per_env.items():
        print(env_line(policy, env_id, metrics) + f"  ({split} split)")
    print(f"  metrics       {result.metrics_path}")
    if "by_env" not in m:
        print(f"  trajectories  {result.out / 'trajectories.jsonl'}")
    if report:
        print(f"  report        {result.report_path}")
    if not result.complete:
        print(f"agent-train eval: INCOMPLETE: {len(result.failures)} episode(s) failed; first error: "
              f"{result.failures[0]['error'] if result.failures else 'none'}. Fix the cause and rerun the same "
              "command to resume.", file=sys.stderr)  # fmt: skip
        return EXIT_INCOMPLETE
    return EXIT_OK


def run_report(args: argparse.Namespace) -> int:
    """``agent-train report``."""
    if args.eval_dir is not None:
        import json

        from .evaluation.report_html import load_records, write_report
        from .evaluation.runner import METRICS, REPORT, TRAJECTORIES

        metrics_path, trajectories = args.eval_dir / METRICS, args.eval_dir / TRAJECTORIES
        mix = json.loads(metrics_path.read_text()) if metrics_path.exists() else {}
        if "by_env" in mix:  # a mixed evaluation: each environment's directory, then the page over all
            from .evaluation.report_html import write_mix_report

            out = args.out or args.eval_dir
            out.mkdir(parents=True, exist_ok=True)
            dirs = {env_id: args.eval_dir / sub for env_id, sub in mix["dirs"].items()}
            per_env = {env_id: json.loads((d / METRICS).read_text()) for env_id, d in dirs.items()}
            records = {env_id: load_records(d / TRAJECTORIES) for env_id, d in dirs.items()}
            print(f"report: {write_mix_report(out / REPORT, mix, per_env, records)}")
            return EXIT_OK
        if not metrics_path.exists() or not trajectories.exists():
            print(f"agent-train report: {args.eval_dir} has no {METRICS} and {TRAJECTORIES}", file=sys.stderr)
            return EXIT_ERROR
        out = args.out or args.eval_dir
        out.mkdir(parents=True, exist_ok=True)
        path = write_report(out / REPORT, json.loads(metrics_path.read_text()), load_records(trajectories))
        print(f"report: {path}")
        return EXIT_OK

    from .evaluation.curves import write_curves

    try:
        result = write_curves(args.run, args.out)
    except FileNotFoundError as error:
        print(f"agent-train report: {error}", file=sys.stderr)
        return EXIT_ERROR
    print(f"curves: {result.html}" + (f"  {result.png}" if result.png else ""))
    for title, keys in result.panels.items():
        print(f"  {title:<16} {', '.join(keys) if keys else '(no matching metric)'}")
    if result.note:
        print(f"  note: {result.note}")
    return EXIT_OK


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="agent-train", description="WebShop evaluation and reports")
    add_commands(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(argv)
    return int(args.func(args))


if __name__ == "__main__":
    sys.exit(main())
