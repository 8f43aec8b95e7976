"""The rewrite stage's contract: what a rewrite is, what it reports, and how a
chosen set of them runs over a model before partitioning.

A rewrite is an object with

* ``name`` (str, unique, e.g. ``"fc_as_conv"``) and ``version`` (int; part of
  the compile-cache key, bump it when the output changes);
* ``exact`` (bool): True if the rewritten model gives the same integer results
  as the original (a different arrangement of the same arithmetic), False for
  an approximation (reported as such when it runs);
* ``order`` (int): rewrites run in ascending ``order``, then by name
  (coralrt's own: 100 ``gelu``, 200 ``fc_as_conv``, 300 ``split_wide``,
  310 ``split_embedding``);
* ``description`` (str): one line for ``coralrt plugins`` and the docs;
* ``apply(editor: GraphEditor) -> list[RewriteRecord]``: edits the model
  through ``editor`` (:mod:`coralrt._compile.rewrite.graph`: new tensors and
  ``replace``, never changing an existing tensor or operator in place) and
  says what it replaced.  It must leave a valid TFLite model (LiteRT runs it) and never
  touch the caller's model: the editor works on a copy.

Built-in rewrites are registered through the ``coralrt_register_rewrites``
plugin hook like any other (``coralrt/plugins/_builtins.py``).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Protocol

from coralrt.errors import ConfigError

__all__ = ["Rewrite", "RewriteRecord", "RewriteResult", "SPECS", "select_rewrites",
           "run_rewrites", "cache_options"]

log = logging.getLogger("coralrt.compile")

#: The named selections ``rewrites=`` takes besides a list of names.
SPECS = ("exact", "auto", "none")


class Rewrite(Protocol):
    name: str
    version: int
    exact: bool
    order: int
    description: str

    def apply(self, editor) -> list[RewriteRecord]: ...


@dataclass(frozen=True)
class RewriteRecord:
    """One replacement: ``before`` names the operators replaced (``"FULLY_CONNECTED
    12"``: name and index in the model as the user gave it; ``"CONV_2D (from
    FULLY_CONNECTED 12)"`` for one an earlier rewrite made), ``after`` the
    operators put in their place."""

    rewrite: str
    before: tuple[str, ...]
    after: tuple[str, ...]
    detail: str = ""
    exact: bool = True

    def line(self) -> str:
        after = ", ".join(_runs(self.after))
        text = f"{', '.join(self.before)} -> {after} (rewrite {self.rewrite})"
        if self.detail:
            text += f": {self.detail}"
        if not self.exact:
            text += " [approximation]"
        return text

    def to_dict(self) -> dict:
        return {"rewrite": self.rewrite, "before": list(self.before),
                "after": list(self.after), "detail": self.detail, "exact": self.exact,
                "line": self.line()}


def _runs(names) -> list[str]:
    """["MUL", "MUL", "TANH"] -> ["2 x MUL", "TANH"]: long replacements stay readable."""
    out: list[str] = []
    for name in names:
        if out and out[-1][1] == name:
            out[-1] = (out[-1][0] + 1, name)
        else:
            out.append((1, name))
    return [name if n == 1 else f"{n} x {name}" for n, name in out]


@dataclass
class RewriteResult:
    model: object                               # the rewritten coralrt._model.Model
    records: list[RewriteRecord] = field(default_factory=list)
    applied: list[str] = field(default_factory=list)   # names of the rewrites that ran
    # per operator: the index, in the model as given, of the operator it is or was
    # made from (None: made from a replaced group of several)
    origin: list[int | None] = field(default_factory=list)
    failed: dict[str, str] = field(default_factory=dict)    # rewrite name -> its error

    def lines(self) -> list[str]:
        return [r.line() for r in self.records]


def select_rewrites(spec, available: dict) -> list:
    """The rewrites ``spec`` names, in the order they run.

    ``spec``: ``"exact"`` (every exact rewrite), ``"auto"`` (all, approximations
    included), ``"none"``/None, or a list of names (a comma-separated string
    too).  ``available``: name -> rewrite."""
    if spec is None or spec == "none":
        chosen = []
    elif spec == "exact":
        chosen = [r for r in available.values() if r.exact]
    elif spec == "auto":
        chosen = list(available.values())
    else:
        names = [n.strip() for n in spec.split(",")] if isinstance(spec, str) else list(spec)
        names = [n for n in names if n]
        unknown = [n for n in names if n not in available]
        if unknown or not names:
            known = ", ".join(sorted(available)) or "none installed"
            what = f"unknown rewrite(s) {', '.join(map(repr, unknown))}" if unknown else \
                "an empty list of rewrites"
            raise ConfigError(f"{what}; choose {', '.join(map(repr, SPECS))} or names from: "
                              f"{known}")
        chosen = [available[n] for n in dict.fromkeys(names)]
    return sorted(chosen, key=lambda r: (r.order, r.name))


def cache_options(rewrites) -> list[list]:
    """What the chosen rewrites add to a compile-cache key."""
    return [[r.name, int(r.version)] for r in rewrites]


def run_rewrites(model, rewrites, *, rules=None) -> RewriteResult:
    """Apply ``rewrites`` in order to a copy of ``model``; the model itself is never
    changed.  ``rules`` (a RuleRegistry) is what passes consult about what maps.

    A rewrite that raises is skipped with a warning, the model as the rewrites
    before it left it: a rewrite exists to map more operators, and its failure
    must not stop a model that runs without it (``failed`` says which)."""
    from coralrt._compile.rewrite.graph import GraphEditor
    if not rewrites:
        return RewriteResult(model, [], [], list(range(len(model.main.operators))))
    editor = GraphEditor(model, rules=rules)
    result = RewriteResult(editor.model)
    for rewrite in rewrites:
        editor.current = rewrite
        try:
            found = list(rewrite.apply(editor) or ())
            editor.commit()
        except Exception as e:  # noqa: BLE001 - reported, and the model stays usable
            editor.discard()
            result.failed[rewrite.name] = f"{type(e).__name__}: {e}"
            log.warning("rewrite %s failed on this model and was skipped (%s: %s)",
                        rewrite.name, type(e).__name__, e)
            continue
        finally:
            editor.current = None
        if found:
            result.applied.append(rewrite.name)
            result.records.extend(found)
    result.model, result.origin = editor.model, list(editor.origin)
    return result
