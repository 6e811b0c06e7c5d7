"""The segment kinds by name, apart from their rules (``optimizer.kinds.rules``): the plan option
declarations (``optimizer.options``) name them, and the command line imports those to build its
options, so this module imports nothing heavy."""

from __future__ import annotations

from enum import Enum


class Kind(str, Enum):
    POINTWISE = "pointwise"
    REDUCTION = "reduction"
    NORMALIZATION = "normalization"
    INNER_OUTER = "inner_outer"
    LIBRARY = "library"
    FALLBACK = "fallback"
