"""What an archive declares does not decide what importing it costs.

``coralrt cache import`` on a small machine (a Raspberry Pi has 1 to 8 GB)
must not decompress a declared entry into memory: a gzip of zeros declaring
hundreds of MiB is a few hundred KiB on disk.  Each import here runs in a
fresh interpreter whose peak RSS is measured (``VmHWM``, or ``ru_maxrss``
where there is no /proc); the bombs are
built here, streamed (one gzip member of 1 MiB of zeros, repeated), so the
tests themselves stay cheap.  Also: the per-entry bound and its flag, and
what may follow the end of a tar, the same with or without gzip.
"""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import subprocess
import sys
import tarfile
import textwrap
from pathlib import Path

import pytest
from conftest import shared_model

from coralrt import InferenceSession
from coralrt._cli.main import main
from coralrt._compile import cache_archive
from coralrt._compile.cache import CACHE_FORMAT_VERSION, CompileCache, make_key
from coralrt._compile.cache_archive import (ARCHIVE_NAME, ARCHIVE_VERSION, MANIFEST_MAX,
                                           RECORD_MAX, export_cache)
from coralrt._compile.cache_format import canonical_json
from coralrt._compile.cache_import import import_cache
from coralrt.errors import CacheArchiveError

resource = pytest.importorskip("resource")   # ru_maxrss: not on Windows

MiB = 1 << 20
RSS_LIMIT_MIB = 256
KEY, SOURCE = "ab" * 32, "cd" * 32
ZEROS_MIB = gzip.compress(bytes(MiB), compresslevel=9)   # one gzip member, about 1 KiB


def header(name: str, size: int) -> bytes:
    info = tarfile.TarInfo(name)
    info.size, info.mode = size, 0o644
    return info.tobuf(tarfile.USTAR_FORMAT)


def member(name: str, data: bytes) -> bytes:
    return header(name, len(data)) + data + bytes(-len(data) % 512)


def manifest_of(entries: list[dict]) -> bytes:
    return json.dumps({"archive": ARCHIVE_NAME, "archive_version": ARCHIVE_VERSION,
                       "coralrt_version": "0.0.test", "cache_format": CACHE_FORMAT_VERSION,
                       "created": "2024-05-01T12:00:00Z", "host": "builder",
                       "machine": "x86_64", "entries": entries}).encode()


