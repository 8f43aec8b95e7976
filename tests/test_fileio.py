"""coralrt._fileio.atomic_write: the one way coralrt replaces a file."""

from __future__ import annotations

import os
import stat
import threading
from pathlib import Path

import pytest

from coralrt import _fileio as fileio
from coralrt._fileio import atomic_write, is_temporary


def leftovers(directory: Path) -> list[str]:
    return sorted(p.name for p in directory.iterdir() if is_temporary(p.name))


def test_writes_new_file_and_replaces_existing(tmp_path):
    target = tmp_path / "out.bin"
    atomic_write(target, b"\x00first\xff")
    assert target.read_bytes() == b"\x00first\xff"
    atomic_write(target, b"second, longer than the first")
    assert target.read_bytes() == b"second, longer than the first"
    atomic_write(str(target), bytearray(b"as str path"))  # str paths and bytearray too
    assert target.read_bytes() == b"as str path"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out.bin"]


def test_text_is_utf8_without_newline_translation(tmp_path):
    target = tmp_path / "out.txt"
    atomic_write(target, "pid 7\nµ\r\n")
    assert target.read_bytes() == "pid 7\nµ\r\n".encode("utf-8")
    atomic_write(target, "abc", encoding="utf-16-le")
    assert target.read_bytes() == "abc".encode("utf-16-le")


def test_empty_and_large_data(tmp_path):
    target = tmp_path / "out.bin"
    atomic_write(target, b"")
    assert target.read_bytes() == b""
    big = os.urandom(3 << 20)
    atomic_write(target, memoryview(big))
    assert target.read_bytes() == big


def test_short_writes_are_continued(tmp_path, monkeypatch):
    real_write = os.write
    monkeypatch.setattr(os, "write", lambda fd, b: real_write(fd, bytes(b)[:3]))
    target = tmp_path / "out.bin"
    atomic_write(target, b"0123456789abcdef")
    assert target.read_bytes() == b"0123456789abcdef"


def test_file_is_fsynced_before_the_rename(tmp_path, monkeypatch):
    events = []
    real_fsync, real_replace = os.fsync, os.replace

    def fsync(fd):
        st = os.fstat(fd)
        events.append(("fsync", "dir" if stat.S_ISDIR(st.st_mode) else st.st_size))
        real_fsync(fd)

    def replace(src, dst):
        events.append(("replace", Path(dst).name))
        real_replace(src, dst)

    monkeypatch.setattr(os, "fsync", fsync)
    monkeypatch.setattr(os, "replace", replace)
    atomic_write(tmp_path / "out.bin", b"12345")
    # the regular file (holding all 5 bytes) first, then the rename, then the folder
    assert events[:2] == [("fsync", 5), ("replace", "out.bin")]
    if os.name == "posix":
        assert events[2:] == [("fsync", "dir")]


@pytest.mark.parametrize("failing", ["write", "fsync", "replace"])
def test_failure_leaves_no_temporary_and_target_untouched(tmp_path, monkeypatch, failing):
    target = tmp_path / "out.bin"
    target.write_bytes(b"old")

    def boom(*args):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, failing, boom)
    with pytest.raises(OSError, match="No space left"):
        atomic_write(target, b"new content")
    monkeypatch.undo()
    assert target.read_bytes() == b"old"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out.bin"]


def test_interrupt_leaves_no_temporary(tmp_path, monkeypatch):
    def interrupted(fd):
        raise KeyboardInterrupt

    monkeypatch.setattr(os, "fsync", interrupted)
    with pytest.raises(KeyboardInterrupt):
        atomic_write(tmp_path / "out.bin", b"data")
    monkeypatch.undo()
    assert list(tmp_path.iterdir()) == []


def test_unencodable_text_creates_nothing(tmp_path):
    with pytest.raises(UnicodeEncodeError):
        atomic_write(tmp_path / "out.txt", "snow \u2603", encoding="ascii")
    assert list(tmp_path.iterdir()) == []


