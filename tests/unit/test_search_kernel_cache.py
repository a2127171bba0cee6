"""Where the compiled search kernels are cached: seeded from the image's build-time compile, or not at all."""

from __future__ import annotations

from pathlib import Path

import numba
import pytest

from agent_envs.envs.webshop.search import kernels


def test_an_empty_cache_dir_is_seeded_from_the_build_time_compile(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    seed = tmp_path / "seed"
    seed.mkdir()
    (seed / "kernels.rank-1.py311.nbi").write_bytes(b"index")
    target = tmp_path / "tmpfs" / "numba-cache"
    monkeypatch.setenv("WEBSHOP_NUMBA_CACHE_SEED", str(seed))
    monkeypatch.setattr(numba.config, "CACHE_DIR", str(target))
    kernels._seed_compiled_cache()
    assert (target / "kernels.rank-1.py311.nbi").read_bytes() == b"index"
    assert [p.name for p in target.parent.iterdir()] == ["numba-cache"]  # no staging directory left behind

    (target / "kernels.rank-1.py311.nbi").write_bytes(b"newer")  # a cache in use is never overwritten
    kernels._seed_compiled_cache()
    assert (target / "kernels.rank-1.py311.nbi").read_bytes() == b"newer"


def test_no_seed_or_no_cache_dir_changes_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    target = tmp_path / "numba-cache"
    monkeypatch.setattr(numba.config, "CACHE_DIR", str(target))
    monkeypatch.setenv("WEBSHOP_NUMBA_CACHE_SEED", str(tmp_path / "missing"))
    kernels._seed_compiled_cache()
    assert not target.exists()


def test_kernels_compile_uncached_when_no_cache_location_is_writable(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    real_njit = numba.njit

    def njit_without_locator(*args, **kwargs):  # type: ignore[no-untyped-def]
        if kwargs.get("cache"):
            raise RuntimeError("cannot cache function '<lambda>': no locator available for file 'kernels.py'")
        return real_njit(*args, **kwargs)

    monkeypatch.setattr(numba, "njit", njit_without_locator)
    assert kernels._cache_usable() is False
    assert "NUMBA_CACHE_DIR" in caplog.text
    monkeypatch.setattr(numba, "njit", real_njit)
    assert kernels._cache_usable() is True
