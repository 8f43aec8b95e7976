"""A cache entry holds what was compiled from its own source model, not another's.

An archive's digests and an entry's CRC-32 prove the bytes arrived as they
were written, not what they were compiled from.  Here a "forger" puts the
compiled data of model B under model A's key and recomputes every digest
and checksum; ``coralrt cache import`` must refuse the entry, and a load of
A must not run B when such an entry is in the cache anyway (written by hand,
or imported by a coralrt that did not check): it is treated like a corrupt
entry, removed and compiled again.  Real models compiled just in time
(target ``sim``), real archives.
"""

from __future__ import annotations

import hashlib
import io
import json
import logging
import tarfile
import zlib

import pytest
from conftest import shared_model

from coralrt import InferenceSession
from coralrt._cli.main import main
from coralrt._compile.cache import CompileCache
from coralrt._compile.cache_archive import export_cache
from coralrt._compile.cache_format import checksum
from coralrt._compile.cache_import import import_cache
from coralrt._compile.jit import jit_compile, jit_lookup
from coralrt._model import load_model

A, B = "mobilenet_v1_0.25_128_quant.tflite", "split_concat.tflite"
RECORD_FIELD = "source_io"       # where a record keeps its source model's interface


def interface(session: InferenceSession) -> tuple:
    return ([(tuple(t.shape), str(t.dtype)) for t in session.get_inputs()],
            [(tuple(t.shape), str(t.dtype)) for t in session.get_outputs()])


def compile_both(cache: CompileCache, compile) -> tuple:
    """``(cache, entry of A, entry of B)`` after ``compile(model path)`` (which
    returns the cache key) of A and B."""
    entries = {}
    for name in (A, B):
        key = compile(shared_model(name))
        entries[name] = next(e for e in cache.entries() if e.meta["key"] == key)
    return cache, entries[A], entries[B]


@pytest.fixture
def built(tmp_path):
    """A cache holding the sessions' compiles of A and B on target sim."""
    cache = CompileCache(tmp_path / "built", max_bytes=1 << 30)
    return compile_both(cache, lambda path: InferenceSession(
        path, target="sim", cache=cache).compile_info["key"])


def forged_record(entry_a, data_b: bytes, **changes) -> dict:
    """A's record describing B's data: size and CRC-32 recomputed, as a forger would."""
    meta = dict(entry_a.meta, **changes)
    meta["size"] = len(data_b)
    meta["crc32"] = checksum(meta["key"], meta["source"], zlib.crc32(data_b))
    return meta


def rewrite_archive(path, replace: dict[str, bytes]) -> None:
    """Replace members of the archive at ``path`` and recompute the manifest's digests."""
    with tarfile.open(path) as tar:
        members = [(m.name, tar.extractfile(m).read()) for m in tar.getmembers()]
    members = [(n, replace.get(n, d)) for n, d in members]
    manifest = json.loads(members[0][1])
    for e in manifest["entries"]:
        content = dict(members)
        record, data = content[f"entries/{e['key']}.json"], content[f"entries/{e['key']}.bin"]
        e.update(size=len(data), sha256=hashlib.sha256(data).hexdigest(),
                 record_size=len(record), record_sha256=hashlib.sha256(record).hexdigest())
    members[0] = ("manifest.json", json.dumps(manifest).encode())
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz", format=tarfile.USTAR_FORMAT) as tar:
        for name, data in members:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    path.write_bytes(buf.getvalue())


def test_the_record_carries_the_source_models_interface(built):
    from coralrt._compile.cache_origin import model_io, read_io
    _, entry_a, entry_b = built
    want = model_io(load_model(shared_model(A)))
    assert entry_a.meta[RECORD_FIELD] == want
    assert read_io(entry_a.data) == want == model_io(load_model(entry_a.data))
    assert read_io(entry_b.data) != want


def test_a_forged_entry_is_refused_at_import(built, tmp_path, monkeypatch, capsys):
    cache, entry_a, entry_b = built
    archive = tmp_path / "forged.tar.gz"
    export_cache(cache, archive, [entry_a.meta["source"]])
    key = entry_a.meta["key"]
    record = json.dumps(forged_record(entry_a, entry_b.data), sort_keys=True,
                        separators=(",", ":")).encode()
    rewrite_archive(archive, {f"entries/{key}.bin": entry_b.data,
                              f"entries/{key}.json": record})
    target = tmp_path / "target"
    monkeypatch.setenv("CORALRT_CACHE_DIR", str(target))
    assert main(["cache", "import", str(archive)]) == 1
    captured = capsys.readouterr()
    line = next(x for x in captured.out.splitlines() if key[:12] in x)
    assert line.split()[0] == "failed", captured.out
    assert "does not belong to its source model" in line and "input" in line, line
    assert "1 of 1 entries" in captured.err and "not imported" in captured.err
    report = import_cache(CompileCache(target), archive)
    bad = report["entries"][0]
    assert bad["key"] == key and bad["status"] == "failed"
    assert "has 3 inputs" in bad["reason"] or "input 0" in bad["reason"], bad["reason"]
    assert list(CompileCache(target).entries()) == []


