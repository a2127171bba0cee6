"""docker/trainer-lock.py's derivation on made-up resolutions (no package index): which base packages stay frozen,
which move and to what, and which refuse. The real resolutions run in test_trainer_verl09_resolution.py (slow)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "docker" / "trainer-lock.py"
_spec = importlib.util.spec_from_file_location("trainer_lock", SCRIPT)
trainer_lock = importlib.util.module_from_spec(_spec)
sys.modules["trainer_lock"] = trainer_lock  # dataclasses look their module up
_spec.loader.exec_module(trainer_lock)


def _item(name: str, version: str, requires: tuple[str, ...] = (), extras: tuple[str, ...] = ()) -> dict:
    item = {"metadata": {"name": name, "version": version, "requires_dist": list(requires)}}
    if extras:
        item["requested_extras"] = list(extras)
    return item


def _pins(*lines: str) -> dict[str, tuple[str, str]]:
    return trainer_lock.read_pins("\n".join(lines))


REPORT = {
    "install": [
        _item("ray", "2.60.0", ('aiohttp>=3.14.4; extra == "serve"', "protobuf>=3.20.3"), extras=("serve",)),
        _item("fastapi", "0.165.0", ("typing-inspection>=0.4.2", 'opentelemetry-sdk>=1.44; extra == "all"')),
        _item("aiohttp", "3.14.5"),
        _item("typing_inspection", "0.4.5"),
        _item("protobuf", "7.36.2"),
        _item("torch", "2.11.0", ("numpy",)),
    ]
}


def test_a_floor_the_base_misses_moves_only_that_package() -> None:
    base = _pins("torch==2.11.0", "aiohttp==3.12.15", "typing-inspection==0.4.0", "protobuf==6.31.1",
                 "opentelemetry-sdk==1.30.0", "uvicorn==0.34.2")  # fmt: skip
    lock = trainer_lock.derive(base, ["torch"], _pins("ray==2.60.0", "aiohttp==3.14.4"), REPORT)
    assert set(lock.moved) == {"aiohttp", "typing-inspection"}
    assert lock.extra["aiohttp"] == "aiohttp==3.14.4"  # our constraints' pin, not the resolver's 3.14.5
    assert lock.extra["typing-inspection"] == "typing_inspection==0.4.5"  # the resolver's, as spelt there
    assert "ray 2.60.0 needs aiohttp>=3.14.4" in lock.moved["aiohttp"]
    # accepted by every requirement, or required only behind an extra nobody asked for: frozen
    for name in ("torch", "protobuf", "opentelemetry-sdk", "uvicorn"):
        assert name in lock.lock
    assert lock.extra["ray"] == "ray==2.60.0"  # a pin for what the base lacks


def test_our_pin_is_taken_only_where_the_requirements_accept_it() -> None:
    base = _pins("aiohttp==3.12.15")
    lock = trainer_lock.derive(
        base, [], _pins("aiohttp==3.13.0"), REPORT
    )  # below ray's floor: the resolver's
    assert lock.extra["aiohttp"] == "aiohttp==3.14.5" and "-> 3.14.5" in lock.moved["aiohttp"]


def test_an_extra_requested_by_another_requirement_counts() -> None:
    report = {"install": [*REPORT["install"], _item("verl", "0.9.1", ("fastapi[all]",), extras=())]}
    base = _pins("opentelemetry-sdk==1.30.0")
    lock = trainer_lock.derive(
        base, [], {}, {"install": [*report["install"], _item("opentelemetry-sdk", "1.45.2")]}
    )
    assert "opentelemetry-sdk" in lock.moved


def test_a_documented_package_is_never_moved_silently() -> None:
    base = _pins("torch==2.11.0", "aiohttp==3.12.15")
    with pytest.raises(
        trainer_lock.LockError, match=r"aiohttp==3\.12\.15: ray 2\.60\.0 needs aiohttp>=3\.14\.4"
    ):
        trainer_lock.derive(base, ["torch", "aiohttp"], {}, REPORT)
    lock = trainer_lock.derive(
        base, ["torch", "aiohttp"], _pins("aiohttp==3.14.4"), REPORT, unlock=["AIOHTTP"]
    )
    assert lock.extra["aiohttp"] == "aiohttp==3.14.4" and "aiohttp" not in lock.lock


def test_the_command_writes_both_files_and_says_what_moved(tmp_path, monkeypatch, capsys) -> None:
    (tmp_path / "freeze.txt").write_text("torch==2.11.0\naiohttp==3.12.15\n-e git+https://x/y#egg=z\n")
    (tmp_path / "documented.txt").write_text("# sglang's pins\ntorch==2.11.0\n")
    (tmp_path / "constraints.txt").write_text("ray==2.60.0\n")
    monkeypatch.setattr(trainer_lock, "resolve", lambda python, files, install, cwd, scratch=None: REPORT)
    code = trainer_lock.main(["--freeze", str(tmp_path / "freeze.txt"), "--documented", str(tmp_path / "documented.txt"),
                              "--constraints", str(tmp_path / "constraints.txt"), "--out-dir", str(tmp_path), "ray[serve]"])  # fmt: skip
    assert code == 0
    assert (tmp_path / "image-lock.txt").read_text() == "torch==2.11.0\n"
    assert (tmp_path / "trainer-extra.txt").read_text() == "aiohttp==3.14.5\nray==2.60.0\n"
    assert "moved aiohttp: aiohttp==3.12.15 -> 3.14.5" in capsys.readouterr().out


def test_a_documented_package_the_base_lacks_keeps_its_documented_version() -> None:
    """The CPU build's base has torch and no sglang: what it shares with the CUDA image installs at the CUDA
    image's version (rule 4), while the base's own packages stay as they are and unlocked ones stay free."""
    base = _pins("torch==2.13.0+cpu")  # a CPU base: torch only
    documented = _pins("sglang==0.5.9", "torch==2.9.1", "transformers==4.57.1", "aiohttp==3.14.4")
    lock = trainer_lock.derive(base, documented, _pins("ray==2.60.0"), REPORT, unlock=["aiohttp"])
    assert lock.lock["torch"] == "torch==2.13.0+cpu"  # the base's own, not the documented 2.9.1
    assert lock.extra["transformers"] == "transformers==4.57.1"
    assert lock.extra["sglang"] == "sglang==0.5.9"  # harmless: only applies if something installs it
    assert "aiohttp" not in lock.extra  # unlocked: the resolver's choice
    # our own constraint wins over the documented version
    lock = trainer_lock.derive(base, documented, _pins("transformers==4.57.3"), REPORT)
    assert lock.extra["transformers"] == "transformers==4.57.3"
    # a base that has every documented package (the CUDA image) gets nothing from this rule
    full = _pins("sglang==0.5.9", "torch==2.9.1", "transformers==4.57.1", "aiohttp==3.14.5")
    assert trainer_lock.absent_documented(full, documented, {}) == {}


def test_a_base_package_at_our_pinned_version_is_held_while_resolving(tmp_path, monkeypatch) -> None:
    """The 0.9 base has datasets 4.0.0 (our pin) and dill 0.3.8: left free, the resolver took a newer datasets whose
    multiprocess needs dill>=0.4.1, the lock then kept datasets 4.0.0 and moved dill, and pip refused the install
    (datasets 4.0.0 needs dill<0.3.9). Held at the version we pin, the resolution agrees with the lock."""
    seen: dict[str, str] = {}

    def resolve(python, files, install, cwd, scratch=None):
        seen.update({Path(f).name: Path(f).read_text() for f in files})
        return {"install": [_item("datasets", "4.0.0", ("dill<0.3.9",)), _item("dill", "0.3.8")]}

    monkeypatch.setattr(trainer_lock, "resolve", resolve)
    base = _pins("datasets==4.0.0", "dill==0.3.8", "aiohttp==3.12.15")
    lock = trainer_lock.build_lock(
        base, [], _pins("datasets==4.0.0", "aiohttp==3.14.4", "ray==2.60.0"), ["verl"]
    )
    pins = seen["pins.txt"].split()
    assert "datasets==4.0.0" in pins and "ray==2.60.0" in pins
    assert (
        "aiohttp==3.14.4" not in pins
    )  # the base has another version: free, moved only if something needs it
    assert lock.lock["datasets"] == "datasets==4.0.0" and lock.lock["dill"] == "dill==0.3.8"
