# A package, so that this folder's conftest is imported as ``bench.conftest``
# and does not take the module name ``conftest`` from tests/conftest.py, whose
# helpers the test modules import as ``from conftest import ...``.
