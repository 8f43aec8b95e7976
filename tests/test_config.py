"""coralrt._config: the runtime, temporary and firmware folders."""

from __future__ import annotations

import os
import stat
import sys
import tempfile
import warnings
from pathlib import Path

import platformdirs
import pytest

from coralrt import _config as config


@pytest.fixture
def env(monkeypatch):
    monkeypatch.delenv(config.RUNTIME_DIR, raising=False)
    return monkeypatch


def test_runtime_dir_from_the_variable_at_call_time(env, tmp_path):
    env.setenv("CORALRT_RUNTIME_DIR", str(tmp_path / "run"))
    assert config.runtime_dir() == tmp_path / "run"
    env.setenv("CORALRT_RUNTIME_DIR", str(tmp_path / "other"))
    assert config.runtime_dir() == tmp_path / "other"
    assert not (tmp_path / "other").exists()  # only named, not created


@pytest.mark.parametrize("value", [None, "", "   "])
def test_runtime_dir_unset_or_empty_is_the_platform_folder(env, value):
    if value is not None:
        env.setenv("CORALRT_RUNTIME_DIR", value)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        expected = Path(platformdirs.user_runtime_dir("coralrt"))
    assert config.runtime_dir() == expected


def test_runtime_dir_silences_the_platformdirs_warning(env, tmp_path, monkeypatch):
    def warns(appname):  # what platformdirs does once when XDG_RUNTIME_DIR is unset
        warnings.warn("XDG_RUNTIME_DIR is not set, falling back", UserWarning, stacklevel=2)
        return str(tmp_path / "fallback" / appname)

    monkeypatch.setattr(platformdirs, "user_runtime_dir", warns)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a warning reaching the caller would raise here
        assert config.runtime_dir() == tmp_path / "fallback" / "coralrt"


def test_runtime_dir_falls_back_to_the_temporary_folder(env, monkeypatch):
    def broken(*args, **kwargs):
        raise RuntimeError("no runtime folder on this platform")

    monkeypatch.setattr(platformdirs, "user_runtime_dir", broken)
    assert config.runtime_dir() == config.temp_runtime_dir()
    env.setenv("CORALRT_RUNTIME_DIR", "/somewhere/else")
    assert config.runtime_dir() == Path("/somewhere/else")  # the variable still wins


@pytest.mark.skipif(not hasattr(os, "getuid"), reason="no user ids on this platform")
def test_temp_runtime_dir():
    assert config.temp_runtime_dir() == Path(tempfile.gettempdir()) / f"coralrt-{os.getuid()}"


def test_firmware_dir_follows_the_user_data_folder(monkeypatch, tmp_path):
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "data"))
    assert config.firmware_dir() == Path(platformdirs.user_data_dir("coralrt")) / "firmware"
    if os.name == "posix" and sys.platform != "darwin":
        assert config.firmware_dir() == tmp_path / "data" / "coralrt" / "firmware"


def test_lock_and_firmware_use_config(env, tmp_path, monkeypatch):
    from coralrt._usb import firmware, lock

    env.setenv("CORALRT_RUNTIME_DIR", str(tmp_path / "run"))
    assert lock.lock_dir() == tmp_path / "run" and (tmp_path / "run").is_dir()
    monkeypatch.setattr(config, "firmware_dir", lambda: tmp_path / "fw")
    assert firmware.installed_path() == tmp_path / "fw" / firmware.FIRMWARE_NAME


def test_lock_dir_falls_back_when_the_runtime_folder_cannot_be_created(env, tmp_path,
                                                                       monkeypatch):
    from coralrt._usb import lock

    blocker = tmp_path / "file"
    blocker.write_text("not a folder")
    env.setenv("CORALRT_RUNTIME_DIR", str(blocker / "run"))
    monkeypatch.setattr(config, "temp_runtime_dir", lambda: tmp_path / "fallback")
    assert lock.lock_dir() == tmp_path / "fallback" and (tmp_path / "fallback").is_dir()


