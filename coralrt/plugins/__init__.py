"""The plugin system: the contract, the host, the registries and coralrt's built-ins.

``hookspecs.py`` is THE documented plugin contract.  ``host.py`` builds a
pluggy manager with the built-ins, the ``coralrt`` entry points and a
session's explicit plugins, and fills the registries (``registry.py``) by
calling every registration hook through pluggy; a broken installed plugin is
skipped with a warning (``CORALRT_PLUGINS_STRICT=1``: an error).
``loader.py`` finds, names and registers plugins one at a time and keeps a
record of each (what ``coralrt plugins`` lists).  ``builtins.py`` is
coralrt's own plugin: the native and edgetpu_compiler compilers and the
``sim`` device kind.
"""
