"""Label files as Coral ships them: ``id label`` lines or one label per line."""

from __future__ import annotations

import os
import re

__all__ = ["read_labels", "label_of"]

# An id and a label separated by a colon and/or whitespace: "3 cat", "3: cat", "3:cat".
_ID_AND_LABEL = re.compile(r"[:\s]+")


def read_labels(path: str | os.PathLike) -> dict[int, str]:
    """Class id -> label, from a UTF-8 text file.

    Each line is judged on its own (pycoral's ``read_label_file`` rule, which
    :mod:`coralrt.pycoral.utils.dataset` serves from here): a line that starts with a decimal number followed by ``:`` and/or
    whitespace gives that id and the rest of the line (``"17  cat"``); any
    other line is a plain label whose id is its zero-based line number
    (``imagenet_labels.txt``: line 0 is "background").  Labels are stripped.
    """
    with open(path, encoding="utf-8") as f:
        lines = f.readlines()
    labels: dict[int, str] = {}
    for row, line in enumerate(lines):
        text = line.strip()
        parts = _ID_AND_LABEL.split(text, maxsplit=1)
        if len(parts) == 2 and parts[0].isdecimal():
            labels[int(parts[0])] = parts[1].strip()
        else:
            labels[row] = text
    return labels


def label_of(labels, class_id: int) -> str | None:
    """The label of ``class_id`` in a dict or sequence of labels; None when absent."""
    if labels is None:
        return None
    if isinstance(labels, dict):
        return labels.get(class_id)
    return labels[class_id] if 0 <= class_id < len(labels) else None
