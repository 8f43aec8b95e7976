"""The ``coralrt`` command line: ``coralrt inspect | partition | compile | run |
bench | demo | cache | firmware | devices | doctor | plugins``.

The entry point is :func:`coralrt._cli.main.main`.  Each command lives in its
own module with an ``add_parser`` function and a ``command`` function; the
helpers that build results (``inspect_cmd.model_report``) are importable so
that other commands and tests share them.  ``demo_model.py`` builds the
built-in demo model with coralrt's own model writer.
"""
