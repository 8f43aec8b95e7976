"""Every exception coralrt raises on purpose.

Each class subclasses :class:`CoralRTError` and the builtin that matches its
meaning, so ``except ValueError`` keeps working for callers that do not know
coralrt.  Messages say what was wrong, where, and what to do about it.
Exceptions keep their structured attributes when pickled (they cross process
boundaries in the cache and the multi-stick runner).
"""

from __future__ import annotations

__all__ = [
    "CoralRTError",
    "ModelError",
    "UnsupportedOperatorError",
    "InputError",
    "BackendError",
    "BackendUnavailableError",
    "InferenceError",
    "ConfigError",
    "TargetUnavailableError",
]


class CoralRTError(Exception):
    """Base class of every error coralrt raises on purpose."""

    def __reduce__(self):
        # Keep keyword attributes across pickling (multiprocessing, subprocess
        # workers): the default reduce only replays ``args``.
        return (_rebuild, (type(self), self.args, self.__dict__))


def _rebuild(cls, args, state):
    err = cls.__new__(cls)
    Exception.__init__(err, *args)
    err.__dict__.update(state)
    return err


class ModelError(CoralRTError, ValueError):
    """The model file is not a valid TFLite model, or cannot be used as one.

    ``where`` names the place (for example ``"subgraph 0, operator 12"``)
    when one is known.
    """

    def __init__(self, message: str, *, where: str | None = None):
        self.where = where
        self.message = message
        super().__init__(f"{where}: {message}" if where else message)


class UnsupportedOperatorError(ModelError):
    """An operator that neither the CPU backend nor any plugin provides."""

    def __init__(self, op_name: str, *, where: str | None = None, detail: str | None = None):
        self.op_name = op_name
        msg = (
            f"operator {op_name!r} is not provided by the CPU backend or by any "
            f"installed coralrt plugin; install or register a plugin that provides "
            f"a kernel for {op_name!r} (see docs/plugins.md)"
        )
        if detail:
            msg += f" [{detail}]"
        super().__init__(msg, where=where)


class InputError(CoralRTError, ValueError):
    """The inputs passed to ``run`` do not match what the model expects."""


class BackendError(CoralRTError, RuntimeError):
    """The CPU backend failed in a way that is not the model's or the caller's fault."""


class BackendUnavailableError(BackendError, ImportError):
    """The requested CPU backend (or any CPU backend) is not installed."""


class InferenceError(CoralRTError, RuntimeError):
    """Running the model failed after it was loaded successfully."""


class ConfigError(CoralRTError, ValueError):
    """An option passed to coralrt has a value it does not know.

    For example an unknown CPU backend name or kernel set; the message lists
    the accepted values.
    """


class TargetUnavailableError(CoralRTError, NotImplementedError):
    """The requested target cannot run in this installation or version."""
