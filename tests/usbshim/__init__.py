"""Test tooling: a libusb-1.0 stand-in (the shim_*.c files) that forwards a native
program's USB calls to a simulated stick served by server.py.  See README.md."""
