"""Reading the config dataclasses: each field's documentation (its attribute docstring, the
help of its flag), the values a Literal-typed field allows, and the checks built on them."""

from __future__ import annotations

import dataclasses
import functools
import types
import typing
from dataclasses import fields
from typing import Literal


@functools.cache
def config_docs(cls: type) -> dict[str, str]:
    """{field name: its attribute docstring} for a dataclass and its dataclass bases, read
    from their source with ast; a field with no string literal right under it is absent."""
    docs: dict[str, str] = {}
    for klass in reversed(cls.__mro__):
        if dataclasses.is_dataclass(klass):
            docs.update(_own_docs(klass))
    return docs


def _own_docs(cls: type) -> dict[str, str]:
    import ast
    import inspect
    import textwrap

    body = ast.parse(textwrap.dedent(inspect.getsource(cls))).body[0].body
    docs = {}
    for stmt, nxt in zip(body, body[1:]):
        if (isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name)
                and isinstance(nxt, ast.Expr) and isinstance(nxt.value, ast.Constant)
                and isinstance(nxt.value.value, str)):
            docs[stmt.target.id] = inspect.cleandoc(nxt.value.value)
    return docs


def split_optional(hint: object) -> tuple[object, bool]:
    """(hint without None, whether it allowed None): `int | None` gives (int, True)."""
    if typing.get_origin(hint) in (typing.Union, types.UnionType):
        args = typing.get_args(hint)
        rest = [a for a in args if a is not type(None)]
        if len(rest) == 1:
            return rest[0], len(rest) < len(args)
    return hint, False


@functools.cache
def field_choices(cls: type) -> dict[str, tuple]:
    """{field name: its allowed values} for the fields typed with a Literal; None is among
    them where the hint allows it (`QuantizationMethods | None`)."""
    hints = typing.get_type_hints(cls)
    choices = {}
    for f in fields(cls):
        inner, optional = split_optional(hints[f.name])
        if typing.get_origin(inner) is Literal:
            choices[f.name] = typing.get_args(inner) + ((None,) if optional else ())
    return choices


def check_choices(config: object) -> None:
    """ValueError naming the first field whose value is not among its Literal's values."""
    for name, allowed in field_choices(type(config)).items():
        value = getattr(config, name)
        if value not in allowed:
            raise ValueError(f"{name} must be one of {allowed}, got {value!r}")


def check_minimums(config: object, minimums: dict[str, float]) -> None:
    """ValueError naming the first field (None is let through) below its minimum."""
    for name, minimum in minimums.items():
        value = getattr(config, name)
        if value is not None and value < minimum:
            raise ValueError(f"{name} must be >= {minimum}, got {value}")
