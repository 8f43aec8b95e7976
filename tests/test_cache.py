"""The on-disk compile cache: keys, atomic writes, locking, corruption, binding of an entry
to its key and source, permissions, the digest index, LRU, config, CLI.

Everything runs against real files in ``tmp_path``; the concurrency tests use
real processes.
"""

from __future__ import annotations

import contextlib
import ctypes
import hashlib
import json
import logging
import os
import pickle
import subprocess
import sys
import textwrap
import time
import zlib
from pathlib import Path

import platformdirs
import pytest
from conftest import shared_model
from filelock import FileLock

from coralrt import _config as config
from coralrt._cli.main import main
from coralrt._compile.cache import CACHE_FORMAT_VERSION, CompileCache, Entry, make_key
from coralrt._compile.digest import _stamp, model_digest
from coralrt.errors import CacheLockTimeoutError, ConfigError, CoralRTError

MODEL = b"TFL3" + bytes(range(256)) * 8
OPTIONS = {"mode": "edgetpu_compiler", "max_segments": 1, "rewrites": ["gelu_tanh"]}
PARTS = {"options": OPTIONS, "compiler_id": "native", "compiler_version": "0.1.0"}
SRC = hashlib.sha256(MODEL).hexdigest()  # the source digest an entry is bound to


def key_of(model: bytes = MODEL, **changes) -> str:
    return make_key(model, **{**PARTS, **changes})


def entry_crc(key: str, source: str, data: bytes) -> int:
    """The documented entry checksum: CRC-32 of the data, then the key and the source digest."""
    return zlib.crc32(f"{key}{source}".encode("ascii"), zlib.crc32(data))


def files_of(root: Path, key: str) -> tuple[Path, Path, Path]:
    d = root / f"v{CACHE_FORMAT_VERSION}" / key[:2]
    return d / f"{key}.bin", d / f"{key}.json", d / f"{key}.lock"


def run_python(code: str, *args, env=None) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", textwrap.dedent(code), *map(str, args)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=env)


# -- keys ----------------------------------------------------------------------

def test_key_is_the_documented_hash():
    k = key_of()
    assert len(k) == 64 and all(c in "0123456789abcdef" for c in k)
    canonical = json.dumps({**PARTS, "format": CACHE_FORMAT_VERSION}, sort_keys=True,
                           separators=(",", ":")).encode()
    expected = hashlib.sha256(hashlib.sha256(MODEL).hexdigest().encode() + b"\0" + canonical)
    assert k == expected.hexdigest()
    # Key order of the options does not matter, their content does.
    assert key_of(options=dict(reversed(list(OPTIONS.items())))) == k


def test_key_is_the_same_in_another_process():
    code = """
        import sys
        from coralrt._compile.cache import make_key
        print(make_key(bytes.fromhex(sys.argv[1]), options={"b": [1, 2.5, "é"], "a": None},
                       compiler_id="edgetpu_compiler", compiler_version="16.0"))
    """
    here = make_key(MODEL, options={"a": None, "b": [1, 2.5, "é"]},
                    compiler_id="edgetpu_compiler", compiler_version="16.0")
    procs = [run_python(code, MODEL.hex(), env={**os.environ, "PYTHONHASHSEED": seed})
             for seed in ("1", "2")]
    for p in procs:
        out, err = p.communicate(timeout=60)
        assert p.returncode == 0, err
        assert out.strip() == here


@pytest.mark.parametrize("change", [
    {"model": MODEL[:-1] + b"\x00"},
    {"model": MODEL + b"\x00"},
    {"options": {**OPTIONS, "max_segments": 2}},
    {"options": {**OPTIONS, "extra": True}},
    {"options": {}},
    {"compiler_id": "edgetpu_compiler"},
    {"compiler_version": "0.1.1"},
], ids=["model-byte", "model-length", "option-value", "option-added", "no-options",
        "compiler-id", "compiler-version"])
def test_key_changes_with_each_part(change):
    assert key_of(**change) != key_of()


def test_key_rejects_options_that_are_not_json():
    with pytest.raises(TypeError, match="JSON"):
        key_of(options={"path": Path("/x")})


# -- put / get -----------------------------------------------------------------

