"""The raw-file downloader, against a local HTTP server (never the internet): resume, checks, refusals."""

from __future__ import annotations

import hashlib
import re
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from agent_envs.envs.webshop.catalog import download
from agent_envs.envs.webshop.catalog.download import DownloadError, download_catalog, download_file

SMALL = download.SMALL_FILES


@dataclass
class Behaviour:
    """What the test server does; tests change it between downloads."""

    files: dict[str, bytes] = field(default_factory=dict)
    cut_after: dict[str, int] = field(default_factory=dict)  # name -> body bytes sent before hanging up
    cuts_left: int = 0  # how many responses are cut off (then the transfers complete)
    html: set[str] = field(default_factory=set)  # names answered with Google's refusal page
    ignore_range: bool = False  # answer 200 with the whole file even to a Range request
    unavailable: int = 0  # answer this many requests with 503 first
    requests: list[tuple[str, str | None]] = field(default_factory=list)  # (name, Range header)


class Handler(BaseHTTPRequestHandler):
    behaviour: Behaviour

    def log_message(self, format: str, *args: object) -> None:  # keep test output quiet
        pass

    def do_GET(self) -> None:
        state = self.server.behaviour  # type: ignore[attr-defined]
        name = self.path.lstrip("/")
        state.requests.append((name, self.headers.get("Range")))
        if state.unavailable:
            state.unavailable -= 1
            self.send_error(503)
            return
        if name in state.html:
            page = b"<!DOCTYPE html><html><body>Google Drive - Quota exceeded</body></html>"
            self.send_response(200)
            self.send_header("Content-Type", "text/html; charset=utf-8")
            self.send_header("Content-Length", str(len(page)))
            self.end_headers()
            self.wfile.write(page)
            return
        if name not in state.files:
            self.send_error(404)
            return
        data = state.files[name]
        start = 0
        match = re.fullmatch(r"bytes=(\d+)-", self.headers.get("Range") or "")
        if match and not state.ignore_range:
            start = int(match.group(1))
            if start >= len(data):
                self.send_response(416)
                self.send_header("Content-Range", f"bytes */{len(data)}")
                self.send_header("Content-Length", "0")
                self.end_headers()
                return
            self.send_response(206)
            self.send_header("Content-Range", f"bytes {start}-{len(data) - 1}/{len(data)}")
        else:
            self.send_response(200)
        body = data[start:]
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if name in state.cut_after and state.cuts_left:
            state.cuts_left -= 1
            self.wfile.write(body[: state.cut_after[name]])
            self.wfile.flush()
            self.close_connection = True  # hang up mid-body: the client sees a short transfer
            return
        self.wfile.write(body)


