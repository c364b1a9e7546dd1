"""Command-line flags made from a config dataclass's fields, so each option has one default (the
field's), one help text (the field's metadata) and one validation (the dataclass's own).

A field's `dataclasses.field(metadata=...)` may hold:
  help       what the flag does (required for every exposed field)
  flag       the flag's name without the dashes, when it is not the field's name
  choices    the allowed values, shown in --help (the dataclass refuses any other)
  metavar    the placeholder --help shows for the value
  exclusive  a group name: flags of one group cannot be given together
  expose     False: no flag (set in code only)
A field without a default is a required flag. The type comes from the annotation: int, float,
str, an Optional of one of them, a Literal, a tuple of one of them (`--x A B ...`, or the flag
repeated: `--x A --x B`), or bool
(`--x` when the default is False, `--x/--no-x` when it is True). Argparse only converts; the
dataclass's constructor validates, and `as_flags` puts its messages in the words of the command
line.
"""

from __future__ import annotations

import argparse
import re
import types
import typing
from collections.abc import Collection
from dataclasses import MISSING, Field, fields
from typing import Any

METADATA_KEYS = frozenset({"help", "flag", "choices", "metavar", "exclusive", "expose"})
SCALARS = (int, float, str)


def flag_fields(cls: type, only: Collection[str] | None = None) -> list[Field[Any]]:
    """The fields of dataclass `cls` that have a flag (those named in `only`, when given)."""
    found = [f for f in fields(cls) if f.metadata.get("expose", True)
             and (only is None or f.name in only)]
    missing = sorted(set(only or ()) - {f.name for f in found})
    if missing:
        raise ValueError(f"{cls.__name__} has no exposed field(s) {missing}")
    for f in found:
        unknown = sorted(set(f.metadata) - METADATA_KEYS)
        if unknown:
            raise ValueError(f"{cls.__name__}.{f.name}: unknown flag metadata {unknown}")
        if not f.metadata.get("help"):
            raise ValueError(f"{cls.__name__}.{f.name} has a flag but no help text")
        if f.default_factory is not MISSING:
            raise ValueError(f"{cls.__name__}.{f.name}: a flag's default must be a plain value")
    return found


def flag_of(f: Field[Any]) -> str:
    return "--" + f.metadata.get("flag", f.name.replace("_", "-"))


def add_flags(parser: argparse.ArgumentParser, cls: type, title: str | None = None,
              only: Collection[str] | None = None) -> None:
    """One argument per exposed field of `cls`, its dest the field's name, its default the
    field's default; in an argument group `title` when given."""
    hints = typing.get_type_hints(cls)
    target: Any = parser.add_argument_group(title) if title else parser
    exclusive: dict[str, Any] = {}
    for f in flag_fields(cls, only):
        name = f.metadata.get("exclusive")
        if name is not None and name not in exclusive:
            exclusive[name] = target.add_mutually_exclusive_group()
        into = exclusive[name] if name is not None else target
        required = f.default is MISSING  # a field without a default: a flag one must give
        into.add_argument(flag_of(f), dest=f.name, help=f.metadata["help"], required=required,
                          **({} if required else {"default": f.default}),
                          **_argument_kind(cls, f, hints[f.name]))


def _argument_kind(cls: type, f: Field[Any], hint: Any) -> dict[str, Any]:
    """type / action, metavar of the field's flag, from its annotation and metadata."""
    if hint is bool:
        return {"action": argparse.BooleanOptionalAction if f.default else "store_true"}
    args = typing.get_args(hint)
    if typing.get_origin(hint) in (typing.Union, types.UnionType) and type(None) in args:
        rest = [a for a in args if a is not type(None)]
        hint = rest[0] if len(rest) == 1 else hint
    many = typing.get_origin(hint) is tuple  # tuple[str, ...]: a flag of several values
    if many:
        hint = typing.get_args(hint)[0]
    choices = f.metadata.get("choices")
    if typing.get_origin(hint) is typing.Literal:
        choices = choices or typing.get_args(hint)
        hint = type(choices[0])
    if hint not in SCALARS:
        raise TypeError(f"{cls.__name__}.{f.name}: a flag cannot hold {hint!r}")
    metavar = f.metadata.get("metavar")
    if metavar is None:
        metavar = ("{" + ",".join(map(str, choices)) + "}" if choices
                   else flag_of(f)[2:].upper().replace("-", "_"))
    return {"type": hint, "metavar": metavar, **({"nargs": "*", "action": _Values} if many
                                                 else {})}


class _Values(argparse.Action):
    """A flag of several values: the first use replaces the default, a repeated one adds."""

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace,
                  values: Any, option_string: str | None = None) -> None:
        before = getattr(namespace, self.dest, None)
        given = tuple(values or ())
        setattr(namespace, self.dest, given if before is self.default else (*before, *given))


def from_flags(cls: type, args: argparse.Namespace, only: Collection[str] | None = None) -> Any:
    """The dataclass from the parsed flags of `add_flags(parser, cls, only=only)` (its own
    validation refuses bad values); a field without a flag keeps its default."""
    return cls(**{f.name: getattr(args, f.name) for f in flag_fields(cls, only)})


def as_flags(message: str, classes: Collection[type]) -> str:
    """A config error in the words of the command line: `EngineConfig.page_size=3` and
    `page_size=3` become `--page-size=3`, `ServerOptions.pin_lease_ttl_s=0` `--pin-lease-ttl=0`."""
    flags = {f.name: flag_of(f) for cls in classes for f in flag_fields(cls)}
    names = "|".join(sorted(flags, key=len, reverse=True))
    return re.sub(rf"(?<![\w-])(?:[A-Z]\w*\.)?({names})=",
                  lambda found: f"{flags[found.group(1)]}=", message)