def test_put_get_round_trip(tmp_path):
    cache = CompileCache(tmp_path, max_bytes=1 << 20, enabled=True)
    k = key_of()
    data = os.urandom(5000)
    before = time.time()
    stored = cache.put(k, data, {"segments": 2, "compiler": "native"}, source=SRC)
    assert stored.data == data
    got = CompileCache(tmp_path, max_bytes=1 << 20, enabled=True).get(k, source=SRC)
    assert got == Entry(data, stored.meta)
    assert got.meta["segments"] == 2 and got.meta["compiler"] == "native"
    assert got.meta["size"] == 5000 and got.meta["format"] == CACHE_FORMAT_VERSION
    assert got.meta["crc32"] == entry_crc(k, SRC, data) and got.data_crc32 == zlib.crc32(data)
    assert (got.meta["key"], got.meta["source"]) == (k, SRC)
    assert before <= got.meta["created"] <= time.time()
    bin_path, json_path, _ = files_of(tmp_path, k)
    assert bin_path.read_bytes() == data  # raw bytes, not a pickle
    assert json.loads(json_path.read_text()) == got.meta
    assert cache.get(key_of(compiler_version="9"), source=SRC) is None
    assert len(repr(got)) < 500  # the data is not dumped into logs and tracebacks


def test_put_refuses_reserved_metadata_and_bad_keys(tmp_path):
    cache = CompileCache(tmp_path, max_bytes=1 << 20, enabled=True)
    with pytest.raises(ValueError, match="crc32"):
        cache.put(key_of(), b"x", {"crc32": 0}, source=SRC)
    for bad in ("../../etc/passwd", "ABC", key_of().upper()):
        with pytest.raises(ValueError, match="64 lowercase hex"):
            cache.get(bad, source=SRC)
    assert not any(tmp_path.rglob("*.json"))


WRITER = """
    import sys
    from pathlib import Path
    from coralrt._compile.cache import CompileCache, make_key
    root, mode, n, size = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
    SRC = sys.argv[5]
    cache = CompileCache(Path(root), max_bytes=1 << 40, enabled=True)
    same = make_key(b"m", options={}, compiler_id="c", compiler_version="1")
    for i in range(n):
        key = same if mode == "same" else make_key(str(i).encode(), options={},
                                                   compiler_id="c", compiler_version="1")
        # A large record too, so that a torn JSON write would be visible.
        cache.put(key, bytes([i % 256]) * (size + i), {"i": i, "notes": "n" * (size // 4)},
                  source=SRC)
"""


def test_reader_never_sees_a_record_without_its_whole_data(tmp_path):
    n = 40
    writer = run_python(WRITER, tmp_path, "distinct", n, 512 << 10, SRC)
    verified, bad = set(), []
    while True:
        done = writer.poll() is not None
        for json_path in tmp_path.glob("v*/*/*.json"):
            if json_path.name in verified:
                continue
            try:
                meta = json.loads(json_path.read_bytes())
                data = json_path.with_suffix(".bin").read_bytes()
            except (OSError, ValueError) as e:
                bad.append(f"{json_path.name}: {e!r}")
                continue
            if (len(data) != meta["size"]
                    or entry_crc(meta["key"], meta["source"], data) != meta["crc32"]):
                bad.append(f"{json_path.name}: data does not verify")
            verified.add(json_path.name)
        if done:
            break
    assert writer.returncode == 0, writer.stderr.read()
    assert bad == []
    assert len(verified) == n


def test_overwriting_an_entry_is_never_seen_as_corrupt(tmp_path, caplog):
    cache = CompileCache(tmp_path, max_bytes=1 << 40, enabled=True)
    key = make_key(b"m", options={}, compiler_id="c", compiler_version="1")
    writer = run_python(WRITER, tmp_path, "same", 60, 1 << 20, SRC)
    seen = set()
    with caplog.at_level(logging.WARNING, logger="coralrt.cache"):
        while writer.poll() is None:
            entry = cache.get(key, source=SRC)
            if entry is not None:
                i = entry.meta["i"]
                assert entry.data == bytes([i % 256]) * ((1 << 20) + i)
                seen.add(i)
    assert writer.returncode == 0, writer.stderr.read()
    assert [r.getMessage() for r in caplog.records] == []
    assert len(seen) > 1
    assert cache.get(key, source=SRC).meta["i"] == 59


# -- corruption ----------------------------------------------------------------

def _truncate(b: Path, j: Path): b.write_bytes(b.read_bytes()[:-1])
def _flip(b: Path, j: Path): d = bytearray(b.read_bytes()); d[100] ^= 1; b.write_bytes(d)
def _garble(b: Path, j: Path): j.write_text("{not json")
def _cut_json(b: Path, j: Path): j.write_bytes(j.read_bytes()[:20])
def _not_object(b: Path, j: Path): j.write_text("[1, 2]")
def _no_data(b: Path, j: Path): b.unlink()
def _other_format(b: Path, j: Path):
    meta = json.loads(j.read_text())
    j.write_text(json.dumps({**meta, "format": CACHE_FORMAT_VERSION + 1}))


@pytest.mark.parametrize("damage", [_truncate, _flip, _garble, _cut_json, _not_object,
                                    _no_data, _other_format],
                         ids=lambda f: f.__name__.strip("_"))
