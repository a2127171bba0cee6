"""``report.html``: one self-contained page (inline CSS, JS and SVG; no network) per evaluation.

It holds the summary table, the reward histogram, success by category, the steps distribution and a
browsable list of episodes showing every step as the agent saw it (instruction, page, model output, action,
reward). The list is filterable by outcome, category and text; the filters live in the URL hash
(``report.html#filter=success&category=beauty&q=shoes&open=12``), so a filtered view can be linked to, and
the page applies the hash on load and on every change (the controls just rewrite the hash).

Another environment's report (``env_runner``) is the same page with its own words: success by the environment's
rule, mean reward, levels (BabyAI) as categories, every turn as the model saw it (the user turns of the spec).
A mixed evaluation's page (``write_mix_report``) has a table per environment, each environment's charts and one
episode browser over every environment's episodes, with an environment filter (``#env=textcraft``).
"""

from __future__ import annotations

import json
import time
from collections.abc import Mapping, Sequence
from html import escape
from pathlib import Path
from typing import Any

from agent_envs.envs.webshop.catalog.fidelity import describe_fidelity

from .. import envs
from ..envs.spec import EnvSpec
from .svg import PALETTE, bar_chart, hbar_chart


def _pct(value: float) -> str:
    return f"{100 * value:.1f} %"


def _ci(pair: Sequence[float], scale: float = 1.0, digits: int = 1) -> str:
    return f"[{pair[0] * scale:.{digits}f}, {pair[1] * scale:.{digits}f}]"


#: The environment of the records and metrics that name none: WebShop's runner writes no ``env`` (its files keep
#: the format they had before there were other environments).
UNNAMED_ENV = envs.WEBSHOP
#: The ``EnvSpec.eval_protocol`` that plays the environment's pages (``runner.PagePlay``: WebShop's).
PAGES_PROTOCOL = "pages"


def env_spec(env_id: str | None) -> EnvSpec | None:
    """The spec of the environment a report shows (``None``: :data:`UNNAMED_ENV`), None where the trainer knows
    no such environment (a plugin's, not installed here)."""
    return envs.specs().get(env_id or UNNAMED_ENV)


def played_pages(env_id: str | None) -> bool:
    """Whether eval played the environment's pages (its spec's ``eval_protocol``: WebShop's): then its metrics are
    the catalog's (score, goal set, the catalog and its reward definition) and its records keep the page the agent
    saw, not the user turn the model saw, so no system prompt is shown above them."""
    spec = env_spec(env_id)
    return spec is not None and spec.eval_protocol == PAGES_PROTOCOL


def _category_label(env_id: str | None) -> str:
    """What the environment's ``by_category`` groups are (its spec's ``category_label``: BabyAI's levels)."""
    spec = env_spec(env_id)
    return spec.category_label if spec is not None else "category"


def env_title(env_id: str | None) -> str:
    """How the reports name an environment: its spec's name (``WebShop``, ``TextCraft``), else its id."""
    spec = env_spec(env_id)
    return spec.name if spec is not None else str(env_id)


def summary_rows(metrics: Mapping[str, Any]) -> list[tuple[str, str]]:
    """(label, value) rows of the summary table: the page protocol's (score, goal set, the catalog and its reward
    definition) for an environment eval plays by its pages (:func:`played_pages`: WebShop), else the environment's
    own (:func:`env_summary_rows`)."""
    if not played_pages(metrics.get("env")):
        return env_summary_rows(metrics)
    rows = [
        ("Score (mean reward × 100)", f"{metrics['score']:.1f}  95% CI {_ci(metrics['score_ci95'])}"),
        (
            "Success rate (reward = 1)",
            f"{_pct(metrics['success_rate'])}  95% CI {_ci(metrics['success_rate_ci95'], 100)} %",
        ),
        ("Episodes", f"{metrics['episodes']} of {metrics.get('requested_episodes', metrics['episodes'])}"),
        ("Mean steps", f"{metrics['mean_steps']:.2f}"),
        ("Invalid-action rate", _pct(metrics["invalid_action_rate"])),
        ("Unparsed outputs", _pct(metrics.get("unparsed_output_rate", 0.0))),
        ("Truncated (turn limit)", _pct(metrics["truncated_rate"])),
    ]
    policy = metrics.get("policy") or {}
    if policy:
        rows.append(("Policy", ", ".join(f"{k}={v}" for k, v in policy.items() if v not in (None, "", []))))
    config = metrics.get("config") or {}
    if config:
        rows.append(("Split / goal set", f"{config.get('split')} / {config.get('goal_set')}"))
        rows.append(("Max turns", str(config.get("max_turns"))))
    catalog = metrics.get("catalog") or {}
    if catalog.get("fingerprint"):
        rows.append(("Catalog", f"{catalog['fingerprint']} ({catalog.get('products')} products)"))
    if catalog.get("fidelity"):
        rows.append(("Reward definition", describe_fidelity(catalog["fidelity"])))
    if not metrics.get("complete", True):
        rows.append(("Status", "INCOMPLETE: see the failures below"))
    return rows


