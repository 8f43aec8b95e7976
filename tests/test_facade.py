"""The public facade: every name in ``coralrt.__all__`` resolves to its home."""

from __future__ import annotations

import subprocess
import sys

import coralrt


def test_every_public_name_resolves():
    for name in coralrt.__all__:
        assert getattr(coralrt, name) is not None, name
    assert set(coralrt.__all__) <= set(dir(coralrt))


def test_lazy_names_are_the_objects_of_their_homes():
    from coralrt._compile.cache import CompileCache
    from coralrt._runtime.device import EdgeTpuDevice
    from coralrt import list_devices, open_device

    assert coralrt.open_device is open_device and coralrt.list_devices is list_devices
    assert coralrt.EdgeTpuDevice is EdgeTpuDevice and coralrt.CompileCache is CompileCache


def test_importing_coralrt_does_not_load_the_usb_driver_or_the_compiler():
    # The cpu target needs neither; they are imported when a target or a lazy name asks.
    code = ("import sys, coralrt; "
            "print(sorted(m for m in ('coralrt._usb.driver', 'coralrt._compile.jit', "
            "'usb.core') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True).stdout.strip()
    assert out == "[]", out


def test_unknown_attribute_is_an_attribute_error():
    try:
        coralrt.no_such_name  # noqa: B018
    except AttributeError as e:
        assert "no_such_name" in str(e)
    else:
        raise AssertionError("coralrt.no_such_name did not raise")
