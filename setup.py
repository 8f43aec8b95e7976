"""Ships coralrt's start-up hook, ``coralrt-compat.pth``, at the top of site-packages.

Everything else about the package is in pyproject.toml.  A ``.pth`` file must sit in
site-packages itself, outside any package, which pyproject.toml cannot express
(``data-files`` go under the environment's prefix, not site-packages), so:

* wheels (``pip install .``, ``python -m build``): ``build_py`` copies the file to the
  top of the build folder, which becomes the top of the wheel;
* editable installs (``pip install -e .``): the build folder is not part of the
  editable wheel, so ``editable_wheel`` adds the file to that wheel itself, next to
  setuptools' own ``__editable__`` files.  If a setuptools version changes the method
  this relies on, the editable install still works, only without the start-up hook
  (``python -m coralrt.compat`` does not need it).

The module the line imports, ``_coralrt_compat``, is a ``py-modules`` entry of
pyproject.toml, so both kinds of install provide it.
"""

from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py as _build_py

PTH = Path(__file__).resolve().parent / "coralrt-compat.pth"


class build_py(_build_py):
    def run(self):
        super().run()
        self.copy_file(str(PTH), str(Path(self.build_lib, PTH.name)), preserve_mode=False)

    def get_outputs(self, *args, **kwargs):
        return [*super().get_outputs(*args, **kwargs), str(Path(self.build_lib, PTH.name))]


cmdclass = {"build_py": build_py}

try:
    from setuptools.command.editable_wheel import editable_wheel as _editable_wheel
except ImportError:     # pragma: no cover - setuptools < 64 cannot make editable wheels
    pass
else:
    class _WithPth:
        """Wraps setuptools' editable strategy: also writes the .pth into the wheel."""

        def __init__(self, strategy):
            self._strategy = strategy

        def __enter__(self):
            self._strategy.__enter__()
            return self

        def __exit__(self, *exc):
            return self._strategy.__exit__(*exc)

        def __call__(self, wheel, *args, **kwargs):
            self._strategy(wheel, *args, **kwargs)
            wheel.writestr(PTH.name, PTH.read_bytes())

    class editable_wheel(_editable_wheel):
        def _select_strategy(self, *args, **kwargs):
            return _WithPth(super()._select_strategy(*args, **kwargs))

    cmdclass["editable_wheel"] = editable_wheel

setup(cmdclass=cmdclass)
