"""pycoral.utils on coralrt: :mod:`.edgetpu` (interpreters, devices), :mod:`.dataset` (labels)."""