def env_summary_rows(metrics: Mapping[str, Any]) -> list[tuple[str, str]]:
    """(label, value) rows of another environment's summary table (``env_runner``'s metrics)."""
    rows = [
        (
            f"Success rate ({metrics.get('success_rule', 'solved')})",
            f"{_pct(metrics['success_rate'])}  95% CI {_ci(metrics['success_rate_ci95'], 100)} %",
        ),
        ("Mean reward", f"{metrics['mean_reward']:.3f}  95% CI {_ci(metrics['score_ci95'], 0.01, 3)}"),
        ("Episodes", f"{metrics['episodes']} of {metrics.get('requested_episodes', metrics['episodes'])}"),
        ("Mean steps", f"{metrics['mean_steps']:.2f}"),
        ("Invalid-action rate", _pct(metrics["invalid_action_rate"])),
        ("Unparsed outputs", _pct(metrics.get("unparsed_output_rate", 0.0))),
        ("Truncated (round budget)", _pct(metrics["truncated_rate"])),
    ]
    policy = metrics.get("policy") or {}
    if policy:
        rows.append(("Policy", ", ".join(f"{k}={v}" for k, v in policy.items() if v not in (None, "", []))))
    config = metrics.get("config") or {}
    if config:
        tasks = config.get("tasks") or ["?", "?"]
        rows.append(
            ("Split", f"{config.get('split')}: {config.get('task_split', '')}, tasks {tasks[0]}–{tasks[1]}")
        )
        rows.append(("Max rounds", str(config.get("max_turns"))))
    if metrics.get("reward_rule"):
        rows.append(("Reward", str(metrics["reward_rule"])))
    service = metrics.get("env_service") or {}
    if service.get("fingerprint"):
        rows.append(
            ("Environment", f"{metrics.get('env')} {service['fingerprint']} ({service.get('tasks')} tasks)")
        )
    if not metrics.get("complete", True):
        rows.append(("Status", "INCOMPLETE: see the failures below"))
    return rows


def _episode_payload(record: Mapping[str, Any], mixed: bool = False) -> dict[str, Any]:
    env = record.get("env") or UNNAMED_ENV
    return {
        "id": f"{env}:{record['goal']}" if mixed else str(record["goal"]),
        "env": env,
        "page": played_pages(env),  # a turn shows the page, not the user turn
        "goal": record["goal"],
        "category": record.get("category") or "unknown",
        "instruction": record.get("instruction", ""),
        "reward": record["reward"],
        "success": record["success"],
        "steps": record["steps"],
        "truncated": record.get("truncated", False),
        "ended_by": record.get("ended_by", ""),
        "invalid": record.get("invalid_actions", 0),
        "reward_info": record.get("reward_info"),
        "note": record.get("note", ""),
        "turns": [
            {
                "observation": t.get("observation", ""),
                "output": t.get("output", ""),
                "action": t.get("action"),
                "reward": t.get("reward", 0.0),
                "valid": t.get("valid", True),
            }
            for t in record.get("turns", [])
        ],
    }


def _script_json(value: Any) -> str:
    """JSON safe inside a ``<script>`` element (no ``</script>``, no HTML comment openers)."""
    text = json.dumps(value, ensure_ascii=False, separators=(",", ":"))
    return text.replace("&", "\\u0026").replace("<", "\\u003c").replace(">", "\\u003e")