def test_corrupt_entry_is_a_logged_miss_then_rebuilt(tmp_path, caplog, damage):
    cache = CompileCache(tmp_path, max_bytes=1 << 20, enabled=True)
    k = key_of()
    data = os.urandom(1000)
    cache.put(k, data, {"n": 1}, source=SRC)
    bin_path, json_path, _ = files_of(tmp_path, k)
    damage(bin_path, json_path)
    with caplog.at_level(logging.WARNING, logger="coralrt.cache"):
        assert cache.get(k, source=SRC) is None
    [record] = caplog.records
    assert record.levelno == logging.WARNING and record.name == "coralrt.cache"
    assert "corrupt cache entry" in record.getMessage() and k in record.getMessage()
    assert "rebuilding" in record.getMessage()
    assert not bin_path.exists() and not json_path.exists()

    builds = []
    entry, hit = cache.get_or_build(k, lambda: (builds.append(1) or data, {"n": 2}), source=SRC)
    assert (hit, builds, entry.data, entry.meta["n"]) == (False, [1], data, 2)
    assert cache.get(k, source=SRC) == entry


def test_corrupt_entry_found_by_get_or_build_is_rebuilt(tmp_path, caplog):
    cache = CompileCache(tmp_path, max_bytes=1 << 20, enabled=True)
    k = key_of()
    cache.put(k, b"old" * 100, {}, source=SRC)
    _flip(*files_of(tmp_path, k)[:2])
    with caplog.at_level(logging.WARNING, logger="coralrt.cache"):
        entry, hit = cache.get_or_build(k, lambda: (b"new" * 100, {}), source=SRC)
    assert not hit and entry.data == b"new" * 100
    assert ["corrupt" in r.getMessage() for r in caplog.records] == [True]
    assert cache.get(k, source=SRC).data == b"new" * 100


def test_data_without_record_is_a_plain_miss(tmp_path, caplog):
    # What a writer that died between its two renames leaves behind.
    cache = CompileCache(tmp_path, max_bytes=1 << 20, enabled=True)
    k = key_of()
    cache.put(k, b"x" * 100, {}, source=SRC)
    files_of(tmp_path, k)[1].unlink()
    with caplog.at_level(logging.WARNING, logger="coralrt.cache"):
        assert cache.get(k, source=SRC) is None
    assert caplog.records == []


# -- entries are bound to their key and source --------------------------------

MODEL_B = MODEL[::-1]
SRC_B = hashlib.sha256(MODEL_B).hexdigest()


def two_entries(tmp_path) -> tuple[CompileCache, str, str]:
    """A cache holding model A's entry and model B's (same options and compiler)."""
    cache = CompileCache(tmp_path, max_bytes=1 << 20, enabled=True)
    ka, kb = key_of(), key_of(MODEL_B)
    cache.put(ka, b"program of A" * 50, {"model": "A"}, source=SRC)
    cache.put(kb, b"program of B" * 50, {"model": "B"}, source=SRC_B)
    return cache, ka, kb


def copy_entry(root: Path, src_key: str, dst_key: str, **edits) -> None:
    """Copy ``src_key``'s files over ``dst_key``'s, as a sync tool or import would;
    ``edits`` rewrite fields of the copied record."""
    (sb, sj, _), (db, dj, _) = files_of(root, src_key), files_of(root, dst_key)
    db.write_bytes(sb.read_bytes())
    dj.write_text(json.dumps({**json.loads(sj.read_text()), **edits}))


def test_entry_copied_over_another_key_is_a_logged_miss_then_rebuilt(tmp_path, caplog):
    cache, ka, kb = two_entries(tmp_path)
    copy_entry(tmp_path, kb, ka)
    with caplog.at_level(logging.WARNING, logger="coralrt.cache"):
        assert cache.get(ka, source=SRC) is None
    [record] = caplog.records
    message = record.getMessage()
    assert record.levelno == logging.WARNING and ka in message and kb in message
    assert "does not belong" in message and "rebuilding" in message
    assert not any(p.exists() for p in files_of(tmp_path, ka)[:2])
    entry, hit = cache.get_or_build(ka, lambda: (b"program of A" * 50, {"model": "A"}),
                                    source=SRC)
    assert (hit, entry.data, entry.meta["model"]) == (False, b"program of A" * 50, "A")
    assert cache.get(ka, source=SRC) == entry
    assert cache.get(kb, source=SRC_B).meta["model"] == "B"  # B's own entry is untouched


