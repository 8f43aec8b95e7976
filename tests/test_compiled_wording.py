"""An edgetpu_compiler output whose file name does not end in _edgetpu.tflite is
refused in one wording on every host target (cpu and sim, either CPU backend)."""

from __future__ import annotations

import shutil

import pytest
from conftest import shared_model

from coralrt import InferenceSession
from coralrt.errors import ModelError

COMPILED = "edgetpu/mobilenet_v1_0.25_128_quant_edgetpu.tflite"
CASES = [("cpu", {}), ("cpu", {"backend": "numpy"}), ("sim", {}),
         ("sim", {"backend": "numpy"}), ("sim", {"partition_mode": "compat"})]


def _refusals(source) -> set[str]:
    out = set()
    for target, options in CASES:
        with pytest.raises(ModelError) as e:
            InferenceSession(source, target=target, **options)
        out.add(str(e.value))
    return out


@pytest.mark.parametrize("given", ["path", "bytes"])
def test_compiled_model_under_another_name_is_refused_in_one_wording(tmp_path, given):
    path = tmp_path / "detector.tflite"          # not *_edgetpu.tflite
    shutil.copyfile(shared_model(COMPILED), path)
    source = str(path) if given == "path" else path.read_bytes()
    (message,) = _refusals(source)
    assert message.startswith("this model was compiled by edgetpu_compiler (it contains "
                              "edgetpu-custom-op): its Edge TPU program runs only on a Coral "
                              "USB Accelerator (target='coral')")
    assert "The plain model runs anywhere" in message
