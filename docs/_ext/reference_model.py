"""What the reference pages say, read from the code as plain values (no Sphinx here).

The docs site's reference pages are made at build time from the same objects the programs run
with, so they cannot drift: every ``agentcall`` command and flag from its argparse parser (the
walk of :func:`agentcall.cli.reference.command_tree`), every wire shape from ``agentcall/wire/``
(the attrs classes and the local socket's lines: wire name, fields, types, docstring), and every
option of the two twistd plugins (the relay's and the listener's ``usage.Options``).

:mod:`docs._ext.reference_directives` turns these values into docutils nodes; this module only
reads, so the unit tests check it without building anything.
"""

from __future__ import annotations

import ast
import enum
import inspect
import re
from collections.abc import Iterable, Iterator
from types import ModuleType
from typing import Any

import attrs

from agentcall.cli.reference import Command

# The modules whose shapes the wire reference lists, in the order a reader meets them.
WIRE_MODULES = (
    "agentcall.wire.frames",
    "agentcall.wire.payloads",
    "agentcall.wire.keyrecords",
    "agentcall.wire.http",
    "agentcall.wire.roles",
    "agentcall.wire.local",
    # The codes that travel in call_error frames, sealed failures and HTTP error bodies.
    "agentcall.errors",
)


# --- anchors ------------------------------------------------------------------------------------


def slug(*parts: str) -> str:
    """An HTML id from ``parts``: lower case, runs of anything else than a letter or a digit
    become one ``-`` (``slug("agentcall relay", "--database")`` is ``agentcall-relay-database``)."""
    text = "-".join(parts).lower()
    return re.sub(r"[^a-z0-9]+", "-", text).strip("-")


def command_anchor(command: Command) -> str:
    return slug(*command.path)


def flag_anchor(command: Command, flag: str) -> str:
    """The command's anchor, ``--``, the flag's (``agentcall-setup--invite``): a section's
    anchor never holds ``--``, so a flag's cannot be taken for a subcommand's."""
    return f"{command_anchor(command)}--{slug(flag)}"


# --- docstrings ---------------------------------------------------------------------------------

# A Sphinx cross-reference (:class:`~agentcall.x.Y`, :func:`f`) or a literal (``x``) in a docstring.
_MARKUP = re.compile(r":[a-z]+:`~?([^`]+)`|``([^`]+)``|`([^`]+)`")


def paragraphs(doc: str | None) -> list[str]:
    """A docstring as paragraphs of one line each (blank lines separate them)."""
    if not doc:
        return []
    text = inspect.cleandoc(doc)
    return [" ".join(block.split()) for block in re.split(r"\n\s*\n", text) if block.strip()]


def spans(text: str) -> list[tuple[str, str]]:
    """``text`` cut into ``("text", …)`` and ``("code", …)`` pieces: a role's target (its last
    dotted part when written with ``~``) and a double-backquoted literal become code."""
    pieces: list[tuple[str, str]] = []
    at = 0
    for match in _MARKUP.finditer(text):
        if match.start() > at:
            pieces.append(("text", text[at : match.start()]))
        role, literal, single = match.groups()
        if role is not None:
            short = match.group(0).split("`")[1].startswith("~")
            pieces.append(("code", role.rsplit(".", 1)[-1] if short else role))
        else:
            pieces.append(("code", literal if literal is not None else single))
        at = match.end()
    if at < len(text):
        pieces.append(("text", text[at:]))
    return pieces


def sentence(text: str) -> str:
    """``text`` with a capital first letter and a full stop (a source comment, shown as prose)."""
    text = text.strip()
    if not text:
        return ""
    text = text[0].upper() + text[1:]
    return text if text.endswith((".", "!", "?", ":", ")")) else text + "."


def type_words(annotation: str) -> list[tuple[str, bool]]:
    """``annotation`` cut into ``(piece, is_a_name)``: the names a reader may follow to their
    own entry (``"tuple[JobInfo, ...]"`` gives ``tuple``, ``[``, ``JobInfo``, ``, ...]``)."""
    pieces = re.split(r"([A-Za-z_][A-Za-z0-9_]*)", annotation)
    return [(piece, index % 2 == 1) for index, piece in enumerate(pieces) if piece]