@pytest.mark.parametrize("edit,expect", [
    ("key", "does not belong"),            # B's entry relabelled with A's key
    ("source", "does not belong"),         # ... with A's source digest only
    ("key+source", "does not match its CRC-32"),   # ... with both: the checksum tells
], ids=["key", "source", "key-and-source"])
def test_copied_entry_with_edited_binding_is_never_served(tmp_path, caplog, edit, expect):
    cache, ka, kb = two_entries(tmp_path)
    edits = {"key": {"key": ka}, "source": {"key": kb, "source": SRC},
             "key+source": {"key": ka, "source": SRC}}[edit]
    copy_entry(tmp_path, kb, ka, **edits)
    with caplog.at_level(logging.WARNING, logger="coralrt.cache"):
        assert cache.get(ka, source=SRC) is None
    [record] = caplog.records
    assert expect in record.getMessage() and "rebuilding" in record.getMessage()


@pytest.mark.parametrize("field", ["key", "source"])
def test_own_entry_with_edited_key_or_source_field_is_a_miss(tmp_path, caplog, field):
    cache, ka, kb = two_entries(tmp_path)
    _, json_path, _ = files_of(tmp_path, ka)
    meta = json.loads(json_path.read_text())
    json_path.write_text(json.dumps({**meta, field: {"key": kb, "source": SRC_B}[field]}))
    with caplog.at_level(logging.WARNING, logger="coralrt.cache"):
        assert cache.get(ka, source=SRC) is None
    assert ["rebuilding" in r.getMessage() for r in caplog.records] == [True]


def test_entry_is_served_only_for_the_source_it_was_built_from(tmp_path, caplog):
    # The key is derived from the source digest, so a caller asking for key A
    # with another digest means the entry was written under a wrong key.
    cache, ka, _ = two_entries(tmp_path)
    with caplog.at_level(logging.WARNING, logger="coralrt.cache"):
        assert cache.get(ka, source=SRC_B) is None
    assert SRC_B in caplog.records[0].getMessage() and SRC in caplog.records[0].getMessage()
    with pytest.raises(ValueError, match="SHA-256"):
        cache.get(ka, source="not a digest")


def test_entries_of_the_previous_format_are_plain_misses(tmp_path, caplog):
    # Format 1 stored no key or source; its entries live under v1/ and are never read.
    k = key_of()
    old = tmp_path / "v1" / k[:2]
    old.mkdir(parents=True)
    (old / f"{k}.bin").write_bytes(b"old program")
    (old / f"{k}.json").write_text(json.dumps({"size": 11, "crc32": zlib.crc32(b"old program"),
                                               "created": 0.0, "format": 1}))
    cache = CompileCache(tmp_path, max_bytes=1 << 20, enabled=True)
    with caplog.at_level(logging.WARNING, logger="coralrt.cache"):
        assert cache.get(k, source=SRC) is None
        entry, hit = cache.get_or_build(k, lambda: (b"new program", {}), source=SRC)
    assert (entry.data, hit, caplog.records) == (b"new program", False, [])
    assert CACHE_FORMAT_VERSION == 2 and cache.path == tmp_path / "v2"


# -- permissions -----------------------------------------------------------------

class _CapHeader(ctypes.Structure):
    _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]


class _CapData(ctypes.Structure):
    _fields_ = [("effective", ctypes.c_uint32), ("permitted", ctypes.c_uint32),
                ("inheritable", ctypes.c_uint32)]


_DAC_OVERRIDE = 1 << 1 | 1 << 2  # CAP_DAC_OVERRIDE, CAP_DAC_READ_SEARCH


@contextlib.contextmanager
def permissions_enforced():
    """File modes apply inside the block even when the tests run as root: the
    calling thread drops CAP_DAC_OVERRIDE and CAP_DAC_READ_SEARCH from its
    effective capabilities for the duration (capabilities are per thread)."""
    if os.geteuid() != 0:
        yield
        return
    if not sys.platform.startswith("linux"):
        pytest.skip("running as root, and root ignores file modes here")
    libc = ctypes.CDLL(None, use_errno=True)
    header, caps = _CapHeader(0x20080522, 0), (_CapData * 2)()  # _LINUX_CAPABILITY_VERSION_3
    if libc.capget(ctypes.byref(header), caps) != 0:
        pytest.skip(f"capget failed: {os.strerror(ctypes.get_errno())}")
    saved = caps[0].effective
    caps[0].effective = saved & ~_DAC_OVERRIDE
    if libc.capset(ctypes.byref(header), caps) != 0:
        pytest.skip(f"capset failed: {os.strerror(ctypes.get_errno())}")
    try:
        yield
    finally:
        caps[0].effective = saved
        libc.capset(ctypes.byref(header), caps)


@contextlib.contextmanager
def mode(path: Path, bits: int):
    before = path.stat().st_mode & 0o7777
    path.chmod(bits)
    try:
        yield path
    finally:
        path.chmod(before)


