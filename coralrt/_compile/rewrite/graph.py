"""Editing a model's main subgraph for the rewrite stage: look-ups (who
produces and who reads a tensor, constants, quantization), new tensors and
operators, and replacing operators by others.

    editor = GraphEditor(model)            # works on a copy; ``model`` stays as it is
    for i, op in editor.each("FULLY_CONNECTED"):
        ...
        editor.replace([i], [editor.make_op("CONV_2D", [x, w, b], [y], padding="VALID")])
    editor.commit()                        # applies the replacements, in one go
    new_model = editor.model

Replacements are queued and applied by :meth:`GraphEditor.commit` (the
runner commits after every rewrite), so indices stay those of the model the
rewrite started from while it works.  New operators take the place of the
last operator they replace; the subgraph is re-sorted topologically if that
is not enough, and tensors nothing uses any more are dropped with their
buffers.
"""

from __future__ import annotations

import copy

import numpy as np

from coralrt.errors import ModelError
from coralrt._model.builder import make_operator, make_tensor
from coralrt._model.types import Model, Operator, Subgraph, Tensor

__all__ = ["GraphEditor"]


class GraphEditor:
    """A copy of ``model`` whose main subgraph a rewrite edits (see the module doc)."""

    def __init__(self, model: Model, *, rules=None):
        sg = model.main
        ops = []
        for op in sg.operators:
            new = copy.copy(op)
            new.inputs, new.outputs = list(op.inputs), list(op.outputs)
            new.intermediates, new.options = list(op.intermediates), dict(op.options)
            ops.append(new)
        main = Subgraph(tensors=[copy.copy(t) for t in sg.tensors], operators=ops,
                        inputs=list(sg.inputs), outputs=list(sg.outputs), name=sg.name)
        self.model = copy.copy(model)
        self.model.subgraphs = [main, *model.subgraphs[1:]]
        self.model.signatures = [copy.copy(s) for s in model.signatures]
        self.model.buffers = list(model.buffers)
        self.model.metadata_buffer = list(model.metadata_buffer)
        self.model.source = None            # the bytes no longer describe it
        self.rules = rules
        self.current = None                 # the rewrite running (set by the runner)
        #: per operator of the current model: the index, in the model as given, of
        #: the operator it is or replaces (None: made for a replaced group)
        self.origin: list[int | None] = list(range(len(ops)))
        #: per operator: True if a rewrite made it
        self.made: list[bool] = [False] * len(ops)
        self._given = [op.name for op in ops]
        self._queue: list[tuple[list[int], list[Operator]]] = []
        self._names: set[str] = {t.name for t in main.tensors}
        self._mark = len(main.tensors)      # tensors before this are committed

    # -- looking --------------------------------------------------------------------

    @property
    def sg(self) -> Subgraph:
        return self.model.main

    @property
    def ops(self) -> list[Operator]:
        return self.sg.operators

    def tensor(self, t: int) -> Tensor:
        return self.sg.tensors[t]

    def each(self, *names: str):
        """(index, operator) of every operator named ``names`` (all if none given)."""
        for i, op in enumerate(self.ops):
            if not names or op.name in names:
                yield i, op

    def producer(self, t: int) -> int | None:
        """The operator producing tensor ``t``, or None (input, constant, -1)."""
        for i, op in enumerate(self.ops):
            if t in op.outputs:
                return i
        return None

    def consumers(self, t: int) -> list[int]:
        """Operators reading tensor ``t``, in order (an operator reading it twice once)."""
        return [i for i, op in enumerate(self.ops) if t in op.inputs]

    def is_output(self, t: int) -> bool:
        return t in self.sg.outputs

    def only_read_by(self, t: int, ops) -> bool:
        """True if nothing but ``ops`` reads ``t`` and it is not a model output."""
        return not self.is_output(t) and set(self.consumers(t)) <= set(ops)

    def const(self, t: int) -> np.ndarray | None:
        """The value of a constant tensor, or None."""
        return None if t < 0 else self.tensor(t).data

    def quant(self, t: int) -> tuple[float, int] | None:
        """(scale, zero_point) of a per-tensor quantized tensor, else None."""
        q = self.tensor(t).quantization
        if q is None or q.scale.size != 1:
            return None
        return q.params

    def label(self, i: int) -> str:
        """How a record names operator ``i``: ``"FULLY_CONNECTED 12"`` (its index in the
        model as given), ``"CONV_2D (from FULLY_CONNECTED 12)"`` for one an earlier
        rewrite made, or ``"ADD (new)"``."""
        k, name = self.origin[i], self.ops[i].name
        if k is None:
            return f"{name} (new)"
        return f"{name} (from {self._given[k]} {k})" if self.made[i] else f"{name} {k}"

    # -- making ---------------------------------------------------------------------

    def unique_name(self, base: str) -> str:
        name, k = base, 1
        while name in self._names:
            k += 1
            name = f"{base}_{k}"
        self._names.add(name)
        return name

    def add_tensor(self, name: str, shape, dtype, *, scale=None, zero_point=None,
                   axis: int = 0, data: np.ndarray | None = None) -> int:
        """A new tensor (a constant when ``data`` is given); returns its index.  Names
        are made unique.  ``scale``/``zero_point`` scalars or per-channel arrays."""
        self.sg.tensors.append(make_tensor(self.unique_name(name), shape, dtype, scale=scale,
                                           zero_point=zero_point, axis=axis, data=data))
        return len(self.sg.tensors) - 1

    def add_constant(self, name: str, data, dtype=None, **quant) -> int:
        arr = np.asarray(data, dtype=dtype)
        return self.add_tensor(name, arr.shape, arr.dtype, data=arr, **quant)

    def like(self, t: int, name: str, shape=None, *, scale=None, zero_point=None) -> int:
        """A new tensor of ``t``'s type and quantization (or the ``scale``/``zero_point``
        given), with ``shape`` (default ``t``'s)."""
        src = self.tensor(t)
        if scale is None and src.quantization is not None:
            q = src.quantization
            scale, zero_point, axis = q.scale, q.zero_point, q.quantized_dimension
        else:
            axis = 0
        return self.add_tensor(name, src.shape if shape is None else shape, src.dtype,
                               scale=scale, zero_point=zero_point, axis=axis)

    def make_op(self, name: str, inputs, outputs, *, version: int = 1, **options) -> Operator:
        """A new operator (not yet in the graph: give it to :meth:`replace`).  Options
        are checked against the schema as in ``ModelBuilder.op``."""
        return make_operator(name, inputs, outputs, version=version, **options)

    def replace(self, indices, new_ops: list[Operator]) -> None:
        """Queue: operators ``indices`` leave, ``new_ops`` (in order) take the place of
        the last of them.  Every tensor the removed operators produced must be
        produced again by ``new_ops`` or be read by nobody else."""
        indices = sorted(set(indices))
        gone = {t for i in indices for t in self.ops[i].outputs}
        made = {t for op in new_ops for t in op.outputs}
        for t in gone - made:
            if not self.only_read_by(t, indices):
                raise ModelError(f"rewrite {getattr(self.current, 'name', '?')}: tensor "
                                 f"{self.tensor(t).name!r} is still read after its "
                                 f"producer is replaced")
        for done, _ in self._queue:
            if set(done) & set(indices):
                raise ModelError(f"rewrite {getattr(self.current, 'name', '?')}: operator "
                                 f"{sorted(set(done) & set(indices))} replaced twice")
        self._queue.append((indices, list(new_ops)))

    # -- applying -------------------------------------------------------------------

    def commit(self) -> None:
        """Apply the queued replacements, keep the operators in a valid order and drop
        tensors (and buffers) nothing uses."""
        if not self._queue:
            self.discard()              # tensors made for nothing
            return
        removed = {i for indices, _ in self._queue for i in indices}
        at_last = {indices[-1]: (indices, new) for indices, new in self._queue}
        ops, origin, made = [], [], []
        for i, op in enumerate(self.ops):
            if i in at_last:
                indices, new = at_last[i]
                ops.extend(new)
                # New operators come from the one replaced, or from a group.
                ks = {self.origin[j] for j in indices}
                origin.extend([ks.pop() if len(ks) == 1 else None] * len(new))
                made.extend([True] * len(new))
            elif i not in removed:
                ops.append(op)
                origin.append(self.origin[i])
                made.append(self.made[i])
        self._queue = []
        order = _topological(self.sg, ops)
        self.sg.operators = [ops[i] for i in order]
        self.origin = [origin[i] for i in order]
        self.made = [made[i] for i in order]
        self._prune()
        self._mark = len(self.sg.tensors)

    def discard(self) -> None:
        """Forget the queued replacements and the tensors made since the last commit
        (a rewrite that failed half-way leaves the model as it found it)."""
        self._queue = []
        del self.sg.tensors[self._mark:]

    def _prune(self) -> None:
        sg = self.sg
        used = set(sg.inputs) | set(sg.outputs)
        for op in sg.operators:
            used.update(op.tensor_indices())
        if len(used) == len(sg.tensors):
            return
        keep = sorted(used)
        remap = {old: new for new, old in enumerate(keep)}
        dropped = [t for i, t in enumerate(sg.tensors) if i not in used]
        sg.tensors = [sg.tensors[i] for i in keep]

        def m(i):
            return remap[i] if i >= 0 else i
        for op in sg.operators:
            op.inputs = [m(i) for i in op.inputs]
            op.outputs = [m(i) for i in op.outputs]
            op.intermediates = [m(i) for i in op.intermediates]
        sg.inputs = [m(i) for i in sg.inputs]
        sg.outputs = [m(i) for i in sg.outputs]
        for s in self.model.signatures:
            if s.subgraph_index == 0:
                s.inputs = {k: m(v) for k, v in s.inputs.items()}
                s.outputs = {k: m(v) for k, v in s.outputs.items()}
        self._drop_buffers(dropped)

    def _drop_buffers(self, dropped: list[Tensor]) -> None:
        """Buffers only the dropped tensors held leave the model (the writer would
        still store what ``model.buffers`` lists)."""
        live = {id(t.buffer) for sg in self.model.subgraphs for t in sg.tensors if t.buffer}
        live |= {id(md.buffer) for md in self.model.metadata}
        pinned = {id(self.model.buffers[j - 1]) for j in self.model.metadata_buffer
                  if 0 < j <= len(self.model.buffers)}
        gone = {id(t.buffer) for t in dropped if t.buffer} - live - pinned
        if not gone:
            return
        old = self.model.buffers
        self.model.buffers = [b for b in old if id(b) not in gone]
        where = {id(b): k + 1 for k, b in enumerate(self.model.buffers)}
        self.model.metadata_buffer = [where.get(id(old[j - 1]), j) if 0 < j <= len(old) else j
                                      for j in self.model.metadata_buffer]


def _topological(sg: Subgraph, ops: list[Operator]) -> list[int]:
    """An execution order of ``ops``: their own order where it is valid, else a
    stable topological sort (each operator as early as its inputs allow)."""
    producer = {t: i for i, op in enumerate(ops) for t in op.outputs}
    ready = set(sg.inputs)
    if all(all(t < 0 or t in ready or t not in producer or producer[t] < i for t in op.inputs)
           for i, op in enumerate(ops)):
        return list(range(len(ops)))
    done: set[int] = set()
    order: list[int] = []
    while len(order) < len(ops):
        progressed = False
        for i, op in enumerate(ops):
            if i in done:
                continue
            if all(t < 0 or t not in producer or producer[t] in done for t in op.inputs):
                done.add(i)
                order.append(i)
                progressed = True
                break
        if not progressed:
            raise ModelError("a rewrite left a cycle in the operator graph")
    return order