def own_doc(cls: type[Any]) -> list[str]:
    """The class's own docstring as paragraphs (never one inherited from a base class)."""
    doc = cls.__dict__.get("__doc__")
    return paragraphs(doc if isinstance(doc, str) else None)


def field_comments(source: str, class_name: str) -> dict[str, str]:
    """``{field: comment}`` for the annotated fields of ``class_name`` in ``source``: the ``#``
    lines just above a field and the one after it on its own line, joined (why a field exists
    is written there in this code base)."""
    tree = ast.parse(source)
    lines = source.splitlines()
    found: dict[str, str] = {}
    for node in ast.walk(tree):
        if not (isinstance(node, ast.ClassDef) and node.name == class_name):
            continue
        for statement in node.body:
            if not isinstance(statement, ast.AnnAssign):
                continue
            if not isinstance(statement.target, ast.Name):
                continue
            above: list[str] = []
            row = statement.lineno - 2
            while row >= 0 and lines[row].strip().startswith("#"):
                above.insert(0, lines[row].strip().lstrip("#").strip())
                row -= 1
            line = lines[statement.lineno - 1]
            after = _trailing_comment(line)
            text = " ".join(part for part in [*above, after] if part)
            if text:
                found[statement.target.id] = text
        break
    return found


def _trailing_comment(line: str) -> str:
    """The comment ending ``line`` (outside a string), or ``""``."""
    in_string: str | None = None
    for index, char in enumerate(line):
        if in_string:
            if char == in_string:
                in_string = None
        elif char in "\"'":
            in_string = char
        elif char == "#":
            return line[index + 1 :].strip()
    return ""


# --- wire shapes --------------------------------------------------------------------------------


@attrs.frozen
class Field:
    name: str  # as written on the wire
    type: str  # the Python annotation, as written in the source
    required: bool
    default: str | None  # repr of the default, None when required
    only_when_set: bool = False  # left out of the JSON while at its default
    comment: str = ""


@attrs.frozen
class Shape:
    name: str  # the Python class
    module: str
    tag: tuple[str, str] | None  # ("type", "ready"): the JSON key and value that name it
    doc: tuple[str, ...]
    fields: tuple[Field, ...]

    @property
    def anchor(self) -> str:
        return slug("wire", self.name)


@attrs.frozen
class EnumShape:
    name: str
    module: str
    doc: tuple[str, ...]
    values: tuple[str, ...]

    @property
    def anchor(self) -> str:
        return slug("wire", self.name)


def _tag(cls: type[Any]) -> tuple[str, str] | None:
    for key in ("type", "kind"):
        value = cls.__dict__.get(key)
        if isinstance(value, str):
            return (key, value)
    return None


def _shape(cls: type[Any], fields: list[Field]) -> Shape:
    return Shape(
        name=cls.__name__,
        module=cls.__module__,
        tag=_tag(cls),
        doc=tuple(own_doc(cls)),
        fields=tuple(fields),
    )


def attrs_shape(cls: type[Any], source: str) -> Shape:
    """An attrs wire class as a :class:`Shape`."""
    comments = field_comments(source, cls.__name__)
    # As written in the source: a.type is replaced by the class itself once anything resolves
    # the annotations (attrs.resolve_types), and then reads with its module's path.
    annotations = inspect.get_annotations(cls)
    fields = []
    for a in attrs.fields(cls):
        required = a.default is attrs.NOTHING
        fields.append(
            Field(
                name=a.name.rstrip("_") if a.name.endswith("_") else a.name,
                type=_type_text(annotations.get(a.name, a.type)),
                required=required,
                default=None if required else _default_text(a.default),
                only_when_set=bool(a.metadata.get("agentcall.omit_if_default")),
                comment=comments.get(a.name, ""),
            )
        )
    return _shape(cls, fields)


def line_shape(cls: type[Any], source: str) -> Shape:
    """A line of the local socket (a :class:`~agentcall.frozen.Frozen` class with ``_specs``)."""
    comments = field_comments(source, cls.__name__)
    annotations = inspect.get_annotations(cls)
    defaults = {
        name: p.default
        for name, p in inspect.signature(cls.__init__).parameters.items()
        if p.default is not inspect.Parameter.empty
    }
    fields = []
    for spec in cls._specs:
        has_default = spec.name in defaults
        fields.append(
            Field(
                name=spec.wire,
                type=_type_text(annotations.get(spec.name, "")),
                required=bool(spec.required),
                default=_default_text(defaults[spec.name]) if has_default else None,
                comment=comments.get(spec.name, ""),
            )
        )
    return _shape(cls, fields)