def permission_warnings(records) -> list[str]:
    return [r.getMessage() for r in records if "permission denied" in r.getMessage()]


@pytest.mark.parametrize("unreadable", ["json", "bin", "shard folder", "cache folder"])
def test_unreadable_cache_file_is_a_permission_problem_not_corruption(tmp_path, caplog,
                                                                      unreadable):
    cache = CompileCache(tmp_path, max_bytes=1 << 20, enabled=True)
    k = key_of()
    cache.put(k, b"cached" * 100, {}, source=SRC)
    bin_path, json_path, _ = files_of(tmp_path, k)
    target = {"json": json_path, "bin": bin_path, "shard folder": bin_path.parent,
              "cache folder": tmp_path}[unreadable]
    named = json_path if unreadable != "bin" else bin_path  # the file whose read failed
    builds = []
    with mode(target, 0), permissions_enforced(), \
            caplog.at_level(logging.WARNING, logger="coralrt.cache"):
        assert cache.get(k, source=SRC) is None
        entry, hit = cache.get_or_build(k, lambda: (builds.append(1) or b"built" * 100, {}),
                                        source=SRC)
    assert (entry.data, hit, builds) == (b"built" * 100, False, [1])
    messages = [r.getMessage() for r in caplog.records]
    assert not any("corrupt" in m for m in messages), messages
    assert len(permission_warnings(caplog.records)) == 2
    assert all(str(named) in m and "building without the cache" in m
               for m in permission_warnings(caplog.records))
    # Nothing was deleted or overwritten: the entry serves again once readable.
    assert cache.get(k, source=SRC).data == b"cached" * 100


def test_cache_folder_not_writable_is_reported_as_a_permission_problem(tmp_path, caplog):
    root = tmp_path / "cache"
    root.mkdir()
    cache = CompileCache(root, max_bytes=1 << 20, enabled=True)
    with mode(root, 0o500), permissions_enforced(), \
            caplog.at_level(logging.WARNING, logger="coralrt.cache"):
        entry, hit = cache.get_or_build(key_of(), lambda: (b"built", {}), source=SRC)
    assert (entry.data, hit) == (b"built", False)
    [message] = permission_warnings(caplog.records)
    assert str(root / "v2") in message and "building without it" in message


# -- digest index ---------------------------------------------------------------

def settled_model() -> Path:
    """A model file whose timestamps have settled (the digest index records it)."""
    return shared_model("split_concat.tflite")


def record_of(index: Path, path: Path) -> Path:
    name = hashlib.sha256(os.fsencode(path.resolve())).hexdigest()
    return index / name[:2] / f"{name}.json"


def test_digest_index_serves_a_settled_file_without_reading_it(tmp_path):
    path, index = settled_model(), tmp_path / "sources"
    digest = hashlib.sha256(path.read_bytes()).hexdigest()
    assert model_digest(path, index) == (digest, path.read_bytes())
    stored = json.loads(record_of(index, path).read_text())
    assert stored["path"] == str(path.resolve()) and stored["sha256"] == digest
    assert model_digest(path, index) == (digest, None)  # from the record


@pytest.mark.parametrize("how", ["copied from another path", "name collision"])
def test_digest_record_naming_another_path_is_ignored(tmp_path, how):
    path, index = settled_model(), tmp_path / "sources"
    other = tmp_path / "other.tflite"
    other.write_bytes(b"another model")
    wrong = hashlib.sha256(b"another model").hexdigest()
    # In A's slot, a record of B: B's stamp (a copy), or even A's own stamp (as
    # a record whose name collided would be for a file with identical stat).
    st = (other if how == "copied from another path" else path).stat()
    slot = record_of(index, path)
    slot.parent.mkdir(parents=True)
    slot.write_text(json.dumps({"path": str(other.resolve()), "stamp": _stamp(st),
                                "sha256": wrong}))
    digest, data = model_digest(path, index)
    assert digest == hashlib.sha256(path.read_bytes()).hexdigest() and data is not None


@pytest.mark.parametrize("bad", [5, None, "zz", "A" * 64, ["x"], "0" * 63])
def test_digest_record_with_a_malformed_digest_is_ignored(tmp_path, bad):
    path, index = settled_model(), tmp_path / "sources"
    slot = record_of(index, path)
    slot.parent.mkdir(parents=True)
    slot.write_text(json.dumps({"path": str(path.resolve()), "stamp": _stamp(path.stat()),
                                "sha256": bad}))
    digest, data = model_digest(path, index)
    assert digest == hashlib.sha256(path.read_bytes()).hexdigest() and data is not None


