"""The plugin contract and the executor.

This package holds the pluggy hook specifications (``hookspecs.py``), the
plugin manager, the operator registry and the executor that walks a compiled
program's steps (see docs/architecture.md).
"""