@pytest.fixture
def server() -> Iterator[tuple[str, Behaviour]]:
    behaviour = Behaviour()
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    httpd.daemon_threads = True
    httpd.behaviour = behaviour  # type: ignore[attr-defined]
    thread = threading.Thread(target=httpd.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{httpd.server_address[1]}", behaviour
    finally:
        httpd.shutdown()
        httpd.server_close()


@pytest.fixture(autouse=True)
def fast_retries(monkeypatch: pytest.MonkeyPatch) -> list[float]:
    """No real waiting; the waits are recorded instead."""
    waits: list[float] = []
    monkeypatch.setattr(download.time, "sleep", waits.append)
    return waits


def payload(name: str, size: int) -> bytes:
    """Deterministic JSON-looking bytes of a given size."""
    seed = hashlib.sha256(name.encode()).hexdigest().encode()
    body = (seed * (size // len(seed) + 1))[: size - 2]
    return b"[" + body + b"]"


@pytest.fixture
def small_files(server: tuple[str, Behaviour], monkeypatch: pytest.MonkeyPatch) -> dict[str, bytes]:
    """Serve the small set with test-sized contents and point the manifest at those sizes."""
    _, behaviour = server
    files = {name: payload(name, size) for name, size in zip(SMALL, (300_000, 20_000, 50_000), strict=True)}
    behaviour.files.update(files)
    for name, data in files.items():
        drive_id = download.MANIFEST[name][0]
        monkeypatch.setitem(download.MANIFEST, name, (drive_id, len(data), None))
    return files


def test_full_download_writes_files_and_checksums(
    tmp_path: Path, server: tuple[str, Behaviour], small_files: dict[str, bytes]
) -> None:
    base_url, behaviour = server
    paths = download_catalog(tmp_path, base_url=base_url, progress=False)
    assert [p.name for p in paths] == list(SMALL)
    for path in paths:
        assert path.read_bytes() == small_files[path.name]
        digest = hashlib.sha256(small_files[path.name]).hexdigest()
        assert (tmp_path / f"{path.name}.sha256").read_text() == f"{digest}  {path.name}\n"
    assert not list(tmp_path.glob("*.part"))
    assert [name for name, _ in behaviour.requests] == list(SMALL)
    assert all(header is None for _, header in behaviour.requests)


def test_full_set_names(
    tmp_path: Path, server: tuple[str, Behaviour], monkeypatch: pytest.MonkeyPatch
) -> None:
    base_url, behaviour = server
    for name in download.FULL_FILES:
        behaviour.files[name] = payload(name, 1000)
        monkeypatch.setitem(download.MANIFEST, name, (download.MANIFEST[name][0], 1000, None))
    paths = download_catalog(tmp_path, full=True, base_url=base_url + "/", progress=False)
    assert [p.name for p in paths] == ["items_shuffle.json", "items_ins_v2.json", "items_human_ins.json"]


def test_interrupted_transfer_is_resumed_from_the_part_file(
    tmp_path: Path, server: tuple[str, Behaviour], small_files: dict[str, bytes], fast_retries: list[float]
) -> None:
    base_url, behaviour = server
    name = SMALL[0]
    data = small_files[name]
    half = len(data) // 2
    behaviour.cut_after[name] = half
    behaviour.cuts_left = 1
    paths = download_catalog(tmp_path, base_url=base_url, progress=False)
    assert paths[0].read_bytes() == data
    ranges = [header for n, header in behaviour.requests if n == name]
    assert ranges == [None, f"bytes={half}-"]
    assert fast_retries  # waited (backoff) before resuming


def test_part_file_left_by_an_earlier_run_is_continued(
    tmp_path: Path, server: tuple[str, Behaviour], small_files: dict[str, bytes]
) -> None:
    base_url, behaviour = server
    name = SMALL[0]
    data = small_files[name]
    (tmp_path / f"{name}.part").write_bytes(data[:12_345])
    download_catalog(tmp_path, base_url=base_url, progress=False)
    assert (tmp_path / name).read_bytes() == data
    assert (name, "bytes=12345-") in behaviour.requests
    assert not (tmp_path / f"{name}.part").exists()


def test_run_that_gives_up_keeps_the_part_for_the_next_run(
    tmp_path: Path,
    server: tuple[str, Behaviour],
    small_files: dict[str, bytes],
    monkeypatch: pytest.MonkeyPatch,
    fast_retries: list[float],
) -> None:
    base_url, behaviour = server
    name = SMALL[0]
    data = small_files[name]
    behaviour.cut_after[name] = 100_000
    behaviour.cuts_left = 1
    behaviour.unavailable = 0
    monkeypatch.setattr(download, "RETRIES", 2)
    # first run: the transfer is cut, then the server is down for good
    original = Handler.do_GET

    def cut_then_down(self: Handler) -> None:
        state = self.server.behaviour  # type: ignore[attr-defined]
        if state.requests and state.cuts_left == 0:
            state.requests.append((self.path.lstrip("/"), self.headers.get("Range")))
            self.send_error(503)
            return
        original(self)

    monkeypatch.setattr(Handler, "do_GET", cut_then_down)
    with pytest.raises(DownloadError, match="run again to resume"):
        download_catalog(tmp_path, base_url=base_url, progress=False)
    part = tmp_path / f"{name}.part"
    assert part.read_bytes() == data[:100_000]
    # after the cut (progress made) and after the first 503; the second 503 in a row ends the run
    assert fast_retries == [download.BACKOFF_SECONDS, download.BACKOFF_SECONDS]
    # second run: the server is back and continues where the part ends
    monkeypatch.setattr(Handler, "do_GET", original)
    behaviour.requests.clear()
    download_catalog(tmp_path, base_url=base_url, progress=False)
    assert (tmp_path / name).read_bytes() == data
    assert behaviour.requests[0] == (name, "bytes=100000-")


def test_server_that_ignores_range_restarts_from_zero(
    tmp_path: Path, server: tuple[str, Behaviour], small_files: dict[str, bytes]
) -> None:
    base_url, behaviour = server
    name = SMALL[0]
    behaviour.ignore_range = True
    (tmp_path / f"{name}.part").write_bytes(b"garbage that must not be kept")
    download_catalog(tmp_path, base_url=base_url, progress=False)
    assert (tmp_path / name).read_bytes() == small_files[name]


def test_server_errors_are_retried(
    tmp_path: Path, server: tuple[str, Behaviour], small_files: dict[str, bytes], fast_retries: list[float]
) -> None:
    base_url, behaviour = server
    behaviour.unavailable = 2
    download_catalog(tmp_path, base_url=base_url, progress=False)
    assert fast_retries == [download.BACKOFF_SECONDS, download.BACKOFF_SECONDS * 2]
    assert all((tmp_path / name).exists() for name in SMALL)


def test_connection_refused_gives_up_with_backoff(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    probe = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    port = probe.server_address[1]
    probe.server_close()  # nothing listens there now
    waits: list[float] = []
    monkeypatch.setattr(download.time, "sleep", waits.append)
    monkeypatch.setattr(download, "RETRIES", 3)
    with pytest.raises(DownloadError, match="failed 3 times in a row"):
        download_file(
            f"http://127.0.0.1:{port}/x.json", tmp_path / "x.json", expected_size=10, progress=False
        )
    assert waits == [download.BACKOFF_SECONDS, download.BACKOFF_SECONDS * 2]


def test_size_mismatch_is_an_error(
    tmp_path: Path,
    server: tuple[str, Behaviour],
    small_files: dict[str, bytes],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    base_url, _ = server
    name = SMALL[0]
    drive_id, size, _ = download.MANIFEST[name]
    monkeypatch.setitem(download.MANIFEST, name, (drive_id, size + 10, None))
    with pytest.raises(DownloadError, match=rf"{name}: the server offers {size:,} bytes but {size + 10:,}"):
        download_catalog(tmp_path, base_url=base_url, progress=False)
    assert not (tmp_path / name).exists()


def test_sha256_mismatch_is_an_error(
    tmp_path: Path,
    server: tuple[str, Behaviour],
    small_files: dict[str, bytes],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    base_url, _ = server
    name = SMALL[0]
    drive_id, size, _ = download.MANIFEST[name]
    monkeypatch.setitem(download.MANIFEST, name, (drive_id, size, "0" * 64))
    with pytest.raises(DownloadError, match="does not match the expected"):
        download_catalog(tmp_path, base_url=base_url, progress=False)
    assert not (tmp_path / name).exists()
    assert not (tmp_path / f"{name}.part").exists()


def test_html_page_is_reported_with_the_manual_link(
    tmp_path: Path, server: tuple[str, Behaviour], small_files: dict[str, bytes]
) -> None:
    base_url, behaviour = server
    name = SMALL[0]
    behaviour.html.add(name)
    drive_id = download.MANIFEST[name][0]
    with pytest.raises(DownloadError) as raised:
        download_catalog(tmp_path, base_url=base_url, progress=False)
    message = str(raised.value)
    assert "Google Drive refused the download" in message
    assert "quota or permission" in message
    assert f"https://drive.google.com/uc?id={drive_id}" in message
    assert str(tmp_path) in message
    assert not (tmp_path / name).exists()
    assert not (tmp_path / f"{name}.part").exists()


def test_html_body_without_html_type_is_refused(tmp_path: Path, server: tuple[str, Behaviour]) -> None:
    base_url, behaviour = server
    behaviour.files["page.json"] = b"  <html>sign in</html>"
    with pytest.raises(DownloadError, match="HTML page instead of JSON"):
        download_file(f"{base_url}/page.json", tmp_path / "page.json", progress=False)
    assert not (tmp_path / "page.json").exists()


def test_complete_files_are_skipped(
    tmp_path: Path, server: tuple[str, Behaviour], small_files: dict[str, bytes]
) -> None:
    base_url, behaviour = server
    first = download_catalog(tmp_path, base_url=base_url, progress=False)
    behaviour.requests.clear()
    second = download_catalog(tmp_path, base_url=base_url, progress=False)
    assert second == first
    assert behaviour.requests == []


def test_file_placed_by_hand_gets_a_checksum_and_is_skipped(
    tmp_path: Path, server: tuple[str, Behaviour], small_files: dict[str, bytes]
) -> None:
    base_url, behaviour = server
    name = SMALL[2]
    (tmp_path / name).write_bytes(small_files[name])
    download_catalog(tmp_path, base_url=base_url, progress=False)
    assert name not in [n for n, _ in behaviour.requests]
    digest = hashlib.sha256(small_files[name]).hexdigest()
    assert (tmp_path / f"{name}.sha256").read_text().split()[0] == digest


def test_existing_file_that_is_incomplete_or_corrupted_is_an_error(
    tmp_path: Path, server: tuple[str, Behaviour], small_files: dict[str, bytes]
) -> None:
    base_url, _ = server
    download_catalog(tmp_path, base_url=base_url, progress=False)
    target = tmp_path / SMALL[1]
    data = bytearray(target.read_bytes())
    data[5] ^= 0xFF
    target.write_bytes(bytes(data))  # same size, other bytes
    with pytest.raises(DownloadError, match="corrupted"):
        download_catalog(tmp_path, base_url=base_url, progress=False)
    target.write_bytes(bytes(data[:-1]))
    with pytest.raises(DownloadError, match="delete it and run again"):
        download_catalog(tmp_path, base_url=base_url, progress=False)


def test_drive_url_form(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    seen: list[str] = []

    def fake_download_file(url: str, dest: Path, **_: object) -> Path:
        seen.append(url)
        return dest

    monkeypatch.setattr(download, "download_file", fake_download_file)
    download_catalog(tmp_path, progress=False)
    assert seen[0] == (
        "https://drive.usercontent.google.com/download?id=1EgHdxQ_YxqIQlvvq5iKlCrkEKR6-j0Ib"
        "&export=download&confirm=t"
    )
    assert len(seen) == 3