def test_digest_of_a_file_written_just_now_is_not_recorded(tmp_path):
    # Its stamp may survive a rewrite within the same clock tick (git's
    # "racily clean" files), so the digest is not remembered until it settles.
    path, index = tmp_path / "fresh.tflite", tmp_path / "sources"
    path.write_bytes(b"version 1")
    assert model_digest(path, index)[0] == hashlib.sha256(b"version 1").hexdigest()
    assert not record_of(index, path).exists()
    path.write_bytes(b"version 2")
    assert model_digest(path, index)[0] == hashlib.sha256(b"version 2").hexdigest()


def test_unreadable_digest_record_is_reported_and_the_model_hashed(tmp_path, caplog):
    path, index = settled_model(), tmp_path / "sources"
    digest = model_digest(path, index)[0]
    with mode(record_of(index, path), 0), permissions_enforced(), \
            caplog.at_level(logging.WARNING, logger="coralrt.cache"):
        assert model_digest(path, index) == (digest, path.read_bytes())
    [message] = permission_warnings(caplog.records)
    assert str(record_of(index, path)) in message


# -- concurrency ---------------------------------------------------------------

WORKER = """
    import hashlib, json, os, sys, time, uuid
    from pathlib import Path
    from coralrt._compile.cache import CompileCache
    root, key, marks, SRC = sys.argv[1], sys.argv[2], Path(sys.argv[3]), sys.argv[4]
    cache = CompileCache(Path(root), max_bytes=1 << 30, enabled=True)
    (marks / f"ready-{os.getpid()}").touch()
    while not (marks / "go").exists():
        time.sleep(0.002)

    def build():
        (marks / f"build-{os.getpid()}-{uuid.uuid4().hex}").touch()
        time.sleep(0.5)
        return os.urandom(4096) + f"built by {os.getpid()}".encode() * 1000, {"pid": os.getpid()}

    entry, hit = cache.get_or_build(key, build, source=SRC)
    print(json.dumps({"pid": os.getpid(), "hit": hit, "builder": entry.meta["pid"],
                      "sha256": hashlib.sha256(entry.data).hexdigest()}))
"""


def test_processes_compiling_the_same_model_build_it_once(tmp_path):
    root, marks = tmp_path / "cache", tmp_path / "marks"
    marks.mkdir()
    k = key_of()
    n = 5
    procs = [run_python(WORKER, root, k, marks, SRC) for _ in range(n)]
    deadline = time.monotonic() + 60
    while len(list(marks.glob("ready-*"))) < n:
        assert time.monotonic() < deadline, "workers did not start"
        assert all(p.poll() is None for p in procs), [p.stderr.read() for p in procs]
        time.sleep(0.01)
    (marks / "go").touch()  # all of them at once
    results = []
    for p in procs:
        out, err = p.communicate(timeout=60)
        assert p.returncode == 0, err
        results.append(json.loads(out))
    builds = sorted(marks.glob("build-*"))
    assert len(builds) == 1, builds
    builder = int(builds[0].name.split("-")[1])
    assert len({r["sha256"] for r in results}) == 1
    assert {r["builder"] for r in results} == {builder}
    assert sorted(r["hit"] for r in results) == [False] + [True] * (n - 1)
    assert [r["pid"] for r in results if not r["hit"]] == [builder]


def test_lock_wait_has_a_timeout(tmp_path):
    cache = CompileCache(tmp_path, max_bytes=1 << 20, enabled=True, lock_timeout=0.2)
    k = key_of()
    lock_path = files_of(tmp_path, k)[2]
    lock_path.parent.mkdir(parents=True)
    builds = []
    with FileLock(lock_path):
        with pytest.raises(CacheLockTimeoutError) as info:
            cache.get_or_build(k, lambda: (builds.append(1) or b"x", {}), source=SRC)
    assert builds == []
    err = info.value
    assert isinstance(err, TimeoutError) and isinstance(err, CoralRTError)
    assert str(lock_path) in str(err) and err.timeout == 0.2
    again = pickle.loads(pickle.dumps(err))
    assert type(again) is CacheLockTimeoutError and again.path == err.path
    assert str(again) == str(err)


# -- write errors --------------------------------------------------------------

def test_unusable_cache_folder_does_not_fail_the_build(tmp_path, caplog):
    not_a_dir = tmp_path / "file"
    not_a_dir.write_text("not a folder")
    cache = CompileCache(not_a_dir, max_bytes=1 << 20, enabled=True)
    builds = []
    with caplog.at_level(logging.WARNING, logger="coralrt.cache"):
        for _ in range(2):
            entry, hit = cache.get_or_build(key_of(), lambda: (builds.append(1) or b"ok", {}),
                                            source=SRC)
            assert (entry.data, hit) == (b"ok", False)
    assert len(builds) == 2
    assert len(caplog.records) == 2 and "building without it" in caplog.records[0].getMessage()


