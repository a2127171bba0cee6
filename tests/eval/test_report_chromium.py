"""``report.html`` in headless Chromium: it renders (``--dump-dom``, with a filter taken from the URL hash on
load), its filters work (driven over the DevTools protocol: buttons, the category menu, the search box and
hash changes), and a screenshot shows content."""

from __future__ import annotations

import contextlib
import json
import re
import subprocess
import time
import urllib.request
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from _eval_support import png_is_blank

from agent_trainer.evaluation.metrics import summarize
from agent_trainer.evaluation.report_html import render_report

pytestmark = pytest.mark.cluster

FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--mute-audio",
]
EPISODE = re.compile(
    r'<details class="episode"[^>]*data-goal="(\d+)" data-outcome="(\w+)" data-category="([^"]*)"'
)
SHOWN = (
    "[...document.querySelectorAll('details.episode')]"
    ".map(e => [+e.dataset.goal, e.dataset.outcome, e.dataset.category])"
)


def chromium_run(chromium: str, profile: Path, *args: str) -> str:
    result = subprocess.run(
        [chromium, *FLAGS, f"--user-data-dir={profile}", *args], capture_output=True, text=True, timeout=90
    )
    assert result.returncode == 0, result.stderr[-2000:]
    return result.stdout


def records_of(out: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (out / "trajectories.jsonl").read_text().splitlines()]


