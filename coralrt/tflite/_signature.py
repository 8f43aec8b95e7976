"""tflite_runtime's ``SignatureRunner`` over a :mod:`coralrt.tflite` interpreter's session."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from coralrt.tflite._details import tensor_details

if TYPE_CHECKING:
    from coralrt.tflite.interpreter import Interpreter

__all__ = ["SignatureRunner"]


class SignatureRunner:
    """tflite_runtime's ``SignatureRunner``: ``runner(**inputs) -> {output name: array}``."""

    def __init__(self, interpreter: Interpreter = None, signature_key: str = None):
        if not interpreter:
            raise ValueError("None interpreter provided.")
        if not signature_key:
            raise ValueError("None signature_key provided.")
        defs = interpreter._get_full_signature_list()
        if signature_key not in defs:
            raise ValueError(f'Invalid signature_key provided: "{signature_key}".')
        self._interpreter = interpreter
        self._key = signature_key
        self._inputs = defs[signature_key]["inputs"]
        self._outputs = defs[signature_key]["outputs"]
        self._shapes: tuple[dict, dict] = ({}, {})
        self._subgraph = next(s.subgraph_index for s in interpreter._model.signatures
                              if s.key == signature_key)

    def __call__(self, **kwargs) -> dict:
        if len(kwargs) != len(self._inputs):
            raise ValueError(f"Invalid number of inputs provided for running a SignatureDef, "
                             f"expected {len(self._inputs)} vs provided {len(kwargs)}")
        for name in kwargs:
            if name not in self._inputs:
                raise ValueError(f"Invalid Input name ({name}) for SignatureDef")
        result = self._interpreter._session.run(kwargs, signature=self._key)
        # The details show the shapes of the last call, as LiteRT's do.
        self._shapes = ({n: np.shape(v) for n, v in kwargs.items()},
                        {n: v.shape for n, v in result.items()})
        return result

    def _details(self, names: dict, shapes: dict) -> dict:
        sg = self._interpreter._model.subgraphs[self._subgraph]
        return {n: tensor_details(sg.tensors[i], i, shapes.get(n)) for n, i in names.items()}

    def get_input_details(self) -> dict:
        return self._details(self._inputs, self._shapes[0])

    def get_output_details(self) -> dict:
        return self._details(self._outputs, self._shapes[1])
