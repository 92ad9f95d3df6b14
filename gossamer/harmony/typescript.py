"""JSON schema -> the TypeScript-like type text that Harmony puts in `namespace functions`.

This reproduces openai-harmony's rendering, quirks included, because GPT-OSS was trained on its
output: descriptions become `// ...` comments above a property, optional properties get `?`,
enums become unions of string literals, defaults become trailing `// default: ...` comments,
`oneOf` becomes a `|` list, a nested object's closing brace keeps the nested indent, and an
object's own description is printed again inside its value. Unknown or missing types are `any`.

NOTE: openai-harmony reads the schema with serde_json, so "present with a null value" and
"absent" differ in places (`"items": null` still gives `any[]`); the `key in schema` tests below
keep that difference on purpose.
"""

from __future__ import annotations

import json
from decimal import Decimal
from typing import Any

PROPERTY_INDENT = "    "
VARIANT_INDENT = "   "


def schema_to_typescript(schema: Any, indent: str = "") -> str:
    """The type text of `schema`, with nested lines indented by `indent`."""
    if not isinstance(schema, dict):
        return "any"
    if isinstance(schema.get("oneOf"), list):
        return _inline_one_of(schema["oneOf"], indent)
    type_names = _type_union(schema.get("type"))
    if type_names:
        return type_names
    if isinstance(schema.get("type"), str):
        return _single_type(schema, schema["type"], indent)
    return "any"


def _type_union(types: Any) -> str:
    """`"type": ["string", "integer"]` -> `string | number`; "" when `type` is no such list."""
    if not isinstance(types, list):
        return ""
    names = ["number" if name == "integer" else name for name in types if isinstance(name, str)]
    return " | ".join(names)


def _single_type(schema: dict[str, Any], type_name: str, indent: str) -> str:
    if type_name == "object":
        return _object_type(schema, indent)
    if type_name == "string":
        return _string_type(schema)
    if type_name == "array":
        if "items" in schema:
            return f"{schema_to_typescript(schema['items'], indent)}[]"
        return "Array<any>"
    return {"number": "number", "integer": "number", "boolean": "boolean"}.get(type_name, "any")


def _string_type(schema: dict[str, Any]) -> str:
    values = schema.get("enum")
    literals = [f'"{value}"' for value in values if isinstance(value, str)] if values else []
    if isinstance(values, list) and literals:
        return " | ".join(literals)
    return "string"


def _object_type(schema: dict[str, Any], indent: str) -> str:
    text = f"{indent}// {schema['description']}\n" if _has_str(schema, "description") else ""
    text += "{\n"
    properties = schema.get("properties")
    if isinstance(properties, dict):
        required = _required_names(schema)
        for name, property_schema in properties.items():
            text += _property(name, property_schema, name in required, indent)
    return text + f"{indent}}}"


def _required_names(schema: dict[str, Any]) -> set[str]:
    required = schema.get("required")
    if not isinstance(required, list):
        return set()
    return {name for name in required if isinstance(name, str)}


def _property(name: str, schema: Any, required: bool, indent: str) -> str:
    schema = schema if isinstance(schema, dict) else {}
    text = _property_comments(schema, indent)
    key = f"{indent}{name}{'' if required else '?'}:"
    if isinstance(schema.get("oneOf"), list):
        return text + _one_of_property(key, schema, schema["oneOf"], indent)
    value = _with_nullable(schema, schema_to_typescript(schema, indent + PROPERTY_INDENT))
    text += f"{key} {value},"
    if "oneOf" not in schema and "default" in schema:
        text += f" // default: {_default_text(schema, quote_enum_default=False)}"
    return text + "\n"


def _property_comments(schema: dict[str, Any], indent: str) -> str:
    """Title, description (unless a oneOf renders its own) and string examples, above the key."""
    text = ""
    if _has_str(schema, "title"):
        text += f"{indent}// {schema['title']}\n{indent}//\n"
    if "oneOf" not in schema and _has_str(schema, "description"):
        text += f"{indent}// {schema['description']}\n"
    examples = schema.get("examples")
    if isinstance(examples, list) and examples:
        text += f"{indent}// Examples:\n"
        text += "".join(f'{indent}// - "{ex}"\n' for ex in examples if isinstance(ex, str))
    return text


