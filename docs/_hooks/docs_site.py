"""MkDocs hooks of the docs site (mkdocs.yml: ``hooks``): what plain Markdown pages cannot do by themselves.

- The Environments section lists every page under ``docs/environments/``, in the nav and where a page holds the
  marker ``<!-- environment pages -->``: an environment's page joins the site by being there, and the strict build
  never points at a page that is not (yet) there.
- A link from a page to a file of the repository outside ``docs/`` (``../services/trainer/README.md``) works on
  GitHub but is no page of the site: it becomes the file's path in code (a link to it where ``repo_url`` is set),
  and a link to a file that does not exist is a warning, so ``mkdocs build --strict`` fails on it like on any
  other broken link.
"""

from __future__ import annotations

import logging
import re
from pathlib import Path
from typing import Any

log = logging.getLogger("mkdocs.hooks.docs_site")

ENV_SECTION = "Environments"
ENV_DIR = "environments"
ENV_MARKER = "<!-- environment pages -->"
FIRST_ENV_PAGES = ("index.md", "webshop.md")  # then the others by title; guides (adding.md) last
GUIDES = ("adding.md",)
LINK = re.compile(r"(?<!!)\[(?P<text>[^\]]+)\]\((?P<target>[^)\s]+)\)")
FENCE = re.compile(r"^\s*(```|~~~)")


def _title(path: Path) -> str:
    for line in path.read_text(encoding="utf-8").splitlines():
        if line.startswith("# "):
            return line[2:].strip()
    return path.stem.replace("-", " ").capitalize()


def _env_pages(docs_dir: Path) -> list[Path]:
    folder = docs_dir / ENV_DIR
    pages = [p for p in folder.glob("*.md") if p.name not in FIRST_ENV_PAGES and p.name not in GUIDES]
    ordered = [folder / name for name in FIRST_ENV_PAGES if (folder / name).exists()]
    ordered += sorted(pages, key=_title)
    ordered += [folder / name for name in GUIDES if (folder / name).exists()]
    return ordered


def on_config(config: Any) -> Any:
    """Fill the nav's Environments section with the pages that are there."""
    docs_dir = Path(config["docs_dir"])
    for item in config["nav"] or []:
        if isinstance(item, dict) and ENV_SECTION in item:
            item[ENV_SECTION] = [
                {_title(page): page.relative_to(docs_dir).as_posix()} for page in _env_pages(docs_dir)
            ]
    return config


def on_page_markdown(markdown: str, page: Any, config: Any, files: Any) -> str:
    docs_dir = Path(config["docs_dir"]).resolve()
    repo = docs_dir.parent
    source = (docs_dir / page.file.src_path).resolve()
    if ENV_MARKER in markdown:
        rows = [
            f"- [{_title(p)}]({p.relative_to(source.parent).as_posix()})"
            for p in _env_pages(docs_dir)
            if p.resolve() != source
        ]
        markdown = markdown.replace(ENV_MARKER, "\n".join(rows) or "(none yet)")

    def outside(match: re.Match[str]) -> str:
        text, target = match["text"], match["target"]
        if re.match(r"^[a-z][a-z0-9+.-]*:", target) or target.startswith(("#", "/")):
            return match[0]  # a URL, an anchor, a site-absolute path
        path_part = target.split("#", 1)[0]
        resolved = (source.parent / path_part).resolve()
        if resolved.is_relative_to(docs_dir):
            return match[0]  # a page or file of the site: MkDocs checks it
        if not resolved.is_relative_to(repo) or not resolved.exists():
            log.warning("%s links to %s, which is not a file of the repository", page.file.src_path, target)
            return match[0]
        relative = resolved.relative_to(repo).as_posix()
        repo_url = (config.get("repo_url") or "").rstrip("/")
        if repo_url:
            kind = "tree" if resolved.is_dir() else "blob"
            return f"[{text}]({repo_url}/{kind}/main/{relative})"
        label = text.strip("`")
        return f"`{relative}`" if label == relative else f"{text} (`{relative}`)"

    lines, fenced = [], False
    for line in markdown.split("\n"):
        if FENCE.match(line):
            fenced = not fenced
        lines.append(line if fenced else LINK.sub(outside, line))
    return "\n".join(lines)
