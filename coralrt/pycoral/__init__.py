"""pycoral's Python API (``pycoral.utils``, ``pycoral.adapters``, ``pycoral.pipeline``, ``pycoral.learn``) on coralrt.

The package mirrors pycoral's module layout, so ``pycoral.X`` maps to
``coralrt.pycoral.X``.  Interpreters come from :mod:`coralrt.tflite`
(the ``tflite_runtime`` look-alike); the adapters only use the
``tflite_runtime`` Interpreter API, so they also work on LiteRT's or
tflite_runtime's own Interpreter.  ``pycoral.learn`` (on-device training)
edits models with coralrt's model layer (docs/pycoral-learn.md).
"""

# The pycoral release whose API this package follows.
__version__ = "2.0.0"