def _charts(metrics: Mapping[str, Any], prefix: str = "chart") -> tuple[str, str, str]:
    """The reward histogram, success by category and steps per episode of one evaluation (SVG)."""
    hist = metrics["reward_histogram"]
    reward_svg = bar_chart(
        hist["labels"],
        hist["counts"],
        "Final reward (episodes)",
        annotations=[str(c) if c else "" for c in hist["counts"]],
        element_id=f"{prefix}-reward",
    )
    categories = metrics["by_category"]
    names = list(categories)
    category_svg = hbar_chart(
        names,
        [categories[n]["success_rate"] for n in names],
        f"Success rate by {_category_label(metrics.get('env'))}",
        annotations=[f"{_pct(categories[n]['success_rate'])} of {categories[n]['episodes']}" for n in names],
        element_id=f"{prefix}-category",
    )
    steps = metrics["steps_histogram"]
    steps_svg = bar_chart(
        steps["labels"], steps["counts"], "Steps per episode", color=PALETTE[3], element_id=f"{prefix}-steps"
    )
    return reward_svg, category_svg, steps_svg


def system_prompt_html(env_id: str | None) -> str:
    """The system prompt every episode of the environment starts with (the spec's), folded: the episodes show the
    user turns that follow it. None where they show pages instead (:func:`played_pages`: WebShop's)."""
    spec = env_spec(env_id)
    if spec is None or played_pages(env_id):
        return ""
    return (f'<details class="system-prompt"><summary>System prompt (the first message of every episode)</summary>'
            f'<div class="page">{escape(spec.system_prompt)}</div></details>')  # fmt: skip


def _failures(failures: Sequence[Mapping[str, Any]], not_run: int) -> str:
    if not failures and not not_run:
        return ""
    items = "".join(
        f"<li>{escape(str(f.get('env', 'goal')))} {f['goal']}: {escape(str(f['error']))}</li>"
        for f in failures[:50]
    )
    return (
        f'<section class="warn" id="failures"><h2>Incomplete run</h2><p>{len(failures)} episode(s) '
        f"failed (policy errors, not scored) and {not_run} were not run. Rerun the same command "
        f"to resume.</p><ul>{items}</ul></section>"
    )


def render_report(
    metrics: Mapping[str, Any], records: Sequence[Mapping[str, Any]], title: str | None = None
) -> str:
    """The report page as a string."""
    policy = (metrics.get("policy") or {}).get("name", "policy")
    split = (metrics.get("config") or {}).get("split", "")
    title = title or f"{env_title(metrics.get('env'))} eval: {policy} on {split}".strip()
    rows = "".join(f"<tr><th>{escape(k)}</th><td>{escape(v)}</td></tr>" for k, v in summary_rows(metrics))
    reward_svg, category_svg, steps_svg = _charts(metrics)
    categories = metrics["by_category"]
    category_rows = "".join(
        f"<tr><td>{escape(n)}</td><td>{c['episodes']}</td><td>{c['score']:.1f}</td>"
        f"<td>{_pct(c['success_rate'])}</td><td>{c['mean_steps']:.2f}</td></tr>"
        for n, c in categories.items()
    )
    body = (
        f'<section id="summary-section"><h2>Summary</h2><table id="summary">{rows}</table>'
        f"{system_prompt_html(metrics.get('env'))}</section>"
        f'<section><h2>Distributions</h2><div class="charts">{reward_svg}{category_svg}{steps_svg}</div></section>'
        '<section><h2>By category</h2><table id="categories"><tr><th>Category</th><th>Episodes</th><th>Score</th>'
        f"<th>Success</th><th>Mean steps</th></tr>{category_rows}</table></section>"
    )
    return _page(title, metrics, body, records, list(categories), [],
                 _failures(metrics.get("failed_episodes") or [], int(metrics.get("not_run", 0))))  # fmt: skip