def zero_bomb(path: Path, declared: int) -> Path:
    """A .tar.gz whose one entry declares ``declared`` bytes (a multiple of 1 MiB)
    of zeros, with a well-formed manifest and record and a wrong data digest."""
    record = canonical_json({"key": KEY, "source": SOURCE, "size": declared, "crc32": 0,
                             "created": 0.0, "format": CACHE_FORMAT_VERSION})
    entry = {"key": KEY, "source": SOURCE, "size": declared, "sha256": "0" * 64,
             "record_size": len(record), "record_sha256": hashlib.sha256(record).hexdigest(),
             "created": 0.0, "description": {}}
    head = (member("manifest.json", manifest_of([entry])) + member(f"entries/{KEY}.json", record)
            + header(f"entries/{KEY}.bin", declared))
    with open(path, "wb") as f:
        f.write(gzip.compress(head))
        for _ in range(declared // MiB):
            f.write(ZEROS_MIB)
        f.write(gzip.compress(bytes(1024)))      # the end-of-archive blocks
    return path


def json_bomb(size: int) -> bytes:
    """``size`` bytes of the JSON that takes the most memory per byte parsed
    (about 36 times its size: a list and an empty object per 5 bytes)."""
    head, tail = b'{"archive":"' + ARCHIVE_NAME.encode() + b'","entries":[', b'0]}'
    unit = b"[{}],"
    return head + unit * ((size - len(head) - len(tail)) // len(unit)) + tail


def manifest_bomb(path: Path) -> Path:
    text = json_bomb(MANIFEST_MAX)
    path.write_bytes(gzip.compress(member("manifest.json", text) + bytes(1024)))
    return path


def record_bomb(path: Path) -> Path:
    record = json_bomb(RECORD_MAX)
    entry = {"key": KEY, "source": SOURCE, "size": 4, "sha256": hashlib.sha256(b"data").hexdigest(),
             "record_size": len(record), "record_sha256": hashlib.sha256(record).hexdigest(),
             "created": 0.0, "description": {}}
    path.write_bytes(gzip.compress(
        member("manifest.json", manifest_of([entry])) + member(f"entries/{KEY}.json", record)
        + member(f"entries/{KEY}.bin", b"data") + bytes(1024)))
    return path


def genuine(path: Path, tmp: Path) -> Path:
    """A real archive: the compiled models of three real models."""
    cache = CompileCache(tmp / "built", max_bytes=1 << 30)
    for name in ("mobilenet_v2_1.0_224_quant.tflite", "mobilenet_v1_0.25_128_quant.tflite",
                 "deeplabv3_mnv2_dm05_pascal_quant.tflite"):
        InferenceSession(shared_model(name), target="sim", cache=cache)
    export_cache(cache, path)
    return path


CHILD = textwrap.dedent("""
    import json, resource, sys, time
    from coralrt._compile.cache import CompileCache
    from coralrt._compile.cache_import import import_cache
    from coralrt.errors import CacheArchiveError
    cache = CompileCache(sys.argv[1], max_bytes=1 << 30)
    start = time.perf_counter()
    try:
        report = import_cache(cache, sys.argv[2])
        out = {"imported": report["imported"], "failed": report["failed"],
               "reasons": [e.get("reason") for e in report["entries"]]}
    except CacheArchiveError as e:
        out = {"refused": str(e)}
    out["seconds"] = time.perf_counter() - start
    try:   # this process's own peak: ru_maxrss on Linux keeps the parent's across exec
        with open("/proc/self/status") as f:
            peak = next(int(line.split()[1]) for line in f if line.startswith("VmHWM:"))
        out["peak_mib"] = peak / 1024
    except OSError:
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        out["peak_mib"] = peak / (1 << 20 if sys.platform == "darwin" else 1 << 10)
    print(json.dumps(out))
""")


def import_in_child(archive: Path, cache_dir: Path, deadline: float = 120.0) -> dict:
    try:
        proc = subprocess.run([sys.executable, "-c", CHILD, str(cache_dir), str(archive)],
                              capture_output=True, text=True, timeout=deadline)
    except subprocess.TimeoutExpired:
        pytest.fail(f"importing {archive.name} took more than {deadline:.0f} s")
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.splitlines()[-1])


@pytest.mark.parametrize("case", ["declares 900 MiB", "declares 250 MiB", "manifest JSON",
                                  "record JSON", "genuine"])
def test_importing_an_archive_peaks_below_256_mib_whatever_it_declares(tmp_path, case):
    archive = tmp_path / "archive.tar.gz"
    if case == "declares 900 MiB":     # more than the default per-entry bound
        out = import_in_child(zero_bomb(archive, 900 * MiB), tmp_path / "cache")
        assert "refused" in out and "--max-entry-bytes" in out["refused"], out
        assert out["seconds"] < 10, out       # refused from the manifest: no data is read
    elif case == "declares 250 MiB":   # within the bound: read (streamed) and refused
        out = import_in_child(zero_bomb(archive, 250 * MiB), tmp_path / "cache")
        assert out.get("failed") == 1 and "SHA-256" in out["reasons"][0], out
        assert out["seconds"] < 60, out
    elif case == "manifest JSON":
        out = import_in_child(manifest_bomb(archive), tmp_path / "cache")
        assert "refused" in out, out
    elif case == "record JSON":
        out = import_in_child(record_bomb(archive), tmp_path / "cache")
        assert out.get("failed") == 1, out
    else:
        out = import_in_child(genuine(archive, tmp_path), tmp_path / "cache")
        assert out.get("imported") == 3 and out["failed"] == 0, out
    assert out["peak_mib"] < RSS_LIMIT_MIB, out
    if case != "genuine":
        assert not list((tmp_path / "cache").rglob("*.bin"))


# -- the per-entry bound and the total --------------------------------------------------

@pytest.fixture
def small_archive(tmp_path) -> Path:
    """Three entries of 600 bytes of made-up data, exported by coralrt."""
    cache = CompileCache(tmp_path / "source", max_bytes=1 << 20)
    for n in range(3):
        data = bytes([n]) * 600
        cache.put(make_key(data, options={}, compiler_id="c", compiler_version="1"), data,
                  {"compiler": "c 1"}, source=hashlib.sha256(data).hexdigest())
    path = tmp_path / "small.tar"
    export_cache(cache, path)
    return path


def test_an_entry_over_the_bound_refuses_the_archive_before_its_data(small_archive, tmp_path,
                                                                     monkeypatch, capsys):
    target = CompileCache(tmp_path / "target", max_bytes=1 << 20)
    with pytest.raises(CacheArchiveError, match=r"declares 600 bytes of data, more than the "
                                                r"599 bytes an imported entry may have"):
        import_cache(target, small_archive, max_entry_bytes=599)
    assert list(target.entries()) == []
    assert import_cache(target, small_archive, max_entry_bytes=600)["imported"] == 3
    monkeypatch.setenv("CORALRT_CACHE_DIR", str(tmp_path / "cli"))
    assert main(["cache", "import", "--max-entry-bytes", "512", str(small_archive)]) == 1
    err = capsys.readouterr().err
    assert "--max-entry-bytes SIZE" in err and "entry " in err
    assert main(["cache", "import", "--max-entry-bytes", "1K", str(small_archive)]) == 0
    assert main(["cache", "import", "--max-entry-bytes", "lots", str(small_archive)]) == 2
    assert "is not a size" in capsys.readouterr().err


def test_more_data_in_all_than_the_cache_could_keep_is_refused(small_archive, tmp_path):
    target = CompileCache(tmp_path / "target", max_bytes=1000)
    with pytest.raises(CacheArchiveError, match="declare .* bytes in all, more than the 1,000"):
        import_cache(target, small_archive, max_entry_bytes=1000)
    assert list(target.entries()) == []


def test_export_refuses_what_import_would_refuse(small_archive, tmp_path, monkeypatch):
    cache = CompileCache(tmp_path / "source", max_bytes=1 << 20)
    monkeypatch.setattr(cache_archive, "MANIFEST_MAX", 1000)
    with pytest.raises(CacheArchiveError, match="export fewer models per archive"):
        export_cache(cache, tmp_path / "too-many.tar")
    assert not (tmp_path / "too-many.tar").exists()


# -- what may follow the end of the archive -----------------------------------------------

def archive_bytes(small_archive: Path, after_end: bytes) -> bytes:
    """The tar of ``small_archive`` cut right after its end-of-archive blocks,
    then ``after_end``."""
    raw = small_archive.read_bytes()
    with tarfile.open(fileobj=io.BytesIO(raw)) as tar:
        last = tar.getmembers()[-1]
    end = last.offset_data + last.size + (-last.size % 512) + 1024
    assert raw[end - 1024:].count(0) == len(raw) - end + 1024
    return raw[:end] + after_end


@pytest.mark.parametrize("compress", [False, True], ids=["tar", "tar.gz"])
@pytest.mark.parametrize("after_end", [b"junk", b"\0" * 511 + b"x", b"\0" * (1024 * 1024 + 1)],
                         ids=["text", "a byte after zeros", "more than 1 MiB of zeros"])
def test_data_after_the_end_is_refused_with_or_without_gzip(small_archive, tmp_path, capsys,
                                                            compress, after_end):
    data = archive_bytes(small_archive, after_end)
    path = tmp_path / ("a.tar.gz" if compress else "a.tar")
    path.write_bytes(gzip.compress(data) if compress else data)
    target = tmp_path / "target"
    with pytest.raises(CacheArchiveError, match="unexpected data after the end of the archive"):
        import_cache(CompileCache(target), path)
    assert not list(target.rglob("*.bin"))


@pytest.mark.parametrize("compress", [False, True], ids=["tar", "tar.gz"])
@pytest.mark.parametrize("after_end", [b"", b"\0" * 9216, b"\0" * (1024 * 1024 - 1024)],
                         ids=["nothing", "a 10 KiB record", "a 1 MiB record"])
def test_zero_padding_after_the_end_is_accepted_with_or_without_gzip(small_archive, tmp_path,
                                                                     compress, after_end):
    data = archive_bytes(small_archive, after_end)
    path = tmp_path / ("a.tar.gz" if compress else "a.tar")
    path.write_bytes(gzip.compress(data) if compress else data)
    assert import_cache(CompileCache(tmp_path / "target"), path)["imported"] == 3


def test_an_archive_without_end_blocks_is_complete(small_archive, tmp_path):
    data = archive_bytes(small_archive, b"")[:-1024]
    path = tmp_path / "a.tar"
    path.write_bytes(data)
    assert import_cache(CompileCache(tmp_path / "target"), path)["imported"] == 3
