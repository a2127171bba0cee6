"""``report.html``: one self-contained page (inline CSS, JS and SVG; no network) per evaluation.

It holds the summary table, the reward histogram, success by category, the steps distribution and a
browsable list of episodes showing every step as the agent saw it (instruction, page, model output, action,
reward). The list is filterable by outcome, category and text; the filters live in the URL hash
(``report.html#filter=success&category=beauty&q=shoes&open=12``), so a filtered view can be linked to, and
the page applies the hash on load and on every change (the controls just rewrite the hash).
"""

from __future__ import annotations

import json
import time
from collections.abc import Mapping, Sequence
from html import escape
from pathlib import Path
from typing import Any

from webshop_env.catalog.fidelity import describe_fidelity

from .svg import PALETTE, bar_chart, hbar_chart


def _pct(value: float) -> str:
    return f"{100 * value:.1f} %"


def _ci(pair: Sequence[float], scale: float = 1.0, digits: int = 1) -> str:
    return f"[{pair[0] * scale:.{digits}f}, {pair[1] * scale:.{digits}f}]"


def summary_rows(metrics: Mapping[str, Any]) -> list[tuple[str, str]]:
    """(label, value) rows of the summary table."""
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


def _episode_payload(record: Mapping[str, Any]) -> dict[str, Any]:
    return {
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


def render_report(
    metrics: Mapping[str, Any], records: Sequence[Mapping[str, Any]], title: str | None = None
) -> str:
    """The report page as a string."""
    policy = (metrics.get("policy") or {}).get("name", "policy")
    split = (metrics.get("config") or {}).get("split", "")
    title = title or f"WebShop eval: {policy} on {split}".strip()
    rows = "".join(f"<tr><th>{escape(k)}</th><td>{escape(v)}</td></tr>" for k, v in summary_rows(metrics))

    hist = metrics["reward_histogram"]
    reward_svg = bar_chart(
        hist["labels"],
        hist["counts"],
        "Final reward (episodes)",
        annotations=[str(c) if c else "" for c in hist["counts"]],
        element_id="chart-reward",
    )
    categories = metrics["by_category"]
    names = list(categories)
    category_svg = hbar_chart(
        names,
        [categories[n]["success_rate"] for n in names],
        "Success rate by category",
        annotations=[f"{_pct(categories[n]['success_rate'])} of {categories[n]['episodes']}" for n in names],
        element_id="chart-category",
    )
    steps = metrics["steps_histogram"]
    steps_svg = bar_chart(
        steps["labels"], steps["counts"], "Steps per episode", color=PALETTE[3], element_id="chart-steps"
    )

    category_rows = "".join(
        f"<tr><td>{escape(n)}</td><td>{c['episodes']}</td><td>{c['score']:.1f}</td>"
        f"<td>{_pct(c['success_rate'])}</td><td>{c['mean_steps']:.2f}</td></tr>"
        for n, c in categories.items()
    )
    failures = metrics.get("failed_episodes") or []
    failure_html = ""
    if failures or metrics.get("not_run"):
        items = "".join(f"<li>goal {f['goal']}: {escape(str(f['error']))}</li>" for f in failures[:50])
        failure_html = (
            f'<section class="warn" id="failures"><h2>Incomplete run</h2><p>{len(failures)} episode(s) '
            f"failed (policy errors, not scored) and {metrics.get('not_run', 0)} were not run. "
            "Rerun the same command "
            f"to resume.</p><ul>{items}</ul></section>"
        )
    options = "".join(f'<option value="{escape(n)}">{escape(n)}</option>' for n in names)
    data = _script_json([_episode_payload(r) for r in records])
    created = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(metrics.get("created_unix", time.time())))
    return _PAGE.format(
        title=escape(title),
        created=escape(created),
        rows=rows,
        reward_svg=reward_svg,
        category_svg=category_svg,
        steps_svg=steps_svg,
        category_rows=category_rows,
        failures=failure_html,
        options=options,
        data=data,
        css=_CSS,
        js=_JS,
        total=len(records),
    )


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
  var search = document.getElementById("filter-text");
  var buttons = document.querySelectorAll(".outcome button");

  function outcome(ep) { return ep.success ? "success" : (ep.truncated ? "truncated" : "failure"); }
  function readHash() {
    var p = new URLSearchParams(location.hash.replace(/^#/, ""));
    return {filter: p.get("filter") || "all", category: p.get("category") || "all", q: p.get("q") || "",
            open: p.get("open")};
  }
  function writeHash(state) {
    var p = new URLSearchParams();
    if (state.filter !== "all") p.set("filter", state.filter);
    if (state.category !== "all") p.set("category", state.category);
    if (state.q) p.set("q", state.q);
    var text = p.toString();
    history.replaceState(null, "", text ? "#" + text : location.pathname + location.search);
    apply();
  }
  function current() {
    var active = document.querySelector(".outcome button.active");
    return {filter: active ? active.dataset.filter : "all", category: categorySelect.value,
            q: search.value.trim()};
  }
  function matches(ep, state) {
    if (state.filter === "success" && !ep.success) return false;
    if (state.filter === "failure" && ep.success) return false;
    if (state.filter === "truncated" && !ep.truncated) return false;
    if (state.category !== "all" && ep.category !== state.category) return false;
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
      step.appendChild(el("div", "caption", "page the agent saw"));
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
    var summary = el("summary");
    summary.appendChild(el("span", "badge " + outcome(ep), outcome(ep)));
    summary.appendChild(el("span", "meta", "#" + ep.goal + " · " + ep.category + " · reward " +
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
    if (document.activeElement !== search) search.value = state.q;
    var fragment = document.createDocumentFragment();
    var shown = 0;
    EPISODES.forEach(function (ep) {
      if (!matches(ep, state)) return;
      shown += 1;
      var details = row(ep);
      if (state.open !== null && String(ep.goal) === state.open) {
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
<header><h1>{title}</h1><div class="sub">generated {created} by webshop-train eval</div></header>
<main>
{failures}
<section id="summary-section"><h2>Summary</h2><table id="summary">{rows}</table></section>
<section><h2>Distributions</h2><div class="charts">{reward_svg}{category_svg}{steps_svg}</div></section>
<section><h2>By category</h2><table id="categories"><tr><th>Category</th><th>Episodes</th><th>Score</th>
<th>Success</th><th>Mean steps</th></tr>{category_rows}</table></section>
<section id="episodes"><h2>Episodes</h2>
<div class="filters">
 <span class="outcome"><label>Outcome </label><button type="button" data-filter="all"
 class="active">all</button><button type="button" data-filter="success">success</button><button
 type="button" data-filter="failure">failure</button><button type="button"
 data-filter="truncated">truncated</button></span>
 <label for="filter-category">Category</label><select id="filter-category"><option
 value="all">all</option>{options}</select>
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
