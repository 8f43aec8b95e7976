"""Models the XNNPACK delegate would fail to build a runtime for.

LiteRT's default kernels apply the XNNPACK delegate.  XNNPACK refuses a
quantized convolution or fully connected layer whose requantization scale
(input scale x weight scale / output scale, per output channel) is 256 or more
(``xnn_create_convolution2d_nhwc_qu8``/``qs8``, ``xnn_create_fully_connected_nc_*``:
"unsupported parameter"), and the delegate then fails to create its runtime.
In a one-operator partition that is a clean error, after which coralrt loads
the model with the builtin kernels; in a partition that also holds a
DEQUANTIZE and a QUANTIZE, the delegate's clean-up frees memory twice and the
process dies with SIGABRT ("free(): double free detected", measured with
ai-edge-litert 2.3 on a uint8 CONV_2D with a scale of 2000 next to such a
pair).  So such a model is loaded with the builtin kernels from the start:
the answer the clean refusal would have led to, without the crash.
"""

from __future__ import annotations

import numpy as np

from coralrt.errors import CoralRTError
from coralrt._model import load_model

__all__ = ["xnnpack_refuses"]

# Operator -> (input, weights) positions.
_OPERANDS = {"CONV_2D": (0, 1), "DEPTHWISE_CONV_2D": (0, 1), "FULLY_CONNECTED": (0, 1),
             "TRANSPOSE_CONV": (2, 1)}
_LIMIT = 256.0


def _scales(t) -> np.ndarray | None:
    q = t.quantization
    return None if q is None or not q.scale.size else np.asarray(q.scale, np.float32)


def xnnpack_refuses(model_bytes: bytes) -> str | None:
    """Why XNNPACK would fail to build a runtime for this model, or None."""
    try:
        model = load_model(model_bytes)
    except CoralRTError:
        return None   # the interpreter reports what is wrong with the file
    for sg in model.subgraphs:
        for oi, op in enumerate(sg.operators):
            pos = _OPERANDS.get(op.name)
            if pos is None or op.opcode.is_custom or not op.outputs \
                    or min(op.inputs[p] for p in pos) < 0 or op.outputs[0] < 0:
                continue
            x, w = (sg.tensors[op.inputs[p]] for p in pos)
            out = sg.tensors[op.outputs[0]]
            if x.type_name not in ("UINT8", "INT8"):
                continue
            s_in, s_w, s_out = _scales(x), _scales(w), _scales(out)
            if s_in is None or s_w is None or s_out is None or s_out[0] <= 0:
                continue
            with np.errstate(over="ignore", invalid="ignore"):
                ratio = s_in[0] * s_w / s_out[0]
            if np.any(ratio >= _LIMIT):
                return (f"operator {oi} ({op.name}) has a requantization scale of "
                        f"{float(np.nanmax(ratio)):g}, XNNPACK takes less than {_LIMIT:g}")
    return None
