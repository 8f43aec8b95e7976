"""Shippable compile caches and the lookup by source model.

``CompileCache.newest`` (the newest verified entry of a model, found through
the by-source index) and ``coralrt cache export`` / ``coralrt cache import``
(coralrt/_compile/cache_archive.py).  Everything runs against real files in
``tmp_path``; the bad archives are built here with :mod:`tarfile` directly.
"""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import os
import tarfile
from pathlib import Path

import pytest

from coralrt._cli.main import main
from coralrt._compile.cache import CACHE_FORMAT_VERSION, CompileCache, make_key
from coralrt._compile.cache_archive import ARCHIVE_NAME, ARCHIVE_VERSION, export_cache
from coralrt._compile.cache_import import import_cache
from coralrt.errors import CacheArchiveError, CoralRTError

MODEL_A = b"TFL3" + bytes(range(256)) * 4
MODEL_B = b"TFL3" + bytes(range(255, -1, -1)) * 4
SRC_A = hashlib.sha256(MODEL_A).hexdigest()
SRC_B = hashlib.sha256(MODEL_B).hexdigest()
OPTIONS = {"mode": "edgetpu_compiler", "rules": 3}


def key(model: bytes, version: str, compiler: str = "edgetpu_compiler") -> str:
    return make_key(model, options=OPTIONS, compiler_id=compiler, compiler_version=version)


def meta(version: str, compiler: str = "edgetpu_compiler", segments: int = 1) -> dict:
    """Metadata shaped like what coralrt/_compile/jit.py stores."""
    return {"compiler": f"{compiler} {version}", "options": OPTIONS, "build_seconds": 0.5,
            "summary": {"segments": segments, "tpu_ops": 3, "cpu_ops": 1},
            "placement": [["tpu", 0, "mapped"], ["tpu", 0, "mapped"], ["cpu", None, "float"]]}


def fill(cache: CompileCache) -> dict[str, tuple[str, bytes, float]]:
    """Three entries of model A (compiler versions 15, 16, 14, built in that order of
    time: 16 newest) and one of model B.  ``key -> (source, data, created)``."""
    made = {}
    for model, src, version, created in ((MODEL_A, SRC_A, "15.0", 1000.0),
                                         (MODEL_A, SRC_A, "16.0", 3000.0),
                                         (MODEL_A, SRC_A, "14.0", 2000.0),
                                         (MODEL_B, SRC_B, "16.0", 4000.0)):
        k = key(model, version)
        data = f"compiled {src[:8]} by {version} ".encode() * 20
        cache.put(k, data, meta(version), source=src, created=created)
        made[k] = (src, data, created)
    return made


def files(cache: CompileCache, k: str) -> tuple[Path, Path]:
    d = cache.path / k[:2]
    return d / f"{k}.bin", d / f"{k}.json"


def hint(cache: CompileCache, source: str, k: str) -> Path:
    return cache.path / "by-source" / source[:2] / source / k


def stored_files(root: Path) -> list[str]:
    return sorted(p.name for p in root.rglob("*") if p.is_file())


def all_records(cache: CompileCache) -> dict[str, dict]:
    return {e.meta["key"]: e.meta for e in cache.entries()}


# -- newest(): the newest entry of a model, without its key ------------------------------

def test_newest_picks_the_latest_build_the_caller_accepts(tmp_path):
    cache = CompileCache(tmp_path / "c", max_bytes=1 << 20)
    made = fill(cache)
    newest = cache.newest(SRC_A, lambda m: True)
    assert newest.meta["compiler"] == "edgetpu_compiler 16.0"
    assert newest.data == made[newest.meta["key"]][1]
    assert newest.meta["created"] == 3000.0
    # accept sees the record and can refuse the newest: the next newest is served
    seen = []

    def not_16(record: dict) -> bool:
        seen.append(record["compiler"])
        return "16.0" not in record["compiler"]

    older = cache.newest(SRC_A, not_16)
    assert older.meta["compiler"] == "edgetpu_compiler 14.0"
    assert "edgetpu_compiler 16.0" in seen
    assert cache.newest(SRC_A, lambda m: False) is None
    assert cache.newest(SRC_B, lambda m: True).meta["source"] == SRC_B
    assert cache.newest("0" * 64, lambda m: True) is None
    assert CompileCache(tmp_path / "c", enabled=False).newest(SRC_A, lambda m: True) is None
    with pytest.raises(ValueError, match="source must be"):
        cache.newest("not a digest", lambda m: True)


