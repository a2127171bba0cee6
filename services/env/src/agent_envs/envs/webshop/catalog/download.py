"""Download the original WebShop raw files from Google Drive (for users with internet access).

Small set (default): ``items_shuffle_1000.json`` and ``items_ins_v2_1000.json`` (the original's
1k-product files); full set (``full=True``): ``items_shuffle.json`` (5.5 GB) and ``items_ins_v2.json``; both
sets also get ``items_human_ins.json``.

Downloads are resumable: bytes go to ``<name>.part`` and a later run continues it with an HTTP ``Range``
request (if the server answers ``200`` instead of ``206`` it starts over). A finished file must have the size
the manifest records (and its SHA-256, where the manifest knows it); it is then renamed into place and its
SHA-256 is written next to it as ``<name>.sha256`` (``sha256sum`` format), which later runs check before they
skip the file. Connection errors are retried with exponential backoff. Google Drive answers an HTML page
(quota exceeded, virus-scan interstitial, permission) instead of the file now and then: that is reported
with the manual download link rather than saved as JSON.
"""

from __future__ import annotations

import hashlib
import os
import re
import time
from pathlib import Path

import httpx
from tqdm import tqdm

# name -> (Google Drive id, size in bytes, SHA-256 or None when not known)
MANIFEST: dict[str, tuple[str, int, str | None]] = {
    "items_shuffle_1000.json": ("1EgHdxQ_YxqIQlvvq5iKlCrkEKR6-j0Ib", 4_467_013, None),
    "items_ins_v2_1000.json": ("1IduG0xl544V_A_jv3tHXC0kyFi7PnyBu", 147_099, None),
    "items_shuffle.json": ("1A2whVgOO0euk5O13n2iYDM0bQRkkRduB", 5_479_720_229, None),
    "items_ins_v2.json": ("1s2j6NgHljiZzQNL3veZaAiyW_qDEgBNi", 186_295_270, None),
    "items_human_ins.json": ("14Kb5SPBk_jfdLZ_CDBNitW98QLDlKR5O", 5_137_548, None),
}
SMALL_FILES = ("items_shuffle_1000.json", "items_ins_v2_1000.json", "items_human_ins.json")
FULL_FILES = ("items_shuffle.json", "items_ins_v2.json", "items_human_ins.json")

DRIVE_DOWNLOAD_URL = "https://drive.usercontent.google.com/download?id={id}&export=download&confirm=t"
DRIVE_MANUAL_URL = "https://drive.google.com/uc?id={id}"

RETRIES = 6  # attempts in a row that bring no new bytes before giving up
BACKOFF_SECONDS = 2.0  # first wait; doubles per failed attempt, capped at BACKOFF_MAX_SECONDS
BACKOFF_MAX_SECONDS = 60.0
CHUNK_SIZE = 1 << 20
TIMEOUT = httpx.Timeout(120.0, connect=30.0)

_CONTENT_RANGE = re.compile(r"bytes\s+(\d+)-(\d+)/(\d+|\*)")


class DownloadError(RuntimeError):
    """A download failed in a way retrying will not fix; the message says what to do."""


class _Retry(Exception):
    """An attempt that may succeed if repeated (connection cut, server error, short transfer)."""


def download_catalog(
    out_dir: Path, full: bool = False, base_url: str | None = None, progress: bool = True
) -> list[Path]:
    """Fetch the original raw files into ``out_dir``; files already complete are skipped.

    ``base_url`` replaces Google Drive (tests, mirrors): the file ``name`` is then fetched from
    ``f"{base_url}/{name}"``. Returns the paths of the files, in manifest order.
    """
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = []
    with httpx.Client(
        follow_redirects=True,
        timeout=TIMEOUT,
        headers={"User-Agent": "webshop-env-downloader", "Accept-Encoding": "identity"},
    ) as client:
        for name in FULL_FILES if full else SMALL_FILES:
            drive_id, size, sha256 = MANIFEST[name]
            if base_url is None:
                url = DRIVE_DOWNLOAD_URL.format(id=drive_id)
            else:
                url = f"{base_url.rstrip('/')}/{name}"
            paths.append(
                download_file(
                    url,
                    out_dir / name,
                    expected_size=size,
                    sha256=sha256,
                    manual_url=DRIVE_MANUAL_URL.format(id=drive_id),
                    progress=progress,
                    client=client,
                )
            )
    return paths