def test_temporary_is_created_in_the_targets_folder(tmp_path, monkeypatch):
    created = []
    real_open = os.open

    def spy(path, flags, *args, **kwargs):
        if flags & os.O_CREAT:
            created.append((Path(path), flags))
        return real_open(path, flags, *args, **kwargs)

    monkeypatch.setattr(os, "open", spy)
    sub = tmp_path / "deep" / "er"
    sub.mkdir(parents=True)
    atomic_write(sub / "out.bin", b"x")
    assert len(created) == 1
    tmp, flags = created[0]
    assert tmp.parent == sub and is_temporary(tmp.name) and "out.bin" in tmp.name
    assert flags & os.O_EXCL  # never opens an existing file (or a symlink) there
    if hasattr(os, "O_NOFOLLOW"):
        assert flags & os.O_NOFOLLOW


def test_temporary_names_are_unpredictable(tmp_path, monkeypatch):
    names = []
    real_replace = os.replace
    monkeypatch.setattr(os, "replace",
                        lambda src, dst: (names.append(Path(src).name), real_replace(src, dst)))
    for _ in range(5):
        atomic_write(tmp_path / "out.bin", b"x")
    assert len(set(names)) == 5  # not derived from the pid or the target name alone


@pytest.mark.skipif(not hasattr(os, "symlink"), reason="no symlinks on this platform")
def test_a_planted_symlink_at_the_temporary_name_is_not_followed(tmp_path, monkeypatch):
    victim = tmp_path / "victim"
    victim.write_bytes(b"precious")
    planted = tmp_path / ".out.bin.0000000000000000.tmp"
    planted.symlink_to(victim)
    tokens = iter(["0000000000000000", "1111111111111111"])  # the first name is taken
    monkeypatch.setattr(fileio.secrets, "token_hex", lambda n: next(tokens))
    atomic_write(tmp_path / "out.bin", b"new")
    assert victim.read_bytes() == b"precious"
    assert planted.is_symlink()
    assert (tmp_path / "out.bin").read_bytes() == b"new"


@pytest.mark.skipif(not hasattr(os, "symlink"), reason="no symlinks on this platform")
def test_a_symlink_at_the_target_is_replaced_not_written_through(tmp_path):
    victim = tmp_path / "elsewhere" / "victim"
    victim.parent.mkdir()
    victim.write_bytes(b"precious")
    target = tmp_path / "out.bin"
    target.symlink_to(victim)
    atomic_write(target, b"new")
    assert not target.is_symlink() and target.is_file()
    assert target.read_bytes() == b"new"
    assert victim.read_bytes() == b"precious"


def test_missing_folder_is_an_error(tmp_path):
    with pytest.raises(FileNotFoundError):
        atomic_write(tmp_path / "absent" / "out.bin", b"x")
    assert list(tmp_path.iterdir()) == []


@pytest.mark.skipif(os.name != "posix", reason="POSIX permission bits")
def test_mode_is_reduced_by_the_umask(tmp_path):
    old = os.umask(0o027)
    try:
        atomic_write(tmp_path / "shared", b"x")
        atomic_write(tmp_path / "private", b"x", mode=0o600)
    finally:
        os.umask(old)
    assert stat.S_IMODE((tmp_path / "shared").stat().st_mode) == 0o640
    assert stat.S_IMODE((tmp_path / "private").stat().st_mode) == 0o600


def test_concurrent_writers_leave_one_complete_version(tmp_path):
    target = tmp_path / "out.bin"
    versions = [bytes([i]) * (256 * 1024 + i) for i in range(8)]
    start = threading.Barrier(len(versions))
    errors = []

    def writer(data):
        try:
            start.wait()
            for _ in range(5):
                atomic_write(target, data)
        except BaseException as e:  # noqa: BLE001 - reported below
            errors.append(e)

    seen = []
    done = threading.Event()

    def reader():
        while not done.is_set():
            try:
                seen.append(target.read_bytes())
            except FileNotFoundError:
                pass  # before the first rename

    threads = [threading.Thread(target=writer, args=(v,)) for v in versions]
    watcher = threading.Thread(target=reader)
    watcher.start()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    done.set()
    watcher.join()
    assert errors == []
    assert all(data in versions for data in seen)  # never a torn or mixed read
    assert target.read_bytes() in versions
    assert leftovers(tmp_path) == []