class DevTools:
    """A page of a headless Chromium driven over the DevTools protocol (a websocket, one call at a time)."""

    def __init__(self, chromium: str, profile: Path) -> None:
        from websockets.sync.client import connect

        self._stack = contextlib.ExitStack()
        self.process = subprocess.Popen(
            [chromium, *FLAGS, f"--user-data-dir={profile}", "--remote-debugging-port=0", "about:blank"],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        try:
            port_file = profile / "DevToolsActivePort"
            for _ in range(600):
                if port_file.exists() and len(port_file.read_text().splitlines()) >= 2:
                    break
                time.sleep(0.05)
            port = int(port_file.read_text().splitlines()[0])
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/json/list", timeout=10) as response:
                pages = [t for t in json.load(response) if t["type"] == "page"]
            self.socket = self._stack.enter_context(
                connect(pages[0]["webSocketDebuggerUrl"], max_size=None, open_timeout=10)
            )
        except BaseException:
            self.close()
            raise
        self.next_id = 0

    def call(self, method: str, **params: Any) -> dict[str, Any]:
        self.next_id += 1
        self.socket.send(json.dumps({"id": self.next_id, "method": method, "params": params}))
        while True:
            message = json.loads(self.socket.recv(timeout=30))
            if message.get("id") == self.next_id:
                assert "error" not in message, message
                return message["result"]

    def evaluate(self, expression: str) -> Any:
        result = self.call("Runtime.evaluate", expression=expression, returnByValue=True)
        assert "exceptionDetails" not in result, result
        return result["result"].get("value")

    def open(self, url: str) -> None:
        self.call("Page.navigate", url=url)
        for _ in range(600):
            if self.evaluate(
                "document.readyState === 'complete' && !!document.getElementById('shown-count')"
            ):
                return
            time.sleep(0.05)
        raise AssertionError(f"{url} did not load")

    def shown(self) -> list[tuple[int, str, str]]:
        return [tuple(item) for item in self.evaluate(SHOWN)]

    def close(self) -> None:
        self._stack.close()
        self.process.terminate()
        try:
            self.process.wait(10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait(10)


@pytest.fixture
def page(chromium: str, tmp_path: Path) -> Any:
    pytest.importorskip("websockets", reason="the DevTools tests need `websockets` (pip install websockets)")
    browser = DevTools(chromium, tmp_path / "devtools-profile")
    try:
        yield browser
    finally:
        browser.close()


def test_report_renders_with_the_filter_from_the_hash(random_run: Any, chromium: str, tmp_path: Path) -> None:
    m = random_run.metrics
    dom = chromium_run(
        chromium,
        tmp_path / "profile",
        "--virtual-time-budget=5000",
        "--dump-dom",
        random_run.report_path.resolve().as_uri() + "#filter=failure",
    )
    assert "WebShop eval: random on test" in dom
    assert f"{m['score']:.1f}" in dom and "Success rate" in dom  # the summary table
    for chart in ("chart-reward", "chart-category", "chart-steps"):
        assert f'id="{chart}"' in dom
    shown = EPISODE.findall(dom)
    assert len(shown) == m["episodes"] - m["successes"] > 0
    assert all(outcome != "success" for _, outcome, _ in shown)
    assert f'data-shown="{len(shown)}"' in dom


def test_filters_by_hash(random_run: Any, expert_run: Any, page: DevTools) -> None:
    m = random_run.metrics
    page.open(random_run.report_path.resolve().as_uri())
    assert len(page.shown()) == m["episodes"]

    page.evaluate("location.hash = 'filter=truncated'")
    truncated = page.shown()
    assert truncated and {o for _, o, _ in truncated} == {"truncated"}
    assert len(truncated) == round(m["truncated_rate"] * m["episodes"])

    category = sorted(m["by_category"])[0]
    page.evaluate(f"location.hash = 'category={category}'")
    in_category = page.shown()
    assert len(in_category) == m["by_category"][category]["episodes"]
    assert {c for _, _, c in in_category} == {category}

    # one opened episode shows every step as the agent saw it: instruction, page, action, reward
    goal = in_category[0][0]
    page.evaluate(f"location.hash = 'category={category}&open={goal}'")
    record = next(r for r in records_of(random_run.out) if r["goal"] == goal)
    assert page.evaluate("document.querySelectorAll('details.episode[open] .step').length") == record["steps"]
    body = page.evaluate("document.querySelector('details.episode[open] .body').innerText")
    assert record["instruction"] in body and "Step 1" in body and "Result: reward" in body
    assert record["turns"][0]["action"] in body

    em = expert_run.metrics
    page.open(expert_run.report_path.resolve().as_uri() + "#filter=success")
    successes = page.shown()
    assert len(successes) == em["successes"] and {o for _, o, _ in successes} == {"success"}
    page.evaluate("location.hash = 'q=%237'")
    assert [g for g, _, _ in page.shown()] == [7]
    records = records_of(expert_run.out)
    words = Counter(w for r in records for w in set(re.findall(r"[a-z]{5,}", r["instruction"])))
    word = min(w for w, n in words.items() if 2 <= n <= 5)
    page.evaluate(f"location.hash = 'q={word}'")
    assert sorted(g for g, _, _ in page.shown()) == sorted(
        r["goal"] for r in records if word in r["instruction"]
    )


def test_filter_controls_work_when_clicked(random_run: Any, page: DevTools) -> None:
    m = random_run.metrics
    page.open(random_run.report_path.resolve().as_uri())
    page.evaluate("document.querySelector('.outcome button[data-filter=truncated]').click()")
    assert page.evaluate("location.hash") == "#filter=truncated"
    assert {o for _, o, _ in page.shown()} == {"truncated"}

    category = sorted(m["by_category"])[-1]
    page.evaluate(
        "{ const s = document.getElementById('filter-category');"
        f"s.value = {json.dumps(category)}; s.dispatchEvent(new Event('change')); }}"
    )
    shown = page.shown()
    assert {c for _, _, c in shown} <= {category} and {o for _, o, _ in shown} <= {"truncated"}
    assert page.evaluate("document.getElementById('shown-count').dataset.shown") == str(len(shown))

    page.evaluate("document.querySelector('.outcome button[data-filter=all]').click()")
    goal = min(r["goal"] for r in records_of(random_run.out) if r["category"] == category)
    page.evaluate(
        "{ const s = document.getElementById('filter-text');"
        f"s.value = '#{goal}'; s.dispatchEvent(new Event('input')); }}"
    )
    assert page.shown() == [(goal, page.shown()[0][1], category)]
    assert page.evaluate("location.hash") == f"#category={category}&q=%23{goal}"
    page.evaluate(
        "{ const c = document.getElementById('filter-category'); c.value = 'all';"
        " c.dispatchEvent(new Event('change'));"
        " const s = document.getElementById('filter-text'); s.value = '';"
        " s.dispatchEvent(new Event('input')); }"
    )
    assert len(page.shown()) == m["episodes"] and page.evaluate("location.hash") == ""


def test_report_screenshot_shows_content(random_run: Any, chromium: str, tmp_path: Path) -> None:
    shot = tmp_path / "report.png"
    url = random_run.report_path.resolve().as_uri() + "#filter=truncated&open=0"
    chromium_run(chromium, tmp_path / "profile", "--window-size=1280,1600", f"--screenshot={shot}", url)
    assert shot.exists() and shot.stat().st_size > 20_000
    assert not png_is_blank(shot)


def test_report_is_self_contained_and_escapes_content() -> None:
    record = {
        "goal": 1,
        "category": "home",
        "instruction": "buy </script><script>alert(1)</script> & more",
        "reward": 0.0,
        "success": False,
        "steps": 1,
        "truncated": False,
        "ended_by": "purchase",
        "turns": [
            {
                "observation": "WebShop [SEP] <b>x</b>",
                "output": "x",
                "action": "click[x]",
                "reward": 0.0,
                "valid": False,
            }
        ],
    }
    page = render_report({**summarize([record]), "policy": {"name": "t"}}, [record])
    assert page.count("<script") == 2  # the data block and the page's own script, nothing injected
    assert "alert(1)</script>" not in page
    assert not re.search(r'(src|href)="(https?:)?//', page)  # no CDN, no external resources
