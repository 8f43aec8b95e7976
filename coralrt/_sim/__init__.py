"""The simulated Edge TPU.

``kernels/`` holds the bit-exact integer kernels (TFLite's reference
semantics), ``runner.py`` runs a native segment with them, ``latency.py``
estimates what a real USB Accelerator would take.  ``stick/`` is the
simulated Coral USB Accelerator: a pyusb backend that the real driver talks
to, in a layer of its own above ``usb``.
"""
