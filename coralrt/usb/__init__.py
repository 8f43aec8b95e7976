"""The Coral USB Accelerator driver over pyusb.

This package holds device discovery, firmware download, register bring-up,
bulk framing, DWN1 executables and the simulated stick that tests run the
same driver code against (see docs/architecture.md).
"""