def test_failed_write_does_not_fail_the_build(tmp_path, caplog):
    cache = CompileCache(tmp_path, max_bytes=1 << 20, enabled=True)
    k = key_of()
    bin_path, json_path, _ = files_of(tmp_path, k)
    bin_path.mkdir(parents=True)  # the rename onto it fails, as on a full disk
    with caplog.at_level(logging.WARNING, logger="coralrt.cache"):
        entry, hit = cache.get_or_build(k, lambda: (b"built", {"a": 1}), source=SRC)
    assert (entry.data, entry.meta["a"], hit) == (b"built", 1, False)
    assert "cannot write compile cache entry" in caplog.records[0].getMessage()
    assert not json_path.exists()
    assert not [p for p in bin_path.parent.iterdir() if p.name.endswith(".tmp")]


# -- size cap ------------------------------------------------------------------

def test_lru_eviction_respects_recent_hits(tmp_path):
    size = 10_000
    cache = CompileCache(tmp_path, max_bytes=35_000, enabled=True)
    keys = {name: key_of(compiler_version=name) for name in "abcde"}
    now = time.time()
    for age, name in zip((300, 200, 100), "abc"):
        cache.put(keys[name], name.encode() * size, {}, source=SRC)
        os.utime(files_of(tmp_path, keys[name])[0], (now - age, now - age))
    assert cache.evict() == 0  # three entries fit
    assert cache.get(keys["a"], source=SRC) is not None  # a hit makes "a" the most recent

    _, hit = cache.get_or_build(keys["d"], lambda: (b"d" * size, {}), source=SRC)
    assert not hit
    present = {n for n, k in keys.items() if files_of(tmp_path, k)[0].exists()}
    assert present == {"a", "c", "d"}  # "b" was the least recently used

    cache.get_or_build(keys["e"], lambda: (b"e" * size, {}), source=SRC)
    present = {n for n, k in keys.items() if files_of(tmp_path, k)[0].exists()}
    assert present == {"a", "d", "e"}
    info = cache.info()
    assert info["entries"] == 3 and info["total_bytes"] <= 35_000


def test_eviction_never_removes_the_entry_just_written(tmp_path):
    cache = CompileCache(tmp_path, max_bytes=0, enabled=True)
    entry, _ = cache.get_or_build(key_of(), lambda: (b"x" * 1000, {}), source=SRC)
    assert cache.get(key_of(), source=SRC) == entry
    cache.get_or_build(key_of(compiler_version="2"), lambda: (b"y" * 1000, {}), source=SRC)
    assert cache.get(key_of(), source=SRC) is None and cache.info()["entries"] == 1


# -- disabled ------------------------------------------------------------------

def test_disabled_cache_builds_every_time_and_writes_nothing(tmp_path):
    k = key_of()
    CompileCache(tmp_path / "c", max_bytes=1 << 20, enabled=True).put(k, b"cached", {}, source=SRC)
    off = CompileCache(tmp_path / "c", max_bytes=1 << 20, enabled=False)
    assert off.get(k, source=SRC) is None
    builds = []
    for _ in range(3):
        entry, hit = off.get_or_build(k, lambda: (builds.append(1) or b"fresh", {"x": 1}),
                                      source=SRC)
        assert (entry.data, entry.meta["x"], hit) == (b"fresh", 1, False)
    assert len(builds) == 3
    other = key_of(compiler_version="2")
    assert off.put(other, b"z", {}, source=SRC).meta["size"] == 1
    assert sorted(p.name for p in tmp_path.rglob("*") if p.is_file()) == \
        sorted([f"{k}.bin", f"{k}.json"])
    assert off.info()["enabled"] is False and off.info()["entries"] == 1


# -- configuration -------------------------------------------------------------

@pytest.fixture
def clean_env(monkeypatch):
    for name in (config.CACHE_DIR, config.CACHE, config.CACHE_MAX_BYTES):
        monkeypatch.delenv(name, raising=False)
    return monkeypatch


def test_cache_dir_from_environment_at_call_time(clean_env, tmp_path):
    assert config.cache_dir() == Path(platformdirs.user_cache_dir("coralrt"))
    clean_env.setenv("CORALRT_CACHE_DIR", str(tmp_path))
    assert config.cache_dir() == tmp_path
    assert CompileCache().root == tmp_path
    clean_env.setenv("CORALRT_CACHE_DIR", "")
    assert config.cache_dir() == Path(platformdirs.user_cache_dir("coralrt"))


@pytest.mark.parametrize("value,enabled", [
    ("0", False), ("false", False), ("No", False), (" OFF ", False),
    ("1", True), ("true", True), ("yes", True), ("on", True), ("", True)])
