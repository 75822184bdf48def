"""The parameters a request body takes, read from its pydantic model, for the "did you mean" of an unknown one
(``max_token``: did you mean ``max_tokens``?), at the top level or inside (``messages[0].contnt``)."""

from __future__ import annotations

import difflib
import types
from typing import Annotated, Any, Union, get_args, get_origin

from pydantic import BaseModel


def _alternatives(annotation: Any) -> list[Any]:
    """The types a value of ``annotation`` may have: the members of a union (``None`` left out), else itself."""
    if get_origin(annotation) is Annotated:
        return _alternatives(get_args(annotation)[0])
    if get_origin(annotation) in (Union, types.UnionType):
        return [t for a in get_args(annotation) if a is not type(None) for t in _alternatives(a)]
    return [annotation]


def _models(annotation: Any) -> list[type[BaseModel]]:
    return [t for t in _alternatives(annotation) if isinstance(t, type) and issubclass(t, BaseModel)]


def _inside(annotation: Any, part: str | int) -> Any:
    """The type found at ``part`` of a value of ``annotation``: a list's item, a model's field, or the union member
    that pydantic names in an error's location (``TextPart``)."""
    found: list[Any] = []
    for t in _alternatives(annotation):
        if isinstance(part, int) and get_origin(t) is list:
            found.append(get_args(t)[0])
        elif isinstance(t, type) and issubclass(t, BaseModel) and isinstance(part, str):
            if part in t.model_fields:
                found.append(t.model_fields[part].annotation)
            elif t.__name__ == part:
                found.append(t)
    return Union[tuple(found)] if len(found) > 1 else found[0] if found else None  # noqa: UP007


def nearest_param(body: Any, loc: list[str | int]) -> str | None:
    """The parameter the body's model takes next to the unknown one at ``loc`` (its path in the body) with the
    nearest spelling, or None."""
    where: Any = body
    for part in loc[:-1]:
        where = _inside(where, part)
    known = sorted({f.alias or name for m in _models(where) for name, f in m.model_fields.items()})
    near = difflib.get_close_matches(str(loc[-1]), known, n=1) if known else []
    return near[0] if near else None
