"""coralrt's start-up hook: ``CORALRT_COMPAT=1`` maps tflite_runtime and pycoral to coralrt.

coralrt's wheel installs this module and ``coralrt-compat.pth`` at the top of
site-packages; Python runs the ``.pth`` file's line at every start:

    import os; "CORALRT_COMPAT" in os.environ and __import__("_coralrt_compat").startup()

so without the variable nothing is imported.  With it, :func:`startup` loads
``coralrt/compat/_finder.py`` on its own (standard library only: neither
coralrt's package nor NumPy is imported at start-up; coralrt's modules load
when the program first imports ``tflite_runtime`` or ``pycoral``) and puts its
finder first on ``sys.meta_path``.  It never raises: when the hook cannot be
installed, it writes one line to stderr and Python starts as usual.
"""

_OFF = ("", "0", "false", "no", "off")
_FINDER = "coralrt.compat._finder"


def startup() -> None:
    """Install coralrt's import hook when ``CORALRT_COMPAT`` is set (not 0/false/no/off)."""
    try:
        import os

        if os.environ.get("CORALRT_COMPAT", "").strip().lower() in _OFF:
            return
        import sys

        finder = sys.modules.get(_FINDER)
        if finder is None:
            import importlib.util

            spec = importlib.util.find_spec("coralrt")     # finds, does not import
            if spec is None or not spec.submodule_search_locations:
                raise ImportError("the coralrt package is not installed")
            path = os.path.join(list(spec.submodule_search_locations)[0], "compat",
                                "_finder.py")
            finder_spec = importlib.util.spec_from_file_location(_FINDER, path)
            if finder_spec is None or not os.path.isfile(path):
                raise ImportError(f"{path} is missing")
            finder = importlib.util.module_from_spec(finder_spec)
            # Under its own name: `import coralrt.compat` later finds this module.
            sys.modules[_FINDER] = finder
            try:
                finder_spec.loader.exec_module(finder)
            except BaseException:
                del sys.modules[_FINDER]
                raise
        finder.install()
    except Exception as e:     # never break Python's start-up
        try:
            import sys

            print(f"coralrt: CORALRT_COMPAT is set but the tflite_runtime/pycoral import "
                  f"hook could not be installed ({type(e).__name__}: {e})", file=sys.stderr)
        except Exception:
            pass