def _page(title: str, metrics: Mapping[str, Any], body: str, records: Sequence[Mapping[str, Any]],
          categories: Sequence[str], env_ids: Sequence[str], failures: str) -> str:  # fmt: skip
    options = "".join(f'<option value="{escape(n)}">{escape(n)}</option>' for n in categories)
    env_filter = ""
    if env_ids:
        env_options = "".join(f'<option value="{escape(e)}">{escape(env_title(e))}</option>' for e in env_ids)
        env_filter = (f'<label for="filter-env">Environment</label><select id="filter-env"><option value="all">all'
                      f"</option>{env_options}</select>")  # fmt: skip
    data = _script_json([_episode_payload(r, mixed=bool(env_ids)) for r in records])
    created = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(metrics.get("created_unix", time.time())))
    return _PAGE.format(title=escape(title), created=escape(created), body=body, failures=failures,
                        options=options, env_filter=env_filter, data=data, css=_CSS, js=_JS, total=len(records))  # fmt: skip


def mix_rows(per_env: Mapping[str, Mapping[str, Any]]) -> list[list[str]]:
    """The mixed report's per-environment table: one row per environment (the header is ``MIX_HEADER``)."""
    rows = []
    for env_id, m in per_env.items():
        rows.append([
            env_title(env_id),
            f"{m['episodes']} of {m.get('requested_episodes', m['episodes'])}",
            f"{_pct(m['success_rate'])} {_ci(m['success_rate_ci95'], 100)} %",
            f"{m['mean_reward']:.3f} {_ci(m['score_ci95'], 0.01, 3)}",
            f"{m['mean_steps']:.2f}",
            _pct(m["invalid_action_rate"]),
            str((m.get("config") or {}).get("max_turns", "")),
            str(m.get("success_rule") or "reward = 1 (a purchase matching every attribute)"),
        ])  # fmt: skip
    return rows


MIX_HEADER = ("Environment", "Episodes", "Success (95% CI)", "Mean reward (95% CI)", "Mean steps",
              "Invalid actions", "Max rounds", "Success means")  # fmt: skip


def render_mix_report(mix: Mapping[str, Any], per_env: Mapping[str, Mapping[str, Any]],
                      records: Mapping[str, Sequence[Mapping[str, Any]]]) -> str:  # fmt: skip
    """The mixed evaluation's page: the per-environment table, each environment's charts (linked to its own
    report), and one episode browser over every environment's episodes."""
    policy = (mix.get("policy") or {}).get("name", "policy")
    names = ", ".join(env_title(e) for e in per_env)
    title = f"Eval: {policy} on {names}"
    head = "".join(f"<th>{escape(h)}</th>" for h in MIX_HEADER)
    body_rows = "".join(
        f'<tr data-env="{escape(e)}">' + "".join(f"<td>{escape(c)}</td>" for c in row) + "</tr>"
        for e, row in zip(per_env, mix_rows(per_env), strict=True)
    )
    overall = mix["overall"]
    pooled = (f"<p>All {overall['episodes']} episodes: success {_pct(overall['success_rate'])} "
              f"{_ci(overall['success_rate_ci95'], 100)} % (each environment by its own rule).</p>")  # fmt: skip
    envs_list = list(per_env)
    success_svg = hbar_chart(
        [env_title(e) for e in envs_list], [per_env[e]["success_rate"] for e in envs_list],
        "Success rate by environment",
        annotations=[f"{_pct(per_env[e]['success_rate'])} of {per_env[e]['episodes']}" for e in envs_list],
        element_id="chart-env-success",
    )  # fmt: skip
    invalid_svg = hbar_chart(
        [env_title(e) for e in envs_list], [per_env[e]["invalid_action_rate"] for e in envs_list],
        "Invalid-action rate by environment", annotations=[_pct(per_env[e]["invalid_action_rate"]) for e in envs_list],
        color=PALETTE[1], element_id="chart-env-invalid",
    )  # fmt: skip
    sections = []
    for env_id in envs_list:
        charts = "".join(_charts(per_env[env_id], prefix=f"chart-{env_id}"))
        sections.append(
            f'<section id="env-{escape(env_id)}"><h2>{escape(env_title(env_id))} '
            f'<a class="meta" href="{escape(env_id)}/report.html">its own report</a></h2>'
            f'<div class="charts">{charts}</div>{system_prompt_html(env_id)}</section>'
        )
    body = (
        f'<section id="summary-section"><h2>By environment</h2><table id="environments"><tr>{head}</tr>{body_rows}'
        f'</table>{pooled}</section><section><h2>Environments side by side</h2><div class="charts">{success_svg}'
        f"{invalid_svg}</div></section>{''.join(sections)}"
    )
    all_records = [r for env_id in envs_list for r in records.get(env_id, [])]
    categories = sorted({str(r.get("category") or "unknown") for r in all_records})
    failures = [f | {"env": e} for e, m in per_env.items() for f in (m.get("failed_episodes") or [])]
    not_run = sum(int(m.get("not_run", 0)) for m in per_env.values())
    return _page(title, mix, body, all_records, categories, envs_list, _failures(failures, not_run))


