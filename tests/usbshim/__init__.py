"""Test tooling: a libusb-1.0 stand-in (shim.c) that forwards a native program's USB
calls to a simulated stick served by server.py.  See README.md."""
