"""The simulated Edge TPU: integer kernels with TFLite's reference semantics,
a segment interpreter, and a device that estimates real-stick latency."""
