"""What the project knows about one operator: :class:`OpSpec`.

A spec is data.  Its fields, by the part of coralrt that reads them:

- validation (``coralrt._model.validate``): ``min_inputs``, ``optional_inputs``,
  ``only_with``, ``count_options`` (options that must equal the number of
  inputs or outputs) and ``validate``, the operator's structural check
  ``(sg, op, where)`` from :mod:`coralrt._model.op_checks` (named
  ``"module:name"`` like a kernel: op_checks reads the specs, so the specs
  do not import it); ``quant_check``, the check ``(sg, op, where, types)`` of
  the quantization parameters that make LiteRT's kernel abort
  (:mod:`coralrt._model.quant_checks`, :mod:`coralrt._model.xnnpack_checks`);
  ``output_type_from``, the type LiteRT's kernel gives output 0 while it
  prepares, whatever the file says (an input position whose type it takes,
  or a type name such as ``"BOOL"``; the quantization checks of later
  operators see that type); ``padded_rank_aborts``, for a broadcasting
  operator whose kernel compares its inputs' shapes padded to one rank
  first (so shapes equal up to leading 1s run at any rank), the input types
  for which it aborts above rank 8 all the same (None: the kernel does not
  pad, every broadcast above rank 8 aborts; see
  :func:`coralrt._model.op_checks.broadcast_rank`); ``io_check``, the check
  ``(sg, op, where, types)`` that an output has the type the kernel writes it
  with (:mod:`coralrt._model.io_checks`: kernels that copy or compute with
  the input's type into the output's buffer; named ``"module:name"`` like
  ``validate``).
  None means "not checked" (custom operators, builtins LiteRT has no kernel
  for).
- the Edge TPU (``coralrt._compile.rules``, ``compat_rules``): ``tpu``, the
  :class:`OpSupport` of the published operator table (None: the Edge TPU has
  no such operator; ``tpu_refusal`` then says why it stays on the CPU),
  ``compat`` (a rule compat mode adds: what edgetpu_compiler maps beyond the
  table) and ``compat_checks`` (checks compat mode adds to ``tpu``).
- cost (``coralrt._compile.costs``, ``coralrt._sim.latency``): ``macs``, the
  multiply-accumulate formula (None: one per element), and ``latency_class``
  (``"conv"``, ``"depthwise"`` or ``"other"``: how well the systolic array
  is used).
- kernels: ``sim``, the simulated Edge TPU's kernel factory
  ``factory(OpContext) -> run(inputs)`` (a *sim kernel*), with
  ``sim_compiled`` the slot for a compiled variant; and the NumPy CPU
  backend's factories of the same form: ``numpy_float`` (float tensors),
  ``numpy_wide_int`` (plain int32/int64 tensors), ``numpy_any`` (any type,
  picked first) and ``numpy_8bit`` (8-bit tensors the simulated Edge TPU
  has no kernel for).  The CPU kernels of plugins (``fn(inputs, OpInfo)``,
  :data:`coralrt.plugins._registry.CpuKernel`) are another thing: whole-step
  kernels outside any segment.
- facts other parts look up by operator: ``calls_subgraphs`` (control flow:
  the operator runs other subgraphs of the model; the NumPy backend refuses
  it), ``output_takes_input_type`` (LiteRT's Prepare gives the output the
  type of its two inputs whatever the file says, and the NumPy backend does
  the same) and ``gelu_path`` (an element-wise or reshaping step the
  layer-width rule looks through for a GELU, :func:`coralrt._ops.width.feeds_gelu`).
  :func:`coralrt._ops.operators_with` gives the operators that set one.

A kernel slot holds a callable or a :class:`KernelRef` (``"module:attribute"``),
imported the first time a table is built: the specs stay cheap to import
(``import coralrt`` reads them for validation) while the kernel libraries
(``coralrt._sim.kernels``, ``coralrt._backends``) sit in layers above this one.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from coralrt._ops.checks import GENERIC_CHECKS, Check

__all__ = ["OpSpec", "OpSupport", "KernelRef", "DEFAULT_ACTIVATIONS", "NO_ACTIVATION",
           "resolve"]

DEFAULT_ACTIVATIONS = frozenset({"NONE", "RELU", "RELU6", "RELU_N1_TO_1"})
NO_ACTIVATION = frozenset({"NONE"})


@dataclass
class OpSupport:
    """An Edge TPU support rule: the highest version the Edge TPU runs, the fused
    activations it accepts, the operator's own checks and the generic ones."""

    max_version: int
    checks: tuple[Check, ...] = ()
    activations: frozenset = DEFAULT_ACTIVATIONS
    generic: tuple[Check, ...] = GENERIC_CHECKS


@dataclass(frozen=True)
class KernelRef:
    """A kernel named by ``"package.module:attribute"``, imported on first use."""

    target: str

    def load(self) -> Callable:
        module, _, attr = self.target.partition(":")
        return getattr(importlib.import_module(module), attr)


def resolve(kernel) -> Callable | None:
    """The callable behind a kernel slot (None stays None)."""
    return kernel.load() if isinstance(kernel, KernelRef) else kernel


def _ref(kernel):
    return KernelRef(kernel) if isinstance(kernel, str) else kernel


@dataclass(frozen=True)
class OpSpec:
    """One operator: see the module docstring for what each field is for.
    Kernel slots and ``validate`` take a callable, a :class:`KernelRef` or its string."""

    name: str
    custom: bool = False                  # a custom operator (by its custom code)
    # validation
    min_inputs: int | None = None
    optional_inputs: frozenset[int] | None = None
    only_with: Mapping[int, tuple[tuple[int, ...], ...]] = field(default_factory=dict)
    count_options: tuple[tuple[str, str], ...] | None = None  # (option, "inputs"/"outputs")
    validate: object = None               # (sg, op, where) -> None, raises ModelError
    quant_check: Callable | None = None   # (sg, op, where, types) -> None, raises ModelError
    output_type_from: int | str | None = None   # input position, or a type name
    padded_rank_aborts: tuple[str, ...] | None = None   # input types (see above)
    io_check: object = None               # (sg, op, where, types) -> None, raises ModelError
    # the Edge TPU
    tpu: OpSupport | None = None
    tpu_refusal: Callable | None = None   # (OpView) -> why it stays on the CPU
    compat: OpSupport | None = None
    compat_checks: tuple[Check, ...] = ()
    # cost
    macs: Callable | None = None          # (options, inputs, outputs) -> int
    latency_class: str = "other"
    # kernels
    sim: object = None
    sim_compiled: object = None           # reserved: a compiled variant of ``sim``
    numpy_float: object = None
    numpy_wide_int: object = None
    numpy_any: object = None
    numpy_8bit: object = None
    # facts looked up by operator (flags)
    calls_subgraphs: bool = False
    output_takes_input_type: bool = False
    gelu_path: bool = False

    def __post_init__(self) -> None:
        for slot in ("validate", "io_check", "sim", "sim_compiled", "numpy_float",
                     "numpy_wide_int", "numpy_any", "numpy_8bit"):
            object.__setattr__(self, slot, _ref(getattr(self, slot)))
        if self.optional_inputs is not None:
            object.__setattr__(self, "optional_inputs", frozenset(self.optional_inputs))
