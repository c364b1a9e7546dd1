"""The expressions a program appends to its state: text, images, gen, select and role markers.

`s += rx.user("Hi") + rx.assistant(rx.gen("reply"))` builds a tree of these; the executor flattens
it into leaves and runs them in order. Plain strings become `Text`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from radixrt.frontend.lang.backend import constraint_of

ROLE_NAMES = ("system", "user", "assistant")


class Expr:
    """Anything that can be appended to a program state."""

    def __add__(self, other: Any) -> Concat:
        return Concat((self, as_expr(other)))

    def __radd__(self, other: Any) -> Concat:
        return Concat((as_expr(other), self))


@dataclass(frozen=True)
class Text(Expr):
    text: str


@dataclass(frozen=True)
class Image(Expr):
    """An image at this point of the program (rx.image): its file's bytes (PNG, JPEG, ...),
    read on the client. The text gets the model's image token here; the bytes go with every
    call whose text holds that token (the runtime decodes them)."""

    data: bytes = field(repr=False)
    source: str = ""  # where the bytes came from (a path; "" for bytes given), for messages


@dataclass(frozen=True)
class TextWithImages(Expr):
    """Text that holds the image tokens of these images, in order: what a concate_and_append
    join appends of its children (their text and the images in it)."""

    text: str
    images: tuple[bytes, ...] = field(default=(), repr=False)


@dataclass(frozen=True)
class Gen(Expr):
    """Generate text into variable `name` with SamplingParams fields `params`, its constrained
    decoding among them (regex / json_schema / choices / tool_calls: constraint_kind); with
    separate_reasoning the variable is the answer after a reasoning model's thinking."""

    name: str | None
    params: dict[str, Any] = field(default_factory=dict)
    priority: int | None = None  # None: the run's priority
    separate_reasoning: bool = False

    @property
    def constraint_kind(self) -> str | None:
        """regex / json_schema / choices / tool_calls: the constraint params carry, if any."""
        constraint = constraint_of(self.params)
        return None if constraint is None else constraint[0]


@dataclass(frozen=True)
class ToolPrompt(Expr):
    """The runtime's tool prompt (how to call, in its tool-call format) listing these tools
    (one JSON object per line)."""

    listing: str


@dataclass(frozen=True)
class Select(Expr):
    """Append the choice with the best score under `method` and store it in variable `name`."""

    name: str | None
    choices: tuple[str, ...]
    method: str
    priority: int | None = None  # None: the run's priority


@dataclass(frozen=True)
class Embed(Expr):
    """Store in variable `name` the embedding of `text`, or of the program's text so far
    (None: its prefix, cached in the runtime's radix tree, is not computed again); appends
    nothing."""

    name: str | None
    text: str | None = None
    dimensions: int | None = None
    priority: int | None = None  # None: the run's priority


@dataclass(frozen=True)
class VarScopeBegin(Expr):
    """`with s.var_scope(name):` starts: remember where the text is now."""

    name: str


@dataclass(frozen=True)
class VarScopeEnd(Expr):
    """... and ends: variable `name` is every character appended since its VarScopeBegin."""

    name: str


@dataclass(frozen=True)
class SetVar(Expr):
    """`s.set_var(name, value)`: set a variable in order with what was appended before it."""

    name: str
    value: Any


@dataclass(frozen=True)
class RoleBegin(Expr):
    role: str


@dataclass(frozen=True)
class RoleEnd(Expr):
    role: str


@dataclass(frozen=True)
class Concat(Expr):
    parts: tuple[Expr, ...]


def as_expr(value: Any) -> Expr:
    if isinstance(value, Expr):
        return value
    if isinstance(value, str):
        return Text(value)
    hook = getattr(value, "__radixrt_expr__", None)  # the tracer's placeholder arguments
    if hook is not None:
        return hook()
    raise TypeError(
        f"cannot append a {type(value).__name__} to a program state: append a str, gen(...), "
        "select(...), image(...), a role such as user(...), or a sum of those"
    )


def flatten(expr: Expr) -> list[Expr]:
    """The leaves of an expression, in order (no Concat)."""
    if isinstance(expr, Concat):
        return [leaf for part in expr.parts for leaf in flatten(part)]
    return [expr]
