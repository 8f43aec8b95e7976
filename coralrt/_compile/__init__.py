"""Turning a plain model into Edge TPU segments.

The Edge TPU operator-support rules (``rules.py``, the table and its
registry; ``checks.py``, the checks they apply), the partitioner and its
cost model (``partition.py``, ``costs.py``), the segment loop that drives any
segment compiler (``segments.py``), the compiler contract (``base.py``), the segment compilers: the native one (``native.py``),
edgetpu_compiler (``edgetpu_compiler.py``, run natively or under an x86-64
emulator, ``emulation.py``; whole-model runs in ``whole.py``) and a compile
service (``remote.py``); the on-disk compile cache (``cache.py``;
``cache_format.py``, its keys, records and checksums; ``cache_index.py``,
its index by source model; ``cache_upkeep.py``, eviction and clearing;
``cache_archive.py`` and ``cache_import.py``, export and import;
``digest.py``) and the just-in-time front (``jit.py``).  Nothing in it is
used by the ``cpu`` target.
"""