def test_every_variable_is_in_the_table():
    doc = config.__doc__
    names = [getattr(config, n) for n in config.__all__
             if isinstance(getattr(config, n), str) and getattr(config, n).startswith("CORALRT_")]
    assert config.RUNTIME_DIR in names
    for name in names:
        assert f"``{name}``" in doc, name


# -- the per-user lock directory is the user's ---------------------------------------------

posix_owners = pytest.mark.skipif(not hasattr(os, "getuid"), reason="no POSIX owners")


def _mode(path) -> int:
    return stat.S_IMODE(os.lstat(path).st_mode)


@pytest.fixture
def umask022():
    old = os.umask(0o022)          # the usual one: plain mkdir would give 0755
    yield
    os.umask(old)


@posix_owners
def test_lock_dir_and_the_parents_it_creates_are_private(env, tmp_path, umask022):
    from coralrt._usb import lock

    env.setenv(config.RUNTIME_DIR, str(tmp_path / "a" / "b" / "run"))
    assert lock.lock_dir() == tmp_path / "a" / "b" / "run"
    for made in (tmp_path / "a", tmp_path / "a" / "b", tmp_path / "a" / "b" / "run"):
        assert _mode(made) == 0o700, made
    assert _mode(tmp_path) == 0o700                 # what existed is left as it was


@posix_owners
def test_default_and_fallback_lock_dirs_are_private(env, tmp_path, monkeypatch, umask022):
    from coralrt._usb import lock

    # No XDG_RUNTIME_DIR: platformdirs answers <tmp>/runtime-<uid>/coralrt, which
    # coralrt creates, parent included.
    runtime = tmp_path / f"runtime-{os.getuid()}"
    monkeypatch.setattr(platformdirs, "user_runtime_dir", lambda app: str(runtime / app))
    assert lock.lock_dir() == runtime / "coralrt"
    assert _mode(runtime) == _mode(runtime / "coralrt") == 0o700
    # That one cannot be made: <tmp>/coralrt-<uid>, private too.
    blocker = tmp_path / "file"
    blocker.write_text("not a folder")
    monkeypatch.setattr(platformdirs, "user_runtime_dir", lambda app: str(blocker / app))
    monkeypatch.setattr(config, "temp_runtime_dir", lambda: tmp_path / f"coralrt-{os.getuid()}")
    assert lock.lock_dir() == tmp_path / f"coralrt-{os.getuid()}"
    assert _mode(tmp_path / f"coralrt-{os.getuid()}") == 0o700


@posix_owners
@pytest.mark.parametrize("named", [True, False], ids=["CORALRT_RUNTIME_DIR", "default"])
@pytest.mark.parametrize("mode", [0o777, 0o775, 0o757, 0o722, 0o770], ids=oct)
def test_a_lock_dir_others_can_write_to_is_refused(env, tmp_path, monkeypatch, named, mode):
    from coralrt.errors import DeviceError, DevicePermissionError
    from coralrt._usb import lock

    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(mode)
    if named:
        env.setenv(config.RUNTIME_DIR, str(shared))
    else:
        monkeypatch.setattr(config, "runtime_dir", lambda: shared)
    with pytest.raises(DevicePermissionError) as info:
        lock.lock_dir()
    assert isinstance(info.value, DeviceError) and isinstance(info.value, PermissionError)
    text = str(info.value)
    assert str(shared) in text and f"mode {mode:04o}" in text and "owner " in text
    assert "writable by other users" in text and f"chmod 700 {shared}" in text
    assert ("point CORALRT_RUNTIME_DIR at" if named else "set CORALRT_RUNTIME_DIR to") in text
    assert not list(shared.iterdir())               # nothing written there
    assert _mode(shared) == mode                    # nor changed


@posix_owners
@pytest.mark.parametrize("mode", [0o700, 0o755, 0o711], ids=oct)
def test_a_lock_dir_only_the_user_can_write_to_is_used(env, tmp_path, mode):
    from coralrt._usb import lock

    mine = tmp_path / "mine"            # 0755: what coralrt used to create
    mine.mkdir()
    mine.chmod(mode)
    env.setenv(config.RUNTIME_DIR, str(mine))
    assert lock.lock_dir() == mine