def test_put_keeps_the_given_build_time(tmp_path):
    cache = CompileCache(tmp_path / "c", max_bytes=1 << 20)
    k = key(MODEL_A, "16.0")
    assert cache.put(k, b"x", meta("16.0"), source=SRC_A, created=12.5).meta["created"] == 12.5
    assert cache.get(k, source=SRC_A).meta["created"] == 12.5
    for bad in (float("nan"), "yesterday", True):
        with pytest.raises(ValueError, match="created"):
            cache.put(k, b"x", {}, source=SRC_A, created=bad)


def test_newest_skips_a_corrupt_entry_and_drops_its_hint(tmp_path, caplog):
    cache = CompileCache(tmp_path / "c", max_bytes=1 << 20)
    fill(cache)
    k16 = key(MODEL_A, "16.0")
    bin16, json16 = files(cache, k16)
    bin16.write_bytes(b"flipped" + bin16.read_bytes()[7:])
    found = cache.newest(SRC_A, lambda m: True)
    assert found.meta["compiler"] == "edgetpu_compiler 14.0"
    assert "corrupt cache entry" in caplog.text
    assert not bin16.exists() and not json16.exists()
    assert not hint(cache, SRC_A, k16).exists()
    assert hint(cache, SRC_A, key(MODEL_A, "14.0")).is_dir()


def test_newest_drops_hints_to_missing_or_foreign_entries_and_keeps_the_entries(tmp_path):
    cache = CompileCache(tmp_path / "c", max_bytes=1 << 20)
    fill(cache)
    k16 = key(MODEL_A, "16.0")
    for p in files(cache, k16):
        p.unlink()                       # the entry went away behind the index's back
    kb = key(MODEL_B, "16.0")
    hint(cache, SRC_A, kb).mkdir()       # a hint naming an entry of model B
    assert cache.newest(SRC_A, lambda m: True).meta["compiler"] == "edgetpu_compiler 14.0"
    assert not hint(cache, SRC_A, k16).exists()
    assert not hint(cache, SRC_A, kb).exists()
    assert cache.get(kb, source=SRC_B) is not None     # B's entry is left alone
    assert hint(cache, SRC_B, kb).is_dir()


def test_newest_reads_only_the_entries_of_its_model(tmp_path, monkeypatch):
    cache = CompileCache(tmp_path / "c", max_bytes=1 << 20)
    fill(cache)
    assert cache.newest(SRC_B, lambda m: True) is not None

    def no_scan(*args, **kwargs):
        raise AssertionError("newest() walked the whole cache")

    read = []
    real_read_bytes = Path.read_bytes

    def counting(self):
        read.append(self.name)
        return real_read_bytes(self)

    monkeypatch.setattr(CompileCache, "_walk", no_scan)
    monkeypatch.setattr(Path, "read_bytes", counting)
    assert cache.newest(SRC_B, lambda m: True).meta["source"] == SRC_B
    kb = key(MODEL_B, "16.0")
    assert sorted(read) == sorted([f"{kb}.json", f"{kb}.bin"])


def test_entries_written_without_the_index_are_indexed_once(tmp_path):
    cache = CompileCache(tmp_path / "c", max_bytes=1 << 20)
    fill(cache)
    index = cache.path / "by-source"
    for p in sorted(index.rglob("*"), key=lambda p: -len(p.parts)):
        p.rmdir() if p.is_dir() else p.unlink()
    index.rmdir()                        # as a cache written before the index existed
    assert cache.newest(SRC_A, lambda m: True).meta["compiler"] == "edgetpu_compiler 16.0"
    assert (index / "complete").is_file()
    assert hint(cache, SRC_B, key(MODEL_B, "16.0")).is_dir()