def test_cache_switch(clean_env, tmp_path, value, enabled):
    clean_env.setenv("CORALRT_CACHE_DIR", str(tmp_path))
    clean_env.setenv("CORALRT_CACHE", value)
    assert config.cache_enabled() is enabled
    cache = CompileCache(max_bytes=1 << 20)
    builds = []
    for _ in range(2):
        cache.get_or_build(key_of(), lambda: (builds.append(1) or b"x", {}), source=SRC)
    assert len(builds) == (1 if enabled else 2)


def test_cache_switch_rejects_unknown_values(clean_env):
    clean_env.setenv("CORALRT_CACHE", "disable")
    with pytest.raises(ConfigError, match="CORALRT_CACHE="):
        config.cache_enabled()


@pytest.mark.parametrize("value,expected", [
    (None, 1 << 30), ("1000", 1000), ("0", 0), ("64K", 64 << 10), ("500m", 500 << 20),
    ("2G", 2 << 30), ("3GiB", 3 << 30), ("10 MB", 10 << 20)])
def test_cache_max_bytes(clean_env, value, expected):
    if value is not None:
        clean_env.setenv("CORALRT_CACHE_MAX_BYTES", value)
    assert config.cache_max_bytes() == expected


@pytest.mark.parametrize("value", ["-1", "lots", "1.5G", "12x", "0x10"])
def test_cache_max_bytes_rejects_bad_values(clean_env, value):
    clean_env.setenv("CORALRT_CACHE_MAX_BYTES", value)
    with pytest.raises(ConfigError, match="CORALRT_CACHE_MAX_BYTES") as info:
        CompileCache()
    assert isinstance(info.value, ValueError)


# -- command line --------------------------------------------------------------

def test_cli_info_and_clear(clean_env, tmp_path, capsys):
    clean_env.setenv("CORALRT_CACHE_DIR", str(tmp_path))
    clean_env.setenv("CORALRT_CACHE_MAX_BYTES", "5M")
    cache = CompileCache()
    for v in ("1", "2"):
        cache.get_or_build(key_of(compiler_version=v), lambda: (b"x" * 3000, {}), source=SRC)
    k1 = key_of(compiler_version="1")
    stale_tmp = files_of(tmp_path, k1)[0].parent / f".{k1}.bin.abc.tmp"
    stale_tmp.write_bytes(b"partial")
    (tmp_path / "notes.txt").write_text("not ours")

    assert main(["cache", "info", "--json"]) == 0
    info = json.loads(capsys.readouterr().out)
    on_disk = sum(p.stat().st_size for p in tmp_path.rglob("*") if p.suffix in (".bin", ".json"))
    assert info == {"directory": str(tmp_path), "enabled": True, "entries": 2,
                    "total_bytes": on_disk, "max_bytes": 5 << 20,
                    "format_version": CACHE_FORMAT_VERSION}
    assert main(["cache", "info"]) == 0
    text = capsys.readouterr().out
    assert str(tmp_path) in text and "entries         2" in text

    assert main(["cache", "clear"]) == 0
    assert capsys.readouterr().out.strip() == f"removed 2 cache entries from {tmp_path}"
    assert sorted(p.name for p in tmp_path.rglob("*") if p.is_file()) == ["notes.txt"]
    assert main(["cache", "info", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["entries"] == 0
    assert main(["cache", "clear"]) == 0
    assert "removed 0 cache entries" in capsys.readouterr().out


def test_cli_clear_keeps_a_lock_in_use(clean_env, tmp_path, capsys):
    clean_env.setenv("CORALRT_CACHE_DIR", str(tmp_path))
    lock_path = files_of(tmp_path, key_of())[2]
    lock_path.parent.mkdir(parents=True)
    idle = lock_path.with_name(f"{key_of(compiler_version='2')}.lock")
    idle.touch()
    with FileLock(lock_path):
        assert main(["cache", "clear"]) == 0
        assert lock_path.exists() and not idle.exists()


def test_cli_reports_disabled_cache_and_bad_settings(clean_env, tmp_path, capsys):
    clean_env.setenv("CORALRT_CACHE_DIR", str(tmp_path))
    clean_env.setenv("CORALRT_CACHE", "0")
    assert main(["cache", "info"]) == 0
    assert "no (CORALRT_CACHE)" in capsys.readouterr().out
    clean_env.setenv("CORALRT_CACHE_MAX_BYTES", "huge")
    assert main(["cache", "info"]) == 1
    err = capsys.readouterr().err.strip()
    assert err.startswith("coralrt: error: CORALRT_CACHE_MAX_BYTES='huge'")
    assert main(["cache"]) == 1     # `cache` alone is `cache info`
    assert main(["cache", "nope"]) == 2
