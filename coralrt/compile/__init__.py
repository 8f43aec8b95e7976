"""Turning a plain model into Edge TPU segments.

This package holds the Edge TPU operator-support rules, the partitioner, the
cost and memory model, the native segment format, the edgetpu_compiler
wrapper and the on-disk compile cache (see docs/architecture.md).  Nothing in
it is used by the ``cpu`` target.
"""
