"""Label files, read the way pycoral reads them (:func:`coralrt.vision.read_labels`)."""

from __future__ import annotations

import os

from coralrt.vision._labels import read_labels

__all__ = ["read_label_file"]


def read_label_file(file_path: str | os.PathLike) -> dict[int, str]:
    """Map of class id -> label read from a UTF-8 text file.

    Each line is judged on its own: a line that starts with a decimal number
    followed by ``:`` and/or whitespace gives that id and the rest of the line;
    any other line (a plain label) gets its zero-based line number as id.
    Labels are stripped; a blank line yields an empty label for its line number.
    """
    return read_labels(file_path)
