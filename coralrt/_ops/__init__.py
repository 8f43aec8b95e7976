"""One home per operator: a spec (:class:`OpSpec`) for every operator coralrt knows.

Each family module of this package (``conv``, ``pool``, ``elementwise``,
``activations``, ``shape``, ``reduce``, ``resize``, ``lstm``, ``detect``,
``control``)
defines ``SPECS``, a tuple of :class:`OpSpec`: the Edge TPU support and
compat rules, the cost formula and latency class, the simulator's and the
NumPy backend's kernels, validation.  :mod:`coralrt._ops.litert` adds LiteRT's
facts about the inputs of every builtin (most of which coralrt has no kernel
for).  Every family module found here is read; nothing lists them.

The tables the rest of coralrt uses are derived from these specs, each in
its own layer: the validation tables (``coralrt._model.optional_inputs``,
``coralrt._model.validate``, the quantization checks and output types of
``coralrt._model.quant_checks``, the broadcast exemptions of
``coralrt._model.op_checks``), the Edge TPU rules (``coralrt._compile.rules``,
``compat_rules``), the cost model (``coralrt._compile.costs``), the latency
classes (``coralrt._sim.latency``), the simulator's kernels
(``coralrt._sim.kernels.kernel_for``) and the NumPy backend's dispatch
(``coralrt._backends.numpy_backend``).  coralrt's plugin registers the specs
through ``coralrt_register_ops`` like any plugin (``coralrt/plugins/_builtins.py``),
so a third-party operator wins over a built-in one by the one precedence rule
of ``coralrt/plugins/_registry.py``.

Layering: this package sits in the layer of ``coralrt._model`` (``tests/test_layers.py``), because
validation reads it at load time, below everything else that reads it.  It
imports only errors, model and its subpackage :mod:`coralrt._ops.arith`
(a layer lower: the fixed-point and requantization helpers, working arrays and
row bands kernels share).  A new operator's kernels (sim and NumPy) are
written in its family file with those helpers; the existing kernels mostly
live in the kernel libraries of the layers above (``coralrt/_sim/kernels``,
``coralrt/_backends``), and a spec names them with a :class:`KernelRef`
(``"module:name"``) that the layer running the kernel imports when it
builds its table, so ``import coralrt`` reads the specs without importing
those libraries.  See CONTRIBUTING.md for adding an operator.
"""

from __future__ import annotations

import importlib
import pkgutil
from dataclasses import replace
from functools import lru_cache

from coralrt._ops.spec import DEFAULT_ACTIVATIONS, NO_ACTIVATION, KernelRef, OpSpec, OpSupport, \
    resolve

__all__ = ["OpSpec", "OpSupport", "KernelRef", "DEFAULT_ACTIVATIONS", "NO_ACTIVATION",
           "builtin_specs", "operator_table", "operators_with", "kernel_table", "family_of",
           "resolve"]

# Modules of this package that hold no specs.
_NOT_FAMILIES = frozenset({"spec", "checks", "width", "fused", "litert", "doc_tables",
                           "arith"})


def _families() -> list[str]:
    return sorted(m.name for m in pkgutil.iter_modules(__path__)
                  if m.name not in _NOT_FAMILIES and not m.name.startswith("_"))


@lru_cache(maxsize=1)
def _built() -> tuple[dict[str, OpSpec], dict[str, str]]:
    from coralrt._ops.litert import validation_facts
    specs: dict[str, OpSpec] = {}
    families: dict[str, str] = {}
    for family in _families():
        for spec in importlib.import_module(f"{__name__}.{family}").SPECS:
            if spec.name in specs:
                raise RuntimeError(f"operator {spec.name} has two specs ({families[spec.name]} "
                                   f"and {family})")
            specs[spec.name] = spec
            families[spec.name] = family
    for name, facts in validation_facts().items():
        spec = specs.get(name)
        if spec is None:
            specs[name] = OpSpec(name, **facts)
            families[name] = "litert"
        else:   # what the family file sets itself wins
            unset = {k: v for k, v in facts.items()
                     if getattr(spec, k) in (None, {}) and v is not None}
            specs[name] = replace(spec, **unset)
    return specs, families


def builtin_specs() -> dict[str, OpSpec]:
    """Operator name -> the built-in spec (built once; treat as read-only)."""
    return _built()[0]


def family_of(name: str) -> str | None:
    """The module of this package that holds the spec of ``name``."""
    return _built()[1].get(name)


@lru_cache(maxsize=None)
def operator_table(field: str) -> dict:
    """Operator name -> the value of spec ``field`` for every built-in spec that
    sets it (not None, not empty).  Kernel slots come back unresolved: see
    :func:`kernel_table`."""
    return {name: getattr(spec, field) for name, spec in builtin_specs().items()
            if getattr(spec, field) not in (None, (), {})}


@lru_cache(maxsize=None)
def operators_with(flag: str) -> frozenset[str]:
    """The built-in operators whose spec sets the boolean field ``flag``
    (``"calls_subgraphs"``, ...)."""
    return frozenset(name for name, spec in builtin_specs().items() if getattr(spec, flag))


def kernel_table(slot: str) -> dict:
    """Operator name -> the kernel factory in ``slot`` (``"sim"``, ``"numpy_float"``,
    ...), imported.  Call it from the layer that runs the kernels, once."""
    return {name: resolve(kernel) for name, kernel in operator_table(slot).items()}
