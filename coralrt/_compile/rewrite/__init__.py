"""The rewrite stage: graph-to-graph passes that run before partitioning so more
operators map to the Edge TPU (docs/rewrites.md).

:mod:`~coralrt._compile.rewrite.base` holds the contract and the runner,
:mod:`~coralrt._compile.rewrite.graph` the editor passes work through; the
built-in passes are modules of this package, registered as plugins through
``coralrt_register_rewrites`` (``coralrt/plugins/_builtins.py``).
"""

from coralrt._compile.rewrite.base import (
    SPECS, Rewrite, RewriteRecord, RewriteResult, cache_options, run_rewrites, select_rewrites,
)
from coralrt._compile.rewrite.graph import GraphEditor

__all__ = ["SPECS", "Rewrite", "RewriteRecord", "RewriteResult", "GraphEditor",
           "cache_options", "run_rewrites", "select_rewrites"]
