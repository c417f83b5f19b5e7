"""A flat config dataclass parsed by tyro with its ``--help`` in named groups.

tyro draws one box per nested dataclass. The trainer's configs are flat (``train()``
reads ``config.num_envs``), so `parse_grouped` builds, from the flat class, one
dataclass per group (flags keep their names: no prefix), parses the command line with
it and returns an instance of the flat class. Help texts are the fields' docstrings.
"""

from __future__ import annotations

import ast
import dataclasses
import inspect
import textwrap
import typing
from collections.abc import Mapping, Sequence
from typing import Annotated, Any, TypeVar

import tyro

__all__ = ["Group", "field_docs", "grouped_class", "parse_grouped", "to_flat"]

T = TypeVar("T")


@dataclasses.dataclass(frozen=True)
class Group:
    """One box of ``--help``: a title, a line saying what the flags are for, the fields."""

    name: str
    """Box title (a Python identifier; tyro shows it with dashes)."""
    description: str
    """Line under the title."""
    fields: tuple[str, ...]
    """Field names of the flat class, in the order shown."""


def field_docs(cls: type) -> dict[str, str]:
    """Each field's docstring (the string literal under it), looked up along the MRO.

    Args:
        cls: a dataclass whose source is available.

    Returns:
        Field name -> docstring on one line (a subclass's own docstring wins; a field a
        subclass redefines without one keeps its base class's).
    """
    docs: dict[str, str] = {}
    for klass in reversed(cls.__mro__):
        if not dataclasses.is_dataclass(klass):
            continue
        tree = ast.parse(textwrap.dedent(inspect.getsource(klass)))
        body = tree.body[0].body  # type: ignore[attr-defined]
        for node, after in zip(body, body[1:], strict=False):
            if (
                isinstance(node, ast.AnnAssign)
                and isinstance(node.target, ast.Name)
                and isinstance(after, ast.Expr)
                and isinstance(after.value, ast.Constant)
                and isinstance(after.value.value, str)
            ):
                docs[node.target.id] = " ".join(after.value.value.split())
    return docs


def grouped_class(
    flat: type,
    top: Sequence[str],
    groups: Sequence[Group],
    *,
    hints: Mapping[str, str] | None = None,
    hidden: Sequence[str] = (),
) -> type:
    """The CLI dataclass: ``top`` fields first (tyro's "options" box), then one nested
    dataclass per group, all flags without a prefix.

    Args:
        flat: the flat config dataclass; its defaults are the CLI's defaults.
        top: fields shown first, outside any group.
        groups: the other boxes, in order.
        hints: field -> text shown in place of tyro's "(default: ...)".
        hidden: fields left out of ``--help`` and the command line (they keep their default).

    Returns:
        A dataclass for ``tyro.cli``; `to_flat` turns its instances into ``flat``'s.

    Raises:
        ValueError: if a field of ``flat`` is in no group, in two, or not a field of ``flat``.
    """
    hints = dict(hints or {})
    types = typing.get_type_hints(flat, include_extras=True)
    defaults = {f.name: f for f in dataclasses.fields(flat)}
    docs = field_docs(flat)
    placed = [*top, *(n for g in groups for n in g.fields), *hidden]
    unknown = sorted(set(placed) - set(defaults))
    twice = sorted({n for n in placed if placed.count(n) > 1})
    missing = [n for n in defaults if n not in placed]
    if unknown or twice or missing:
        raise ValueError(
            f"groups of {flat.__name__}: unknown fields {unknown}, fields in two places "
            f"{twice}, fields in no group {missing}"
        )

    def spec(name: str, suppress: bool = False) -> tuple[str, Any, dataclasses.Field]:
        f = defaults[name]
        marker = tyro.conf.arg(help=docs.get(name, ""), help_behavior_hint=hints.get(name))
        kind = (
            Annotated[types[name], marker, tyro.conf.Suppress]
            if suppress
            else Annotated[types[name], marker]
        )
        if f.default is not dataclasses.MISSING:
            return name, kind, dataclasses.field(default=f.default)
        return name, kind, dataclasses.field(default_factory=f.default_factory)  # type: ignore[arg-type]

    fields: list[tuple[str, Any, dataclasses.Field]] = [spec(n) for n in top]
    for group in groups:
        cls = dataclasses.make_dataclass(group.name, [spec(n) for n in group.fields])
        cls.__doc__ = group.description
        kind = Annotated[cls, tyro.conf.OmitArgPrefixes, tyro.conf.arg(help=group.description)]
        fields.append((group.name, kind, dataclasses.field(default_factory=cls)))
    fields += [spec(n, suppress=True) for n in hidden]
    cli = dataclasses.make_dataclass(f"{flat.__name__}Cli", fields)
    cli.__doc__ = flat.__doc__
    cli._flat = flat  # type: ignore[attr-defined]
    cli._groups = tuple(g.name for g in groups)  # type: ignore[attr-defined]
    return cli


def to_flat(cli_config: Any) -> Any:
    """The flat config of a parsed `grouped_class` instance."""
    cls = type(cli_config)
    values = {
        f.name: getattr(cli_config, f.name)
        for f in dataclasses.fields(cls)
        if f.name not in cls._groups
    }
    for name in cls._groups:
        group = getattr(cli_config, name)
        values.update({f.name: getattr(group, f.name) for f in dataclasses.fields(group)})
    return cls._flat(**values)


def parse_grouped(cli: type, args: Sequence[str] | None = None, prog: str | None = None) -> Any:
    """Parse ``args`` (None: ``sys.argv[1:]``) with ``cli`` and return the flat config.

    Raises:
        SystemExit: on ``--help`` or a bad flag (tyro's message).
    """
    return to_flat(tyro.cli(cli, args=args, prog=prog))