def test_a_forged_entry_in_the_cache_is_discarded_at_load(built, tmp_path, caplog):
    """The forger also wrote B's interface into the record (import cannot tell
    then): the load compares with the source model itself."""
    _, entry_a, entry_b = built
    cache = CompileCache(tmp_path / "poisoned", max_bytes=1 << 30)
    meta = {k: v for k, v in entry_a.meta.items()
            if k not in ("key", "source", "size", "crc32", "created", "format")}
    if RECORD_FIELD in entry_b.meta:
        meta[RECORD_FIELD] = entry_b.meta[RECORD_FIELD]
    key, source = entry_a.meta["key"], entry_a.meta["source"]
    cache.put(key, entry_b.data, meta, source=source)
    assert cache.get(key, source=source).data == entry_b.data     # the cache's checks pass
    with caplog.at_level(logging.WARNING, logger="coralrt.cache"):
        session = InferenceSession(shared_model(A), target="sim", cache=cache)
    assert interface(session) == interface(InferenceSession(shared_model(A), target="cpu"))
    assert interface(session) != interface(InferenceSession(shared_model(B), target="cpu"))
    assert session.compile_info["cache_hit"] is False               # compiled again
    assert "corrupt cache entry" in caplog.text
    assert "not compiled from this model" in caplog.text
    assert cache.get(key, source=source).data == entry_a.data        # the right one now


def test_a_forged_entry_is_not_served_without_a_compiler(tmp_path, caplog):
    """jit_lookup (a machine without a compiler) checks the same way: no entry
    rather than another model's."""
    built = CompileCache(tmp_path / "built", max_bytes=1 << 30)
    _, entry_a, entry_b = compile_both(
        built, lambda path: jit_compile(path, cache=built).compile_info["key"])
    cache = CompileCache(tmp_path / "poisoned", max_bytes=1 << 30)
    meta = {k: v for k, v in entry_a.meta.items()
            if k not in ("key", "source", "size", "crc32", "created", "format")}
    meta.update(device_kinds=["coral"])
    meta.pop(RECORD_FIELD, None)               # as an entry written before the field existed
    key, source = entry_a.meta["key"], entry_a.meta["source"]
    cache.put(key, entry_b.data, meta, source=source)
    with caplog.at_level(logging.WARNING, logger="coralrt.cache"):
        assert jit_lookup(shared_model(A), device_kind="coral", cache=cache) is None
    assert "not compiled from this model" in caplog.text
    assert cache.get(key, source=source) is None
    cache.put(key, entry_a.data, meta, source=source)                # the genuine entry
    found = jit_lookup(shared_model(A), device_kind="coral", cache=cache)
    assert found is not None and found.compile_info["cache_hit"] is True


@pytest.mark.parametrize("name", ["mobilenet_v1_0.25_128_quant.tflite", "split_concat.tflite",
                                  "multi_signatures.tflite", "keras_lstm_mnist_ptq.tflite",
                                  "ssd_mobilenet_v1_coco_quant_postprocess_head_layers.tflite",
                                  "add_float.tflite"])
def test_genuine_entries_import_and_load_as_cache_hits(tmp_path, name, caplog):
    """No false rejection: real compiles (default rewrites) round-trip through an
    archive and load from the cache on the other side."""
    here = CompileCache(tmp_path / "here", max_bytes=1 << 30)
    first = InferenceSession(shared_model(name), target="sim", cache=here)
    assert first.compile_info["cache_hit"] is False
    export_cache(here, tmp_path / "a.tar.gz")
    there = CompileCache(tmp_path / "there", max_bytes=1 << 30)
    report = import_cache(there, tmp_path / "a.tar.gz")
    assert report["failed"] == 0 and report["imported"] == 1, report
    with caplog.at_level(logging.WARNING, logger="coralrt.cache"):
        second = InferenceSession(shared_model(name), target="sim", cache=there)
    assert second.compile_info["cache_hit"] is True, caplog.text
    assert "corrupt" not in caplog.text
    assert interface(second) == interface(first)
