"""Definitions and input metadata as a person hands them to fusecut: nvFuser Python text (the
repro format), wire JSON, or the body of a ``POST /v1/plan`` request (``{"definition": ...,
"inputs": [...]}``), which the service's logs and clients carry. JSON is parsed, text is
interpreted (never run), and what is wrong is named in one line.
"""

from __future__ import annotations

import json
from typing import Any

from pydantic import ValidationError

from fusecut.optimizer.errors import DefinitionError, InputError
from fusecut.optimizer.ir.inputs import InputMeta
from fusecut.optimizer.ir.nvtext import ParsedDefinition, parse_text


def parse_any(text: str) -> ParsedDefinition:
    """A definition in any of the forms above (JSON when it starts with ``{``)."""
    if not text.lstrip().startswith("{"):
        return parse_text(text)
    data = _json(text, "the definition")
    if not isinstance(data, dict):
        raise DefinitionError("a JSON definition is an object: wire JSON, or a plan request "
                              "{\"definition\": ..., \"inputs\": [...]}")
    if "definition" not in data:
        return ParsedDefinition(_wire_fusion(data), None, None)
    definition = data["definition"]
    if isinstance(definition, str):
        parsed = parse_text(definition)
    elif isinstance(definition, dict):
        parsed = ParsedDefinition(_wire_fusion(definition), None, None)
    else:
        raise DefinitionError("\"definition\" is nvFuser text (a string) or wire JSON (an "
                              "object)")
    if data.get("inputs") is not None:
        parsed = ParsedDefinition(parsed.fusion, metas_from(data["inputs"], "\"inputs\""),
                                  parsed.function_name)
    return parsed


def metas_from(data: Any, where: str) -> list[InputMeta]:
    """Input metadata from parsed JSON: a list with one entry per fusion input."""
    from fusecut.optimizer.ir.wire import meta_from_json

    if not isinstance(data, list):
        raise InputError(f"{where} must be a JSON list with one entry per fusion input, like "
                         f"[{{\"shape\": [8, 16], \"dtype\": \"float32\"}}]; got "
                         f"{type(data).__name__}")
    metas = []
    for index, entry in enumerate(data):
        try:
            metas.append(meta_from_json(entry))
        except ValidationError as e:
            raise InputError(f"{where}, entry {index}: {one_line(e)}") from None
        except InputError as e:
            raise InputError(f"{where}, entry {index}: {e}") from None
    return metas


def parse_inputs(text: str) -> list[InputMeta]:
    """``--inputs``: input metadata as JSON text."""
    return metas_from(_json(text, "--inputs"), "--inputs")


def one_line(error) -> str:
    """A pydantic ValidationError's first problem, in one line."""
    first = error.errors()[0]
    where = ".".join(str(x) for x in first.get("loc", ()))
    given = first.get("input")
    shown = f" (got {json.dumps(given)[:60]})" if isinstance(given, (int, float, str, bool)) \
        else f" (got {type(given).__name__})" if given is not None else ""
    return f"{where + ': ' if where else ''}{first.get('msg', 'invalid')}{shown}"


def _json(text: str, what: str) -> Any:
    try:
        return json.loads(text)
    except json.JSONDecodeError as e:
        raise DefinitionError(f"{what} is not valid JSON: line {e.lineno}, column {e.colno}: "
                              f"{e.msg}") from None
    except RecursionError:
        raise DefinitionError(f"{what} nests too deeply") from None


def _wire_fusion(data: dict[str, Any]):
    from fusecut.optimizer.ir.wire import fusion_from_json

    try:
        return fusion_from_json(data)
    except ValidationError as e:
        raise DefinitionError(f"not a wire-JSON definition: {one_line(e)}") from None