def enum_shape(cls: type[enum.Enum]) -> EnumShape:
    return EnumShape(
        name=cls.__name__,
        module=cls.__module__,
        doc=tuple(own_doc(cls)),
        values=tuple(str(member.value) for member in cls),
    )


def _type_text(annotation: object) -> str:
    if isinstance(annotation, str):
        return annotation
    if isinstance(annotation, type):
        return annotation.__name__
    # A resolved union or generic: its names without their modules' paths.
    return re.sub(r"\b(?:[A-Za-z_]\w*\.)+([A-Za-z_]\w*)", r"\1", str(annotation))


def _default_text(value: object) -> str:
    if isinstance(value, attrs.Factory):  # type: ignore[arg-type]
        return "(made anew)"
    if isinstance(value, enum.Enum):
        return repr(str(value.value))
    return repr(value)


def is_line_class(value: object) -> bool:
    """A line of the local socket: a class with its own ``_specs`` and a ``type`` tag."""
    return isinstance(value, type) and "_specs" in value.__dict__ and "type" in value.__dict__


def module_shapes(module: ModuleType) -> list[Shape | EnumShape]:
    """Every wire class and enumeration defined in ``module``, in source order."""
    source = inspect.getsource(module)
    found: list[Shape | EnumShape] = []
    for value in vars(module).values():
        if not isinstance(value, type) or value.__module__ != module.__name__:
            continue
        if value.__name__.startswith("_"):
            continue
        if issubclass(value, enum.Enum):
            found.append(enum_shape(value))
        elif attrs.has(value):
            found.append(attrs_shape(value, source))
        elif is_line_class(value):
            found.append(line_shape(value, source))
    return found


def wire_modules() -> list[ModuleType]:
    import importlib

    return [importlib.import_module(name) for name in WIRE_MODULES]


# --- twistd options -----------------------------------------------------------------------------


@attrs.frozen
class DaemonOption:
    long: str
    short: str | None
    takes_value: bool
    default: str | None
    help: str

    def anchor(self, program: str) -> str:
        return f"{slug(program)}--{slug(self.long)}"


# Twisted adds these two to every usage.Options; twistd documents them itself.
_TWISTED_OWN = frozenset({"help", "version"})


def daemon_options(options: Any) -> list[DaemonOption]:
    """Every option of a ``twisted.python.usage.Options`` instance, as Twisted itself gathered
    them (flags, parameters and ``opt_`` methods alike), in the order Twisted lists them."""
    shorts = {long: short for short, long in options.synonyms.items() if len(short) == 1}
    found = []
    for entry in options.longOpt:
        long = entry.rstrip("=")
        if long in _TWISTED_OWN or options.synonyms.get(long, long) != long:
            continue
        takes_value = entry.endswith("=")
        default = options.defaults.get(long) if takes_value else None
        found.append(
            DaemonOption(
                long=long,
                short=shorts.get(long),
                takes_value=takes_value,
                default=None if default is None else str(default),
                help=" ".join(str(options.docs.get(long, "")).split()),
            )
        )
    return found


def option_longdesc(options: Any) -> str:
    return " ".join(str(getattr(options, "longdesc", "")).split())


# --- the CLI ------------------------------------------------------------------------------------


def commands(tree: Command) -> Iterator[Command]:
    """Every command of ``tree`` below the program itself, parents before their subcommands."""
    walk = tree.walk()
    next(walk)
    yield from walk


def usage_line(command: Command) -> str:
    """A short synopsis: the command, ``SUBCOMMAND`` when it has any, its positionals, and
    ``[OPTIONS]`` when it has options."""
    parts = [command.name]
    if command.subcommands:
        parts.append("SUBCOMMAND")
    parts += [p.metavar or p.flags[0].upper() for p in command.positionals]
    if command.options:
        parts.append("[OPTIONS]")
    return " ".join(parts)


def flag_names(commands_: Iterable[Command]) -> list[tuple[Command, str]]:
    """``(command, flag)`` for every option flag and positional of ``commands_``."""
    return [
        (command, flag)
        for command in commands_
        for option in (*command.positionals, *command.options)
        for flag in option.flags
    ]
