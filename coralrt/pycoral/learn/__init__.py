"""pycoral.learn (on-device training) is not part of coralrt: importing it fails."""

raise ImportError(
    "on-device training (pycoral.learn: imprinting and backprop) is not provided by "
    "coralrt; coralrt.pycoral covers pycoral.utils, pycoral.adapters and pycoral.pipeline")
