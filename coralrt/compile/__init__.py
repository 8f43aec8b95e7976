"""Turning a plain model into Edge TPU segments.

The Edge TPU operator-support rules (``rules.py``, the table and its
registry; ``checks.py``, the checks they apply), the partitioner and its
cost model (``partition.py``, ``costs.py``), the generic compile driver
(``driver.py``), the native compiler (``native.py``), the edgetpu_compiler plugin (``edgetpu_compiler.py``), the
on-disk compile cache (``cache.py``; ``cache_format.py``, its keys, records and
checksums; ``digest.py``) and the just-in-time front (``jit.py``).  Nothing in it is used by the ``cpu`` target.

May import: errors, config, model, tensors, formats.
"""
