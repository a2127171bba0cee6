"""Streaming the instruction files (``JsonObjectFile``) changes nothing: same values as ``json.load``, and a
prepared catalog byte for byte identical to one prepared with the files loaded whole."""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

import orjson
import pytest

from agent_envs.envs.webshop.catalog import raw
from agent_envs.envs.webshop.catalog.generate import ATTRIBUTE_FILE, HUMAN_FILE, generate_catalog
from agent_envs.envs.webshop.catalog.prepare import prepare_catalog
from agent_envs.envs.webshop.catalog.raw import (
    JsonObjectFile,
    RawDataError,
    iter_json_object,
    load_json_object,
)
from agent_envs.envs.webshop.catalog.store import MANIFEST


def random_value(rng: random.Random, depth: int = 0) -> Any:
    roll = rng.random()
    if depth > 2 or roll < 0.3:
        return rng.choice(
            [1, -2.5e10, 3.25, 0.1, True, False, None, 'x"y\\u00e9', "é👍", "", 12345678901234567890]
        )
    if roll < 0.6:
        return [random_value(rng, depth + 1) for _ in range(rng.randint(0, 4))]
    return {rng.choice(["a", "b", "ü", "\\"]): random_value(rng, depth + 1) for _ in range(rng.randint(0, 3))}


def test_members_match_json_load_at_every_chunk_boundary(tmp_path: Path) -> None:
    rng = random.Random(0)
    path = tmp_path / "object.json"
    for _ in range(150):
        keys = [
            rng.choice(["A1", "B2", "é", 'C"3', "D" * rng.randint(1, 30)]) for _ in range(rng.randint(0, 12))
        ]
        members = [(key, random_value(rng)) for key in keys]  # keys repeat: the last one wins
        space = [rng.choice(["", " ", "\n  ", "\t"]) for _ in range(4)]
        text = "{" + ",".join(
            f"{space[0]}{json.dumps(key, ensure_ascii=rng.random() < 0.5)}{space[1]}:{space[2]}"
            f"{json.dumps(value, ensure_ascii=False)}{space[3]}"
            for key, value in members
        ) + "}" + rng.choice(["", "\n"])  # fmt: skip
        path.write_text(text, encoding="utf-8")
        for chunk_size in (1, 2, 3, 7, 64, 1 << 20):
            got = list(iter_json_object(path, chunk_size=chunk_size))
            assert [key for key, _ in got] == keys
            assert [json.loads(value) for _, value in got] == [value for _, value in members]
        expected = json.loads(text)
        with JsonObjectFile(path) as streamed:
            assert len(streamed) == len(expected)
            assert all(streamed.get(key) == value for key, value in expected.items())
            assert streamed.get("missing", 7) == 7 and "missing" not in streamed


@pytest.mark.parametrize(
    "text", ["", "[]", "{", '{"a":1,}', '{"a" 1}', '{"a":1 "b":2}', "{1:2}", '{"a":1}}', '{"a":1} x', "{,}"]
)
def test_malformed_objects_are_rejected(tmp_path: Path, text: str) -> None:
    (tmp_path / "bad.json").write_text(text, encoding="utf-8")
    with pytest.raises(RawDataError):
        JsonObjectFile(tmp_path / "bad.json")
    with pytest.raises((RawDataError, json.JSONDecodeError)):
        load_json_object(tmp_path / "bad.json")  # json.load rejects them too


class WholeFile:
    """The former loader: the whole file in memory with ``json.load``, behind JsonObjectFile's interface."""

    def __init__(self, path: Path | None) -> None:
        self.data = load_json_object(path)

    def get(self, key: str, default: Any = None) -> Any:
        return self.data.get(key, default)

    def __enter__(self) -> WholeFile:
        return self

    def __exit__(self, *exc: object) -> None:
        pass


def prepared_files(directory: Path) -> dict[str, bytes]:
    files = {str(p.relative_to(directory)): p.read_bytes() for p in directory.rglob("*") if p.is_file()}
    manifest = orjson.loads(files.pop(MANIFEST))
    for varying in ("created_unix", "prepare_seconds"):
        manifest.pop(varying)
    files[MANIFEST] = orjson.dumps(manifest)
    return files


def test_prepared_catalog_is_identical_with_streamed_instructions(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    generate_catalog(tmp_path / "raw", products=2500, seed=3, progress=False)
    assert (tmp_path / "raw" / ATTRIBUTE_FILE).exists() and (tmp_path / "raw" / HUMAN_FILE).exists()
    prepare_catalog(tmp_path / "raw", tmp_path / "streamed", progress=False)
    monkeypatch.setattr(raw, "JsonObjectFile", WholeFile)
    prepare_catalog(tmp_path / "raw", tmp_path / "whole", progress=False)
    streamed, whole = prepared_files(tmp_path / "streamed"), prepared_files(tmp_path / "whole")
    assert sorted(streamed) == sorted(whole)
    assert [name for name in streamed if streamed[name] != whole[name]] == []