def test_evict_and_clear_remove_the_hints_of_what_they_remove(tmp_path):
    cache = CompileCache(tmp_path / "c", max_bytes=1 << 20)
    made = fill(cache)
    total = sum(p.stat().st_size for k in made for p in files(cache, k))
    for k in made:                       # LRU order: model B's entry is the oldest used
        bin_path = files(cache, k)[0]
        t = 5000 if made[k][0] == SRC_A else 10
        os.utime(bin_path, (t, t))
    small = CompileCache(tmp_path / "c", max_bytes=total - 1)
    assert small.evict() == 1
    kb = key(MODEL_B, "16.0")
    assert not hint(cache, SRC_B, kb).exists()
    assert cache.newest(SRC_B, lambda m: True) is None
    assert cache.newest(SRC_A, lambda m: True) is not None
    assert cache.clear() == 3
    assert not (cache.path / "by-source").exists()
    assert stored_files(tmp_path) == []


# -- export / import round trip ----------------------------------------------------------

def test_round_trip_through_the_cli(tmp_path, monkeypatch, capsys):
    src_cache = CompileCache(tmp_path / "here", max_bytes=1 << 20)
    made = fill(src_cache)
    archive = tmp_path / "cache.tgz"
    monkeypatch.setenv("CORALRT_CACHE_DIR", str(tmp_path / "here"))
    assert main(["cache", "export", str(archive)]) == 0
    out = capsys.readouterr().out
    assert out.startswith(f"exported 4 cache entries from {tmp_path / 'here'} to {archive}")
    assert archive.read_bytes()[:2] == b"\x1f\x8b"       # .tgz: gzip-compressed
    with tarfile.open(archive) as tar:
        names = tar.getnames()
        manifest = json.load(tar.extractfile("manifest.json"))
    assert names[0] == "manifest.json" and len(names) == 9
    assert manifest["archive"] == ARCHIVE_NAME and manifest["archive_version"] == ARCHIVE_VERSION
    assert manifest["cache_format"] == CACHE_FORMAT_VERSION
    assert {"coralrt_version", "created", "host", "machine"} <= set(manifest)
    assert manifest["created"].endswith("Z")
    e = next(e for e in manifest["entries"] if e["key"] == key(MODEL_A, "16.0"))
    assert e["source"] == SRC_A and e["size"] == len(made[e["key"]][1])
    assert e["sha256"] == hashlib.sha256(made[e["key"]][1]).hexdigest()
    assert e["description"] == {"compiler": "edgetpu_compiler 16.0", "options": OPTIONS,
                                "segments": 1}

    monkeypatch.setenv("CORALRT_CACHE_DIR", str(tmp_path / "there"))
    assert main(["cache", "import", str(archive), "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert (report["imported"], report["present"], report["failed"]) == (4, 0, 0)
    assert report["archive"]["host"] == manifest["host"]
    there = CompileCache(tmp_path / "there", max_bytes=1 << 20)
    for k, (src, data, created) in made.items():
        entry = there.get(k, source=src)
        assert entry.data == data and entry.meta["created"] == created
        assert entry.meta == src_cache.get(k, source=src).meta
    assert there.newest(SRC_A, lambda m: True).meta["compiler"] == "edgetpu_compiler 16.0"

    assert main(["cache", "import", str(archive)]) == 0      # again: already there
    text = capsys.readouterr().out
    assert text.startswith(f"imported 0 of 4 cache entries from {archive}")
    assert f"on {manifest['host']} ({manifest['machine']})" in text
    assert text.count("present") == 5 and "edgetpu_compiler 16.0" in text


def test_export_only_the_entries_of_the_given_models(tmp_path, monkeypatch, capsys):
    cache = CompileCache(tmp_path / "here", max_bytes=1 << 20)
    fill(cache)
    model_b, unused = tmp_path / "b.tflite", tmp_path / "unused.tflite"
    model_b.write_bytes(MODEL_B)
    unused.write_bytes(b"TFL3 never compiled")
    monkeypatch.setenv("CORALRT_CACHE_DIR", str(tmp_path / "here"))
    archive = tmp_path / "b.tar"
    assert main(["cache", "export", str(archive), str(model_b), str(unused), "--json"]) == 0
    captured = capsys.readouterr()
    result = json.loads(captured.out)
    assert result["count"] == 1 and result["entries"][0]["source"] == SRC_B
    assert "no cache entry was compiled from" in captured.err and "unused.tflite" in captured.err
    assert archive.read_bytes()[257:262] == b"ustar"      # a plain tar
    there = CompileCache(tmp_path / "there", max_bytes=1 << 20)
    report = import_cache(there, archive)
    assert report["imported"] == 1
    assert [e.meta["source"] for e in there.entries()] == [SRC_B]
    assert there.newest(SRC_A, lambda m: True) is None


def test_exporting_nothing_is_an_error(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("CORALRT_CACHE_DIR", str(tmp_path / "empty"))
    archive = tmp_path / "x.tar"
    assert main(["cache", "export", str(archive)]) == 1
    assert "nothing to export" in capsys.readouterr().err
    assert not archive.exists()
    model = tmp_path / "m.tflite"
    model.write_bytes(MODEL_A)
    fill(CompileCache(tmp_path / "empty"))
    other = tmp_path / "other.tflite"
    other.write_bytes(b"another model")
    with pytest.raises(CacheArchiveError, match="given model"):
        export_cache(CompileCache(tmp_path / "empty"), archive,
                     [hashlib.sha256(b"another model").hexdigest()])
    assert not archive.exists() and not list(tmp_path.glob(".x.tar*"))


# -- import refuses what it must ----------------------------------------------------------

class Archive:
    """An archive built member by member from the entries of a real cache."""

    def __init__(self, cache: CompileCache):
        self.entries = []
        self.members: list[tarfile.TarInfo | tuple] = []
        for entry in cache.entries():
            k, src = entry.meta["key"], entry.meta["source"]
            bin_path, json_path = files(cache, k)
            record, data = json_path.read_bytes(), bin_path.read_bytes()
            self.entries.append({
                "key": k, "source": src, "size": len(data),
                "sha256": hashlib.sha256(data).hexdigest(), "record_size": len(record),
                "record_sha256": hashlib.sha256(record).hexdigest(),
                "created": entry.meta["created"], "description": {}})
            self.members += [(f"entries/{k}.json", record), (f"entries/{k}.bin", data)]
        self.manifest = {"archive": ARCHIVE_NAME, "archive_version": ARCHIVE_VERSION,
                         "coralrt_version": "0.0.test", "cache_format": CACHE_FORMAT_VERSION,
                         "created": "2024-05-01T12:00:00Z", "host": "builder",
                         "machine": "x86_64", "entries": self.entries}

    def bytes(self) -> bytes:
        buf = io.BytesIO()
        with tarfile.open(fileobj=buf, mode="w", format=tarfile.GNU_FORMAT) as tar:
            for m in [("manifest.json", json.dumps(self.manifest).encode())] + self.members:
                if isinstance(m, tarfile.TarInfo):
                    tar.addfile(m)
                else:
                    info = tarfile.TarInfo(m[0])
                    info.size = len(m[1])
                    tar.addfile(info, io.BytesIO(m[1]))
        return buf.getvalue()

    def write(self, path: Path) -> Path:
        path.write_bytes(self.bytes())
        return path


@pytest.fixture
def source_cache(tmp_path) -> CompileCache:
    cache = CompileCache(tmp_path / "source", max_bytes=1 << 20)
    fill(cache)
    return cache


@pytest.fixture
def target(tmp_path, monkeypatch) -> CompileCache:
    monkeypatch.setenv("CORALRT_CACHE_DIR", str(tmp_path / "target"))
    return CompileCache(tmp_path / "target", max_bytes=1 << 20)


def refused(path: Path, capsys, *match: str) -> str:
    assert main(["cache", "import", str(path)]) == 1
    err = capsys.readouterr().err
    assert err.startswith("coralrt: error: ") and err.count("\n") == 1, err
    for m in match:
        assert m in err, err
    return err


def test_a_well_formed_hand_made_archive_imports(source_cache, target, tmp_path):
    report = import_cache(target, Archive(source_cache).write(tmp_path / "ok.tar"))
    assert report["imported"] == 4 and report["archive"]["host"] == "builder"
    assert len(list(target.entries())) == 4


def test_unknown_archive_and_cache_format_versions_are_refused(source_cache, target, tmp_path,
                                                               capsys):
    a = Archive(source_cache)
    a.manifest["archive_version"] = 2
    refused(a.write(tmp_path / "v2.tar"), capsys, "archive format version 2",
            f"reads version {ARCHIVE_VERSION}")
    a.manifest["archive_version"] = ARCHIVE_VERSION
    a.manifest["cache_format"] = CACHE_FORMAT_VERSION + 1
    refused(a.write(tmp_path / "f.tar"), capsys,
            f"cache format version {CACHE_FORMAT_VERSION + 1}",
            f"uses cache format version {CACHE_FORMAT_VERSION}")
    a.manifest["cache_format"] = CACHE_FORMAT_VERSION
    a.manifest["archive"] = "something-else"
    refused(a.write(tmp_path / "other.tar"), capsys, "does not describe a coralrt cache archive")
    assert stored_files(tmp_path / "target") == []


@pytest.mark.parametrize("name", ["../evil.bin", "entries/../../evil.bin", "/etc/evil"])
def test_unsafe_member_paths_are_refused(source_cache, target, tmp_path, capsys, name):
    a = Archive(source_cache)
    a.members.insert(2, (name, b"payload"))
    refused(a.write(tmp_path / "bad.tar"), capsys, "unsafe path", repr(name))
    assert stored_files(tmp_path / "target") == []
    assert not (tmp_path / "evil.bin").exists()


@pytest.mark.parametrize("kind", [tarfile.SYMTYPE, tarfile.LNKTYPE, tarfile.CHRTYPE,
                                  tarfile.DIRTYPE])
def test_members_that_are_not_regular_files_are_refused(source_cache, target, tmp_path, capsys,
                                                        kind):
    a = Archive(source_cache)
    name = a.members[1][0]               # the first entry's data, as a link or device
    link = tarfile.TarInfo(name)
    link.type, link.linkname = kind, "/etc/passwd"
    a.members[1] = link
    refused(a.write(tmp_path / "link.tar"), capsys, repr(name), "regular files only")
    assert stored_files(tmp_path / "target") == []


def test_unexpected_duplicate_and_oversized_members_are_refused(source_cache, target, tmp_path,
                                                                 capsys):
    a = Archive(source_cache)
    a.members.append(("notes.txt", b"hello"))
    refused(a.write(tmp_path / "extra.tar"), capsys, "unexpected member 'notes.txt'")
    a = Archive(source_cache)
    a.members.insert(2, a.members[0])
    refused(a.write(tmp_path / "dup.tar"), capsys, "appears twice")
    a = Archive(source_cache)
    name, data = a.members[1]
    a.members[1] = (name, data + b"more than the manifest says")
    refused(a.write(tmp_path / "big.tar"), capsys, name, "the manifest says")
    assert stored_files(tmp_path / "target") == []


def test_an_entry_whose_data_does_not_match_is_skipped_and_the_others_imported(
        source_cache, target, tmp_path, capsys):
    a = Archive(source_cache)
    name, data = a.members[3]            # the second entry's data
    bad_key = name.split("/")[1][:-4]
    a.members[3] = (name, data[:-1] + bytes([data[-1] ^ 1]))   # same size, other bytes
    path = a.write(tmp_path / "one-bad.tar")
    assert main(["cache", "import", str(path)]) == 1
    captured = capsys.readouterr()
    assert "imported 3 of 4 cache entries" in captured.out
    line = next(x for x in captured.out.splitlines() if bad_key[:12] in x)
    assert line.split()[0] == "failed" and "does not match its SHA-256" in line
    assert captured.err.strip() == (f"coralrt: error: 1 of 4 entries of {path} failed "
                                    "verification and were not imported")
    keys = {e.meta["key"] for e in target.entries()}
    assert len(keys) == 3 and bad_key not in keys
    assert not [p for p in (tmp_path / "target").rglob(f"{bad_key}*")]


def test_a_record_that_names_another_entry_is_skipped(source_cache, target, tmp_path):
    a = Archive(source_cache)
    k0, k1 = a.entries[0]["key"], a.entries[1]["key"]
    record = json.loads(a.members[0][1])
    record["key"] = k1                   # hashes updated: only the binding is wrong
    a.members[0] = (a.members[0][0], json.dumps(record).encode())
    a.entries[0].update(record_size=len(a.members[0][1]),
                        record_sha256=hashlib.sha256(a.members[0][1]).hexdigest())
    report = import_cache(target, a.write(tmp_path / "swapped.tar"))
    assert report["failed"] == 1 and report["imported"] == 3
    bad = next(e for e in report["entries"] if e["key"] == k0)
    assert bad["status"] == "failed" and "key" in bad["reason"]
    assert target.get(k0, source=a.entries[0]["source"]) is None


def test_an_entry_larger_than_the_cache_cap_is_skipped(source_cache, tmp_path):
    a = Archive(source_cache)
    biggest = max(e["size"] for e in a.entries)
    small = CompileCache(tmp_path / "small", max_bytes=biggest - 1)
    report = import_cache(small, a.write(tmp_path / "ok.tar"))
    failed = [e for e in report["entries"] if e["status"] == "failed"]
    assert failed and all("size cap" in e["reason"] for e in failed)
    assert not any(small.get(e["key"], source=e["source"]) for e in failed)


@pytest.mark.parametrize("compress", [False, True], ids=["tar", "tar.gz"])
@pytest.mark.parametrize("where", ["middle", "last member", "last header"])
def test_a_truncated_archive_is_refused_whole(source_cache, target, tmp_path, capsys,
                                              compress, where):
    whole = Archive(source_cache).bytes()
    with tarfile.open(fileobj=io.BytesIO(whole)) as tar:
        last = tar.getmembers()[-1]
    cut = {"middle": len(whole) // 2, "last member": last.offset_data + last.size // 2,
           "last header": last.offset}[where]
    whole = whole[:cut]                  # a download that stopped early
    if compress:
        whole = gzip.compress(whole + bytes(10240))[:-20]
    path = tmp_path / "cut.tar"
    path.write_bytes(whole)
    err = refused(path, capsys, str(path))
    assert "truncated" in err.replace(str(path), "")
    assert stored_files(tmp_path / "target") == []


@pytest.mark.parametrize("content", [b"", b"hello, not an archive\n" * 100,
                                     gzip.compress(b"gzip, but no tar inside" * 100),
                                     bytes(range(256)) * 40])
def test_a_file_that_is_not_an_archive_is_refused(target, tmp_path, capsys, content):
    path = tmp_path / "junk.tar"
    path.write_bytes(content)
    with pytest.raises(CacheArchiveError) as info:
        import_cache(target, path)
    assert isinstance(info.value, CoralRTError) and isinstance(info.value, ValueError)
    refused(path, capsys, str(path))
    assert stored_files(tmp_path / "target") == []


def test_a_manifest_that_is_not_first_or_not_json_is_refused(source_cache, target, tmp_path,
                                                             capsys):
    a = Archive(source_cache)
    a.members.insert(0, a.members.pop())
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for name, data in a.members:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    path = tmp_path / "no-manifest.tar"
    path.write_bytes(buf.getvalue())
    refused(path, capsys, "where manifest.json should be")
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        info = tarfile.TarInfo("manifest.json")
        info.size = 9
        tar.addfile(info, io.BytesIO(b"{not json"))
    path.write_bytes(buf.getvalue())
    refused(path, capsys, "manifest.json is not JSON")


def test_import_into_a_disabled_cache_is_refused(source_cache, tmp_path, monkeypatch, capsys):
    path = Archive(source_cache).write(tmp_path / "ok.tar")
    monkeypatch.setenv("CORALRT_CACHE_DIR", str(tmp_path / "off"))
    monkeypatch.setenv("CORALRT_CACHE", "0")
    refused(path, capsys, "disabled")
    assert not (tmp_path / "off").exists()