@posix_owners
def test_a_lock_dir_owned_by_another_user_is_refused(env, tmp_path, monkeypatch):
    from coralrt.errors import DevicePermissionError
    from coralrt._usb import lock

    theirs = tmp_path / "theirs"
    theirs.mkdir(mode=0o700)
    env.setenv(config.RUNTIME_DIR, str(theirs))
    if os.getuid() == 0:    # root can give it away for real
        os.chown(theirs, 65534, 65534)
        me = 0
    else:                   # else: coralrt runs as someone who is not its owner
        me = os.getuid() + 1
        monkeypatch.setattr(os, "getuid", lambda: me)
    with pytest.raises(DevicePermissionError) as info:
        lock.lock_dir()
    text = str(info.value)
    owner = os.lstat(theirs).st_uid
    assert str(theirs) in text and f"uid {owner}" in text and "mode 0700" in text
    assert "belongs to another user, not to you" in text and f"uid {me}" in text
    assert "remove it" in text and "CORALRT_RUNTIME_DIR" in text


@posix_owners
def test_a_lock_dir_of_the_real_user_is_refused_to_another_uid(env, tmp_path, monkeypatch):
    # The other way round (tests run as root here): the directory belongs to the real
    # user (root), and coralrt runs as uid 1000.
    from coralrt.errors import DevicePermissionError
    from coralrt._usb import lock

    monkeypatch.setattr(os, "getuid", lambda: 1000 if os.geteuid() != 1000 else 1001)
    env.setenv(config.RUNTIME_DIR, str(tmp_path / "run"))
    (tmp_path / "run").mkdir(mode=0o700)
    with pytest.raises(DevicePermissionError, match="belongs to another user"):
        lock.lock_dir()


@posix_owners
@pytest.mark.parametrize("target", ["private dir", "shared dir", "missing"])
def test_a_symlink_at_the_lock_dir_path_is_refused_not_followed(env, tmp_path, target):
    from coralrt.errors import DevicePermissionError
    from coralrt._usb import lock

    there = tmp_path / "there"
    if target != "missing":
        there.mkdir(mode=0o700 if target == "private dir" else 0o777)
    link = tmp_path / "run"
    link.symlink_to(there)
    env.setenv(config.RUNTIME_DIR, str(link))
    with pytest.raises(DevicePermissionError) as info:
        lock.lock_dir()
    text = str(info.value)
    assert "symbolic link" in text and str(link) in text and f"rm {link}" in text
    assert os.path.islink(link)
    assert not there.exists() if target == "missing" else not list(there.iterdir())


@posix_owners
@pytest.mark.parametrize("parent_mode, refused", [(0o777, True), (0o1777, False),
                                                  (0o775, True), (0o755, False)],
                         ids=["0o777", "0o1777", "0o775", "0o755"])
def test_a_lock_dir_in_a_parent_others_can_write_to_is_refused(env, tmp_path, parent_mode,
                                                               refused):
    from coralrt.errors import DevicePermissionError
    from coralrt._usb import lock

    parent = tmp_path / "parent"
    parent.mkdir()
    parent.chmod(parent_mode)       # 1777: like /tmp, others cannot replace our entry
    env.setenv(config.RUNTIME_DIR, str(parent / "run"))
    if refused:
        with pytest.raises(DevicePermissionError, match="where another user can replace it"):
            lock.lock_dir()
    else:
        assert lock.lock_dir() == parent / "run"


@posix_owners
def test_open_device_refuses_an_unsafe_lock_dir_before_touching_the_stick(env, tmp_path):
    from coralrt.errors import DevicePermissionError
    from coralrt.testing import SimulatedBackend
    from coralrt import open_device

    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o777)
    env.setenv(config.RUNTIME_DIR, str(shared))
    b = SimulatedBackend(firmware_loaded=True)
    with pytest.raises(DevicePermissionError, match="writable by other users"):
        open_device(backend=b)
    assert b.devices[0].claimed_by is None and b.devices[0].transfers == 0
    shared.chmod(0o700)
    with open_device(backend=b):
        pass
