"""pycoral.learn on coralrt: on-device transfer learning (weight imprinting, last-layer backprop)."""
