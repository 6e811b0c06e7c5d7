"""Errors the optimizer raises for bad user input. Each names the problem precisely."""

from __future__ import annotations


class FusecutError(RuntimeError):
    """Base of every error fusecut reports to a user (never a bug in fusecut itself).

    A RuntimeError, as every error of nvFuser's frontend is: code written against nvFuser
    (``except RuntimeError``, ``pytest.raises(RuntimeError)``) handles fusecut's the same way.
    """


class DefinitionError(FusecutError):
    """A fusion definition (text, JSON or builder calls) is malformed.

    ``line``/``col`` locate the problem in nvFuser Python text when known; ``op`` names the op
    (index and name) when the problem is an op's arguments.
    """

    def __init__(self, message: str, *, line: int | None = None, col: int | None = None,
                 op: str | None = None):
        self.message = message
        self.line = line
        self.col = col
        self.op = op
        where = []
        if line is not None:
            where.append(f"line {line}" + (f", column {col}" if col is not None else ""))
        if op is not None:
            where.append(op)
        super().__init__(f"{': '.join(where)}: {message}" if where else message)

    def at(self, line: int | None, col: int | None) -> DefinitionError:
        """The same error located at a text position (keeps an existing location)."""
        if self.line is not None:
            return self
        return DefinitionError(self.message, line=line, col=col, op=self.op)


class ArgumentTypeError(DefinitionError, TypeError):
    """An argument of the wrong type (a float where an integer list belongs, an integer beyond 64
    bits): a TypeError too, as Python (and nvFuser's bindings) report wrong argument types."""


class InputError(FusecutError):
    """Input metadata or tensors do not match the definition (rank, dtype, sizes)."""


class PlanError(FusecutError):
    """The planner cannot plan this fusion with these options."""


def counted(n: int, noun: str, plural: str | None = None) -> str:
    """``n`` and its noun as a message says it: "1 input", "3 inputs", "0 entries" (issue 32:
    "has 1 inputs")."""
    return f"{n} {noun if n == 1 else plural or noun + 's'}"


class ManualSchedulingError(FusecutError):
    """A manual scheduling call of nvFuser's API (split, merge, cache_after, ...): fusecut
    schedules automatically and takes none; the call is refused, never pretended."""