def _one_of_property(key: str, schema: dict[str, Any], variants: list[Any], indent: str) -> str:
    """A property whose value is one of several schemas: one ` | type` line per variant."""
    description = schema["description"] if _has_str(schema, "description") else None
    first_description = _str_or_none(variants[0], "description") if variants else None
    description_above = description is not None and description != first_description
    text = f"{indent}// {description}\n" if description_above else ""
    if "default" in schema:
        text += f"{indent}// default: {_default_text(schema, quote_enum_default=False)}\n"
    text += f"{key}\n"
    for index, variant in enumerate(variants):
        skip_description = index == 0 and description_above
        comments = _variant_comments(variant, description, skip_description, False)
        value = _with_nullable(variant, schema_to_typescript(variant, indent + VARIANT_INDENT))
        text += f"{indent} | {value}{comments}\n"
    return text + f"{indent},\n"


def _inline_one_of(variants: list[Any], indent: str) -> str:
    """A oneOf used as a type on its own: each variant on a new ` | ` line."""
    text = ""
    for variant in variants:
        value = _with_nullable(variant, schema_to_typescript(variant, indent + VARIANT_INDENT))
        text += f"\n{indent} | {value}{_variant_comments(variant, None, False, True)}"
    return text


def _variant_comments(
    variant: Any, parent_description: str | None, skip_description: bool, quote_enum: bool
) -> str:
    if not isinstance(variant, dict):
        return ""
    comments = []
    description = _str_or_none(variant, "description")
    if not skip_description and description is not None and description != parent_description:
        comments.append(description)
    if "default" in variant:
        comments.append(f"default: {_default_text(variant, quote_enum_default=quote_enum)}")
    return f" // {' '.join(comments)}" if comments else ""


def _default_text(schema: dict[str, Any], quote_enum_default: bool) -> str:
    """A string default is quoted (raw) unless the schema is an enum; other values are JSON."""
    default = schema["default"]
    if isinstance(default, str) and not _is_enum(schema):
        return f'"{default}"'
    if isinstance(default, str) and not quote_enum_default:
        return default
    return serde_json_text(default)


def _with_nullable(schema: Any, type_text: str) -> str:
    if isinstance(schema, dict) and schema.get("nullable") is True and "null" not in type_text:
        return f"{type_text} | null"
    return type_text


def _is_enum(schema: dict[str, Any]) -> bool:
    values = schema.get("enum")
    return isinstance(values, list) and bool(values)


def _has_str(schema: dict[str, Any], key: str) -> bool:
    return isinstance(schema.get(key), str)


def _str_or_none(schema: Any, key: str) -> str | None:
    value = schema.get(key) if isinstance(schema, dict) else None
    return value if isinstance(value, str) else None


def serde_json_text(value: Any) -> str:
    """Compact JSON as Rust's serde_json prints it (no spaces, non-ASCII kept, `1e20` exponents)."""
    if isinstance(value, float) and value == value and abs(value) != float("inf"):
        return _ryu_float_text(value)
    if isinstance(value, list):
        return f"[{','.join(serde_json_text(item) for item in value)}]"
    if isinstance(value, dict):
        items = (
            f"{json.dumps(str(key), ensure_ascii=False)}:{serde_json_text(item)}"
            for key, item in value.items()
        )
        return f"{{{','.join(items)}}}"
    return json.dumps(value, ensure_ascii=False)


def _ryu_float_text(value: float) -> str:
    """A float as Rust's ryu prints it: shortest digits, plain notation for 1e-5 <= |v| < 1e16
    (`0.00001`, `1.0`), else `1e20` / `1.5e-7` (Python would write `1e-05`, `1e+20`)."""
    if value == 0:
        return "-0.0" if str(value).startswith("-") else "0.0"
    sign, digit_tuple, exponent = Decimal(repr(value)).normalize().as_tuple()
    digits = "".join(map(str, digit_tuple))
    point = len(digits) + int(exponent)  # value = 0.digits * 10**point
    prefix = "-" if sign else ""
    if int(exponent) >= 0 and point <= 16:
        return f"{prefix}{digits}{'0' * int(exponent)}.0"
    if 0 < point <= 16:
        return f"{prefix}{digits[:point]}.{digits[point:]}"
    if -5 < point <= 0:
        return f"{prefix}0.{'0' * -point}{digits}"
    fraction = f".{digits[1:]}" if len(digits) > 1 else ""
    return f"{prefix}{digits[0]}{fraction}e{point - 1}"