def write_mix_report(path: Path | str, mix: Mapping[str, Any], per_env: Mapping[str, Mapping[str, Any]],
                     records: Mapping[str, Sequence[Mapping[str, Any]]]) -> Path:  # fmt: skip
    """Write ``render_mix_report`` to ``path`` (atomically)."""
    path = Path(path)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(render_mix_report(mix, per_env, records), encoding="utf-8")
    tmp.replace(path)
    return path


def write_report(path: Path | str, metrics: Mapping[str, Any], records: Sequence[Mapping[str, Any]]) -> Path:
    """Write ``render_report`` to ``path`` (atomically: a browser never sees half a page)."""
    path = Path(path)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(render_report(metrics, records), encoding="utf-8")
    tmp.replace(path)
    return path


def load_records(path: Path | str) -> list[dict[str, Any]]:
    """Episodes of a ``trajectories.jsonl`` (lines cut short by an interrupted run are skipped)."""
    records = []
    for line in Path(path).read_text(encoding="utf-8").splitlines():
        try:
            records.append(json.loads(line))
        except ValueError:
            continue
    return sorted(records, key=lambda r: r["goal"])


_CSS = """
*{box-sizing:border-box}
body{font:14px/1.45 system-ui,-apple-system,Segoe UI,Roboto,sans-serif;margin:0;color:#111827;
background:#f9fafb}
header{background:#111827;color:#f9fafb;padding:14px 24px}
header h1{font-size:20px;margin:0}header .sub{color:#9ca3af;font-size:12px}
main{padding:16px 24px;max-width:1400px}
section{background:#fff;border:1px solid #e5e7eb;border-radius:8px;padding:14px 18px;margin:0 0 16px}
section h2{font-size:16px;margin:0 0 10px}
table{border-collapse:collapse}th,td{padding:4px 12px 4px 0;text-align:left;vertical-align:top}
#summary th{color:#374151;font-weight:600;white-space:nowrap}
#categories td,#categories th{border-bottom:1px solid #f3f4f6}
.charts{display:flex;flex-wrap:wrap;gap:18px}
.warn{border-color:#f59e0b;background:#fffbeb}
.filters{display:flex;flex-wrap:wrap;gap:12px;align-items:center;margin-bottom:10px}
.filters label{font-weight:600}.filters select,.filters input{font:inherit;padding:3px 6px}
.filters input{min-width:240px}
.outcome button{font:inherit;padding:3px 10px;border:1px solid #d1d5db;background:#fff;cursor:pointer}
.outcome button.active{background:#2563eb;color:#fff;border-color:#2563eb}
.episode{border:1px solid #e5e7eb;border-radius:6px;margin:6px 0;background:#fff}
.episode>summary{cursor:pointer;padding:6px 10px;display:flex;gap:10px;align-items:baseline}
.episode[open]>summary{border-bottom:1px solid #e5e7eb;background:#f9fafb}
.badge{display:inline-block;min-width:64px;text-align:center;border-radius:10px;padding:0 8px;font-size:12px}
.badge.success{background:#dcfce7;color:#166534}.badge.failure{background:#fee2e2;color:#991b1b}
.badge.truncated{background:#fef3c7;color:#92400e}
.meta{color:#6b7280;font-size:12px;white-space:nowrap}
.instr{overflow:hidden;text-overflow:ellipsis;white-space:nowrap}
.body{padding:8px 12px}.instruction{background:#eff6ff;border-radius:6px;padding:6px 10px;margin-bottom:8px}
.step{border-left:3px solid #d1d5db;padding:4px 10px;margin:8px 0}.step.invalid{border-left-color:#dc2626}
.step.rewarded{border-left-color:#16a34a}
.page{white-space:pre-wrap;font:12px/1.4 ui-monospace,SFMono-Regular,Menlo,monospace;background:#f3f4f6;
padding:6px 8px;border-radius:4px;max-height:260px;overflow:auto}
.output{white-space:pre-wrap;font:12px/1.4 ui-monospace,monospace;background:#fefce8;padding:6px 8px;
border-radius:4px}
code{background:#e0e7ff;padding:0 4px;border-radius:3px}
.result{font-weight:600;margin-top:6px}.caption{color:#6b7280;font-size:11px;margin-top:4px}
#shown-count{color:#374151}
"""

