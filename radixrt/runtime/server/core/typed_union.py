"""A list item validated as the model its "type" names: Anthropic's content blocks, the
Responses API's input items. pydantic then reports the errors of that model only (a text block
without its text says so), and a type no model names is validated as the `other` model, for
the handler to refuse by name."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Annotated, Any, Union

from pydantic import BaseModel, Discriminator, Tag

OTHER = "other"


def by_type(models: Mapping[str, type[BaseModel]], other: type[BaseModel],
            absent: str | None = None) -> Any:
    """The annotated union; absent: the type of an item that names none."""
    def tag(value: Any) -> str:
        kind = value.get("type", absent) if isinstance(value, dict) else \
            getattr(value, "type", absent)
        return kind if isinstance(kind, str) and kind in models else OTHER

    members = tuple(Annotated[model, Tag(name)] for name, model in models.items())
    return Annotated[Union[(*members, Annotated[other, Tag(OTHER)])],  # noqa: UP007
                     Discriminator(tag)]