def download_file(
    url: str,
    dest: Path,
    expected_size: int | None = None,
    sha256: str | None = None,
    manual_url: str | None = None,
    progress: bool = True,
    client: httpx.Client | None = None,
) -> Path:
    """Download ``url`` to ``dest`` resumably and verify it; skip it when ``dest`` is already complete.

    ``expected_size`` and ``sha256`` (either may be None) are checked before the file is renamed into place;
    ``manual_url`` is where the error messages send the user when the server refuses.
    """
    dest = Path(dest)
    if dest.exists():
        _check_existing(dest, expected_size, sha256)
        return dest
    dest.parent.mkdir(parents=True, exist_ok=True)
    part = dest.with_name(dest.name + ".part")
    own_client = client is None
    if client is None:
        client = httpx.Client(follow_redirects=True, timeout=TIMEOUT, headers={"Accept-Encoding": "identity"})
    try:
        failures = 0
        while True:
            before = part.stat().st_size if part.exists() else 0
            try:
                _attempt(client, url, dest, part, expected_size, manual_url, progress)
                break
            except _Retry as reason:
                after = part.stat().st_size if part.exists() else 0
                failures = 0 if after > before else failures + 1
                if failures >= RETRIES:
                    raise DownloadError(
                        f"downloading {dest.name} from {url} failed {RETRIES} times in a row ({reason}); "
                        f"{after:,} bytes are kept in {part}: run again to resume"
                    ) from None
                time.sleep(min(BACKOFF_MAX_SECONDS, BACKOFF_SECONDS * 2 ** max(0, failures - 1)))
    finally:
        if own_client:
            client.close()
    digest = _sha256_of(part)
    if sha256 is not None and digest != sha256.lower():
        part.unlink()
        raise DownloadError(
            f"{dest.name}: SHA-256 {digest} does not match the expected {sha256}; "
            "the partial file was removed, run again to download it anew"
        )
    os.replace(part, dest)
    _sidecar(dest).write_text(f"{digest}  {dest.name}\n", encoding="utf-8")
    return dest


def _attempt(
    client: httpx.Client,
    url: str,
    dest: Path,
    part: Path,
    expected_size: int | None,
    manual_url: str | None,
    progress: bool,
) -> None:
    """One request: continue ``part`` from its current size (or restart it) until the server stops sending."""
    offset = part.stat().st_size if part.exists() else 0
    if expected_size is not None and offset > expected_size:
        part.unlink()  # longer than the file can be: not ours to continue
        offset = 0
    if expected_size is not None and offset == expected_size:
        return
    headers = {"Range": f"bytes={offset}-"} if offset else {}
    try:
        with client.stream("GET", url, headers=headers) as response:
            status = response.status_code
            if status == 416 and offset:  # range not satisfiable: the part is not a prefix we can continue
                part.unlink()
                raise _Retry("server rejected the resume range; starting over")
            if status == 429 or status >= 500:
                raise _Retry(f"HTTP {status}")
            if status >= 400:
                raise DownloadError(_refusal(dest, url, manual_url, f"HTTP {status}"))
            content_type = response.headers.get("content-type", "")
            if "text/html" in content_type.lower():
                raise DownloadError(_refusal(dest, url, manual_url, "the server sent an HTML page, not JSON"))
            if status == 206:
                start, total = _content_range(response.headers.get("content-range", ""))
                if start != offset:
                    part.unlink()
                    raise _Retry(f"server resumed at byte {start}, not {offset}; starting over")
            else:  # 200: the whole file from byte 0
                offset, total = 0, _int_or_none(response.headers.get("content-length"))
            if expected_size is not None and total is not None and total != expected_size:
                raise DownloadError(
                    f"{dest.name}: the server offers {total:,} bytes but {expected_size:,} are expected "
                    f"(from {url}); the file has changed or the link is wrong"
                )
            _receive(response, part, offset, expected_size if expected_size is not None else total, progress)
    except httpx.TransportError as error:
        raise _Retry(f"{type(error).__name__}: {error}") from None
    received = part.stat().st_size if part.exists() else 0
    if expected_size is not None:
        if received < expected_size:
            raise _Retry(f"transfer ended at {received:,} of {expected_size:,} bytes")
        if received > expected_size:
            part.unlink()
            raise DownloadError(
                f"{dest.name}: received {received:,} bytes but {expected_size:,} are expected (from {url}); "
                "the file has changed or the link is wrong"
            )


