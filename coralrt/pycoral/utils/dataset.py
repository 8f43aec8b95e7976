"""Label files, read the way pycoral reads them."""

from __future__ import annotations

import os
import re

__all__ = ["read_label_file"]

# An id and a label separated by a colon and/or whitespace: "3 cat", "3: cat", "3:cat".
_SEPARATOR = re.compile(r"[:\s]+")


def read_label_file(file_path: str | os.PathLike) -> dict[int, str]:
    """Map of class id -> label read from a UTF-8 text file.

    Each line is judged on its own: a line that starts with a decimal number
    followed by ``:`` and/or whitespace gives that id and the rest of the line;
    any other line (a plain label) gets its zero-based line number as id.
    Labels are stripped; a blank line yields an empty label for its line number.
    """
    with open(file_path, encoding="utf-8") as f:
        lines = f.readlines()
    labels: dict[int, str] = {}
    for row, line in enumerate(lines):
        text = line.strip()
        parts = _SEPARATOR.split(text, maxsplit=1)
        if len(parts) == 2 and parts[0].isdecimal():
            labels[int(parts[0])] = parts[1].strip()
        else:
            labels[row] = text
    return labels
