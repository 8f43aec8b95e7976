"""Subprocess worker for the model fuzz test.

Reads one case per line on stdin, ``PATH`` or ``PATH<TAB>TARGET`` (``cpu``
when not given; ``sim`` runs the just-in-time compiler and the simulated
Edge TPU), loads the model with coralrt, runs it once on random inputs, and
answers one line per case: ``OK``, ``ModelError <msg>``, ``<OtherCoralRTError>
<msg>`` or ``RAW <traceback>`` for anything that is not a coralrt error.  A
crash of the native interpreter kills this process, which the parent sees.
"""

import sys
import traceback

import numpy as np

from coralrt import InferenceSession
from coralrt.errors import CoralRTError, ModelError


def _feeds(session):
    rng = np.random.default_rng(0)
    out = []
    for info in session.get_inputs():
        if np.prod(info.shape) > 2**24:
            # Mutated shapes can be huge but legal: random data would only cost time.
            out.append(np.zeros(info.shape, info.dtype))
        elif info.dtype.kind in "iu":
            lim = np.iinfo(info.dtype)
            out.append(rng.integers(lim.min, lim.max, info.shape, endpoint=True).astype(info.dtype))
        elif info.dtype.kind == "b":
            out.append(np.zeros(info.shape, bool))
        else:
            out.append(rng.standard_normal(info.shape).astype(info.dtype))
    return out


def main() -> None:
    for line in sys.stdin:
        path, _, rest = line.strip().partition("\t")
        target, _, backend = rest.partition("\t")
        try:
            session = InferenceSession(path, target=target or "cpu", num_threads=1,
                                       backend=backend or None)
            session.run(_feeds(session))
            answer = "OK"
        except ModelError as e:
            answer = "ModelError " + str(e)
        except CoralRTError as e:
            answer = f"{type(e).__name__} {e}"
        except Exception:
            answer = "RAW " + traceback.format_exc()
        sys.stdout.write(answer.replace("\n", "\\n") + "\n")
        sys.stdout.flush()


if __name__ == "__main__":
    main()
