"""coralrt.config: the runtime, temporary and firmware folders."""

from __future__ import annotations

import os
import sys
import tempfile
import warnings
from pathlib import Path

import platformdirs
import pytest

from coralrt import config


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
    from coralrt.usb import firmware, lock

    env.setenv("CORALRT_RUNTIME_DIR", str(tmp_path / "run"))
    assert lock.lock_dir() == tmp_path / "run" and (tmp_path / "run").is_dir()
    monkeypatch.setattr(config, "firmware_dir", lambda: tmp_path / "fw")
    assert firmware.installed_path() == tmp_path / "fw" / firmware.FIRMWARE_NAME


def test_lock_dir_falls_back_when_the_runtime_folder_cannot_be_created(env, tmp_path,
                                                                       monkeypatch):
    from coralrt.usb import lock

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