_JS = r"""
(function () {
  "use strict";
  var EPISODES = JSON.parse(document.getElementById("episodes-data").textContent);
  var list = document.getElementById("episode-list");
  var count = document.getElementById("shown-count");
  var categorySelect = document.getElementById("filter-category");
  var envSelect = document.getElementById("filter-env");  // mixed reports only
  var search = document.getElementById("filter-text");
  var buttons = document.querySelectorAll(".outcome button");

  function outcome(ep) { return ep.success ? "success" : (ep.truncated ? "truncated" : "failure"); }
  function readHash() {
    var p = new URLSearchParams(location.hash.replace(/^#/, ""));
    return {filter: p.get("filter") || "all", category: p.get("category") || "all", q: p.get("q") || "",
            env: p.get("env") || "all", open: p.get("open")};
  }
  function writeHash(state) {
    var p = new URLSearchParams();
    if (state.filter !== "all") p.set("filter", state.filter);
    if (state.env && state.env !== "all") p.set("env", state.env);
    if (state.category !== "all") p.set("category", state.category);
    if (state.q) p.set("q", state.q);
    var text = p.toString();
    history.replaceState(null, "", text ? "#" + text : location.pathname + location.search);
    apply();
  }
  function current() {
    var active = document.querySelector(".outcome button.active");
    return {filter: active ? active.dataset.filter : "all", category: categorySelect.value,
            env: envSelect ? envSelect.value : "all", q: search.value.trim()};
  }
  function matches(ep, state) {
    if (state.filter === "success" && !ep.success) return false;
    if (state.filter === "failure" && ep.success) return false;
    if (state.filter === "truncated" && !ep.truncated) return false;
    if (state.category !== "all" && ep.category !== state.category) return false;
    if (state.env !== "all" && ep.env !== state.env) return false;
    if (state.q) {
      var q = state.q.toLowerCase();
      if (/^#\d+$/.test(q)) return String(ep.goal) === q.slice(1);
      if (ep.instruction.toLowerCase().indexOf(q) < 0) return false;
    }
    return true;
  }
  function el(tag, cls, text) {
    var node = document.createElement(tag);
    if (cls) node.className = cls;
    if (text !== undefined) node.textContent = text;
    return node;
  }
  function fillBody(details, ep) {
    if (details.dataset.filled) return;
    details.dataset.filled = "1";
    var body = el("div", "body");
    var ins = el("div", "instruction");
    ins.appendChild(el("strong", "", "Instruction: "));
    ins.appendChild(document.createTextNode(ep.instruction));
    body.appendChild(ins);
    ep.turns.forEach(function (t, i) {
      var step = el("div", "step" + (t.valid ? "" : " invalid") + (t.reward > 0 ? " rewarded" : ""));
      var head = el("div", "step-head");
      head.appendChild(el("strong", "", "Step " + (i + 1) + " "));
      head.appendChild(document.createTextNode("action "));
      head.appendChild(el("code", "", t.action === null ? "(none parsed)" : t.action));
      var note = " · reward " + t.reward.toFixed(3) + (t.valid ? "" : " · invalid");
      head.appendChild(document.createTextNode(note));
      step.appendChild(head);
      step.appendChild(el("div", "caption", ep.page ? "page the agent saw" : "what the model saw"));
      step.appendChild(el("div", "page", t.observation.split(" [SEP] ").join("\n")));
      if (t.output && t.output !== t.action) {
        step.appendChild(el("div", "caption", "model output"));
        step.appendChild(el("div", "output", t.output));
      }
      body.appendChild(step);
    });
    var result = "Result: reward " + ep.reward.toFixed(3) + " after " + ep.steps + " step(s), ended by " +
                 ep.ended_by;
    if (ep.note) result += " (" + ep.note + ")";
    body.appendChild(el("div", "result", result));
    if (ep.reward_info) body.appendChild(el("div", "output", JSON.stringify(ep.reward_info, null, 1)));
    details.appendChild(body);
  }
  function row(ep) {
    var details = el("details", "episode");
    details.dataset.goal = ep.goal;
    details.dataset.outcome = outcome(ep);
    details.dataset.category = ep.category;
    details.dataset.env = ep.env;
    var summary = el("summary");
    summary.appendChild(el("span", "badge " + outcome(ep), outcome(ep)));
    summary.appendChild(el("span", "meta", (envSelect ? ep.env + " " : "") + "#" + ep.goal + " · " +
                                           ep.category + " · reward " +
                                           ep.reward.toFixed(2) + " · " + ep.steps + " steps"));
    summary.appendChild(el("span", "instr", ep.instruction));
    details.appendChild(summary);
    details.addEventListener("toggle", function () { if (details.open) fillBody(details, ep); });
    return details;
  }
  function apply() {
    var state = readHash();
    buttons.forEach(function (b) { b.classList.toggle("active", b.dataset.filter === state.filter); });
    categorySelect.value = Array.prototype.some.call(categorySelect.options, function (o) {
      return o.value === state.category; }) ? state.category : "all";
    if (envSelect) envSelect.value = Array.prototype.some.call(envSelect.options, function (o) {
      return o.value === state.env; }) ? state.env : "all";
    if (document.activeElement !== search) search.value = state.q;
    var fragment = document.createDocumentFragment();
    var shown = 0;
    EPISODES.forEach(function (ep) {
      if (!matches(ep, state)) return;
      shown += 1;
      var details = row(ep);
      if (state.open !== null && ep.id === state.open) {
        details.open = true;
        fillBody(details, ep);
      }
      fragment.appendChild(details);
    });
    list.replaceChildren(fragment);
    count.textContent = shown + " of " + EPISODES.length + " episodes shown";
    count.dataset.shown = String(shown);
    document.body.dataset.filter = state.filter;
  }
  buttons.forEach(function (b) {
    b.addEventListener("click", function () {
      buttons.forEach(function (o) { o.classList.toggle("active", o === b); });
      writeHash(current());
    });
  });
  categorySelect.addEventListener("change", function () { writeHash(current()); });
  if (envSelect) envSelect.addEventListener("change", function () { writeHash(current()); });
  search.addEventListener("input", function () { writeHash(current()); });
  window.addEventListener("hashchange", apply);
  apply();
})();
"""

_PAGE = """<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8">
<meta name="viewport" content="width=device-width,initial-scale=1">
<title>{title}</title><style>{css}</style></head>
<body>
<header><h1>{title}</h1><div class="sub">generated {created} by agent-train eval</div></header>
<main>
{failures}
{body}
<section id="episodes"><h2>Episodes</h2>
<div class="filters">
 <span class="outcome"><label>Outcome </label><button type="button" data-filter="all"
 class="active">all</button><button type="button" data-filter="success">success</button><button
 type="button" data-filter="failure">failure</button><button type="button"
 data-filter="truncated">truncated</button></span>
 <label for="filter-category">Category</label><select id="filter-category"><option
 value="all">all</option>{options}</select>
 {env_filter}
 <label for="filter-text">Search</label><input id="filter-text" type="search"
 placeholder="instruction words, or #goal">
 <span id="shown-count" data-shown="{total}">{total} episodes</span>
</div>
<div id="episode-list"></div>
</section>
</main>
<script id="episodes-data" type="application/json">{data}</script>
<script>{js}</script>
</body></html>
"""
