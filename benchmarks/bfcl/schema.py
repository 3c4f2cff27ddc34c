"""BFCL function docs as OpenAI tool specs: parameter types to JSON Schema, and tool-name mapping.

BFCL function docs use Gorilla's own type names (``dict``, ``float``, ``tuple``, ``any``, Java's
``String`` ...). The model is shown JSON Schema, translated with the table below, which is the one BFCL's
own OpenAI-style handlers use (``bfcl_eval/constants/type_mappings.py: GORILLA_TO_OPENAPI``, applied by
``bfcl_eval/model_handler/utils.py: _cast_to_openai_type``):

================================================  ===========  ==============================================
BFCL type                                         JSON Schema  note
================================================  ===========  ==============================================
``string``, ``String``, ``char``                  ``string``
``any``, ``Any``                                  ``string``   as BFCL: "any" values are written as text
``integer``, ``byte``, ``short``, ``long``,       ``integer``
``Bigint``
``number``, ``double``                            ``number``
``float``                                         ``number``   plus ``"format": "float"`` and the description
                                                               suffix " This is a float type value." (BFCL)
``boolean``, ``bool``                             ``boolean``
``array``, ``list``, ``tuple``, ``ArrayList``,    ``array``    ``items`` translated recursively
``Array``, ``Queue``, ``Stack``
``dict``, ``object``, ``HashMap``, ``Hashtable``  ``object``   ``properties`` translated recursively
(no ``type``) or any other name                   ``string``   as BFCL
================================================  ===========  ==============================================

Unlike BFCL (which stops at two levels), ``items`` and ``properties`` are translated at every depth. Other
keys (``description``, ``enum``, ``default``, ``required`` lists, ...) are kept; the multi-turn docs'
``response`` schema is dropped (it describes the return value, not the arguments).

Tool names: BFCL single-turn names may contain dots (``math.factorial``), which the OpenAI function-name
pattern ``^[a-zA-Z0-9_-]{1,64}$`` does not allow. As BFCL's OpenAI handler does
(``model_handler/utils.py: convert_to_tool``), dots become underscores in the name shown to the model
(`to_tool_name`); each task records the mapping back in ``metadata["tool_name_map"]`` and the verifier
restores the dotted name before the AST check (`from_tool_name`).
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any

from envace_gym.types import ToolSpec

__all__ = [
    "BFCL_TO_JSON_SCHEMA",
    "PYTHON_HINT",
    "json_schema_type",
    "to_json_schema",
    "function_doc_to_tool_spec",
    "to_tool_name",
    "from_tool_name",
    "build_tool_name_map",
]

#: BFCL type name -> JSON Schema type (same content as BFCL's ``GORILLA_TO_OPENAPI``).
BFCL_TO_JSON_SCHEMA: dict[str, str] = {
    "integer": "integer",
    "number": "number",
    "float": "number",
    "string": "string",
    "boolean": "boolean",
    "bool": "boolean",
    "array": "array",
    "list": "array",
    "dict": "object",
    "object": "object",
    "tuple": "array",
    "any": "string",
    "byte": "integer",
    "short": "integer",
    "long": "integer",
    "double": "number",
    "char": "string",
    "ArrayList": "array",
    "Array": "array",
    "HashMap": "object",
    "Hashtable": "object",
    "Queue": "array",
    "Stack": "array",
    "Any": "string",
    "String": "string",
    "Bigint": "integer",
}

#: Suffix BFCL appends to every Python function description at generation time
#: (``bfcl_eval/utils.py: _get_language_specific_hint``).
PYTHON_HINT = " Note that the provided function is in Python 3 syntax."

_FLOAT_NOTE = " This is a float type value."


def json_schema_type(bfcl_type: str | None) -> str:
    """The JSON Schema type for a BFCL type name (see the module table); unknown or missing -> ``"string"``."""
    if bfcl_type is None:
        return "string"
    return BFCL_TO_JSON_SCHEMA.get(bfcl_type, "string")


def to_json_schema(schema: Mapping[str, Any]) -> dict[str, Any]:
    """Translate one BFCL parameter schema (any depth) to JSON Schema; the input is not modified.

    Args:
        schema: a BFCL schema dict, e.g. ``{"type": "float", "description": "..."}``.

    Returns:
        A new dict with ``type`` translated per the module table, ``items`` and ``properties`` translated
        recursively, a non-list ``required`` dropped, and other keys kept.
    """
    out: dict[str, Any] = {
        k: copy.deepcopy(v) for k, v in schema.items() if k not in ("items", "properties", "response")
    }
    bfcl_type = schema.get("type")
    out["type"] = json_schema_type(bfcl_type)
    if bfcl_type == "float":
        out["format"] = "float"
        out["description"] = str(schema.get("description", "")) + _FLOAT_NOTE
    if "required" in out and not isinstance(out["required"], list):
        del out["required"]
    if isinstance(schema.get("items"), Mapping):
        out["items"] = to_json_schema(schema["items"])
    if isinstance(schema.get("properties"), Mapping):
        out["properties"] = {k: to_json_schema(v) for k, v in schema["properties"].items()}
    return out


def function_doc_to_tool_spec(doc: Mapping[str, Any], hint: str = PYTHON_HINT) -> ToolSpec:
    """A BFCL function doc (``{"name", "description", "parameters"}``) as a `ToolSpec`.

    The name goes through `to_tool_name`, the description gets `hint` appended (BFCL does so at
    generation time), and ``parameters`` becomes a JSON Schema object.

    Raises:
        KeyError: the doc has no ``name``.
    """
    params = doc.get("parameters") or {"type": "dict", "properties": {}}
    schema = to_json_schema(params)
    schema["type"] = "object"
    schema.setdefault("properties", {})
    return ToolSpec(
        name=to_tool_name(doc["name"]), description=str(doc.get("description", "")) + hint, parameters=schema
    )


def to_tool_name(bfcl_name: str) -> str:
    """The name shown to the model: dots replaced by underscores (BFCL ``convert_to_tool``)."""
    return bfcl_name.replace(".", "_")


def from_tool_name(tool_name: str, name_map: Mapping[str, str]) -> str:
    """The BFCL name for a name the model emitted: ``name_map[tool_name]`` if present, else unchanged.

    A name the model wrote with dots already (``math.factorial``) is therefore also kept as is.
    """
    return name_map.get(tool_name, tool_name)


def build_tool_name_map(bfcl_names: list[str]) -> dict[str, str]:
    """``{shown name: BFCL name}`` for the names that `to_tool_name` changes.

    Raises:
        ValueError: two BFCL names map to the same shown name (e.g. ``a.b`` and ``a_b``), so the mapping
            could not be undone.
    """
    shown: dict[str, str] = {}
    for name in bfcl_names:
        t = to_tool_name(name)
        if t in shown and shown[t] != name:
            raise ValueError(f"BFCL names {shown[t]!r} and {name!r} both map to tool name {t!r}")
        shown[t] = name
    return {t: n for t, n in shown.items() if t != n}