def _receive(response: httpx.Response, part: Path, offset: int, total: int | None, progress: bool) -> None:
    """Write the body to ``part`` (appending from ``offset``, or truncating when 0)."""
    first = offset == 0
    with (
        open(part, "ab" if offset else "wb") as handle,
        tqdm(
            total=total,
            initial=offset,
            unit="B",
            unit_scale=True,
            unit_divisor=1024,
            desc=part.name.removesuffix(".part"),
            disable=not progress,
        ) as bar,
    ):
        for chunk in response.iter_bytes():  # as received: a chunk buffer would be lost when the line drops
            if first and chunk.strip():
                first = False
                if chunk.lstrip()[:1] == b"<":  # an HTML page served without a text/html type
                    handle.close()
                    part.unlink()
                    raise DownloadError(
                        f"{part.name.removesuffix('.part')}: the server sent an HTML page instead of JSON"
                    )
            handle.write(chunk)
            bar.update(len(chunk))


def _refusal(dest: Path, url: str, manual_url: str | None, what: str) -> str:
    if manual_url is not None:
        return (
            f"Google Drive refused the download of {dest.name} (quota or permission; {what}); "
            f"download it manually from {manual_url} into {dest.parent}"
        )
    return f"{url} refused the download of {dest.name} ({what})"


def _check_existing(dest: Path, expected_size: int | None, sha256: str | None) -> None:
    """A file already in place must be complete: right size, and the checksum recorded next to it."""
    size = dest.stat().st_size
    if expected_size is not None and size != expected_size:
        raise DownloadError(
            f"{dest} exists but has {size:,} bytes, not the expected {expected_size:,} "
            "(an interrupted manual download?); delete it and run again"
        )
    sidecar = _sidecar(dest)
    recorded = sidecar.read_text(encoding="utf-8").split()[0].lower() if sidecar.exists() else None
    if recorded is None and sha256 is None:
        # placed by hand: record its checksum now so later runs can tell if it changes
        sidecar.write_text(f"{_sha256_of(dest)}  {dest.name}\n", encoding="utf-8")
        return
    digest = _sha256_of(dest)
    for wanted, source in ((sha256, "the manifest"), (recorded, str(sidecar))):
        if wanted is not None and digest != wanted.lower():
            raise DownloadError(
                f"{dest}: SHA-256 {digest} does not match {source} ({wanted}); the file is corrupted: "
                "delete it and run again"
            )
    if recorded is None:
        sidecar.write_text(f"{digest}  {dest.name}\n", encoding="utf-8")


def _sidecar(dest: Path) -> Path:
    return dest.with_name(dest.name + ".sha256")


def _sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        while chunk := handle.read(CHUNK_SIZE * 8):
            digest.update(chunk)
    return digest.hexdigest()


def _content_range(value: str) -> tuple[int, int | None]:
    match = _CONTENT_RANGE.match(value.strip())
    if match is None:
        raise _Retry(f"206 response without a usable Content-Range ({value!r})")
    total = match.group(3)
    return int(match.group(1)), None if total == "*" else int(total)


def _int_or_none(value: str | None) -> int | None:
    try:
        return int(value) if value is not None else None
    except ValueError:
        return None
