"""A Sphinx extension: the reference pages, made from the code while the docs are built.

Three directives, each used once in ``docs/reference/``:

- ``agentcall-cli``: every ``agentcall`` command, its subcommands, positionals and flags;
- ``agentcall-wire``: every wire shape of ``agentcall/wire/`` (frames, sealed payloads, key
  records, HTTP bodies, the local socket's lines) and the enumerations their fields use;
- ``agentcall-daemons``: every option of ``twistd agentcall-relay`` and ``twistd
  agentcall-listen``.

The values come from :mod:`docs._ext.reference_model` (plain reads, unit tested); this module
only turns them into docutils nodes, with a stable id on every command, flag, shape and option
so a page (or a test) can link to it. Each page depends on the source files it is made from, so
an incremental build remakes it when they change.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from docutils import nodes
from sphinx.application import Sphinx
from sphinx.util.docutils import SphinxDirective

import agentcall
from agentcall.cli.reference import Command, command_tree
from docs._ext import reference_model as model

_PACKAGE = Path(agentcall.__file__).parent
_HERE = Path(__file__).parent


def _paragraph(text: str) -> nodes.paragraph:
    para = nodes.paragraph()
    for kind, piece in model.spans(text):
        para += nodes.literal(piece, piece) if kind == "code" else nodes.Text(piece)
    return para


def _section(anchor: str, title: str, *, code: bool = False) -> nodes.section:
    section = nodes.section(ids=[anchor])
    heading = nodes.title()
    heading += nodes.literal(title, title) if code else nodes.Text(title)
    section += heading
    return section


def _table(headers: list[str], rows: list[list[nodes.Node]]) -> nodes.table:
    table = nodes.table()
    group = nodes.tgroup(cols=len(headers))
    table += group
    group.extend(nodes.colspec(colwidth=1) for _ in headers)
    head = nodes.thead()
    head_row = nodes.row()
    for title in headers:
        head_row += nodes.entry("", nodes.paragraph(text=title))
    head += head_row
    group += head
    body = nodes.tbody()
    for cells in rows:
        row = nodes.row()
        for cell in cells:
            row += nodes.entry("", cell)
        body += row
    group += body
    return table


def _definition(ids: list[str], term_text: str, paras: list[str]) -> nodes.definition_list_item:
    item = nodes.definition_list_item()
    term = nodes.term(ids=ids)
    term += nodes.literal(term_text, term_text)
    item += term
    definition = nodes.definition()
    definition.extend(_paragraph(p) for p in paras if p)
    item += definition
    return item


class _Reference(SphinxDirective):
    has_content = False

    def depend_on(self, *relative: str) -> None:
        """Remake the page when these files of the package (or this extension) change."""
        for name in relative:
            for path in sorted(_PACKAGE.glob(name)):
                self.env.note_dependency(str(path))
        for path in sorted(_HERE.glob("*.py")):
            self.env.note_dependency(str(path))


# --- the CLI ------------------------------------------------------------------------------------


def _command_section(command: Command) -> nodes.section:
    section = _section(model.command_anchor(command), command.name, code=True)
    if command.summary:
        section += _paragraph(command.summary)
    if command.description and command.description != command.summary:
        section += _paragraph(command.description)
    usage = model.usage_line(command)
    section += nodes.literal_block(usage, usage, language="text")
    entries = nodes.definition_list()
    for option in (*command.positionals, *command.options):
        term = ", ".join(option.flags) + (f" {option.metavar}" if option.metavar else "")
        paras = [option.help]
        if option.choices:
            paras.append("One of: " + ", ".join(f"``{c}``" for c in option.choices) + ".")
        ids = [model.flag_anchor(command, flag) for flag in option.flags]
        entries += _definition(ids, term, paras)
    if len(entries):
        section += entries
    for sub in command.subcommands:
        section += _command_section(sub)
    return section


class CliReference(_Reference):
    def run(self) -> list[nodes.Node]:
        self.depend_on("cli/*.py")
        tree = command_tree()
        return [_command_section(command) for command in tree.subcommands]


# --- the wire -----------------------------------------------------------------------------------


def _type_cell(annotation: str, anchors: dict[str, str]) -> nodes.paragraph:
    """The annotation as code, each name of a shape on the page a link to its entry."""
    para = nodes.paragraph()
    for piece, is_name in model.type_words(annotation):
        code = nodes.literal(piece, piece)
        if is_name and piece in anchors:
            para += nodes.reference("", "", code, refid=anchors[piece], internal=True)
        else:
            para += code
    return para


def _shape_section(shape: model.Shape | model.EnumShape, anchors: dict[str, str]) -> nodes.section:
    section = _section(shape.anchor, shape.name, code=True)
    if isinstance(shape, model.EnumShape):
        section.extend(_paragraph(p) for p in shape.doc)
        section += _paragraph("Values: " + ", ".join(f"``{v}``" for v in shape.values) + ".")
        return section
    if shape.tag is not None:
        key, value = shape.tag
        section += _paragraph(f'Named on the wire by ``"{key}": "{value}"``.')
    section.extend(_paragraph(p) for p in shape.doc)
    if not shape.fields:
        section += _paragraph("No fields.")
        return section
    rows: list[list[nodes.Node]] = []
    for field in shape.fields:
        notes = []
        if field.required:
            notes.append("Required.")
        else:
            notes.append(f"Default ``{field.default}``.")
        if field.only_when_set:
            notes.append("Left out while at its default.")
        if field.comment:
            notes.append(model.sentence(field.comment))
        rows.append(
            [
                nodes.paragraph("", "", nodes.literal(field.name, field.name)),
                _type_cell(field.type, anchors),
                _paragraph(" ".join(notes)),
            ]
        )
    section += _table(["Field", "Type", "Notes"], rows)
    return section


_MODULE_TITLES = {
    "agentcall.wire.frames": "WebSocket frames",
    "agentcall.wire.payloads": "Sealed payloads (inside an envelope)",
    "agentcall.wire.keyrecords": "Published key records",
    "agentcall.wire.http": "HTTP bodies",
    "agentcall.wire.roles": "Roles and agent kinds",
    "agentcall.wire.local": "Local socket lines",
    "agentcall.errors": "Error codes",
}


# Which paragraph of the module's docstring opens its section (the first, unless named here).
_INTRO = {"agentcall.errors": 1}


class WireReference(_Reference):
    def run(self) -> list[nodes.Node]:
        self.depend_on("wire/*.py")
        self.env.note_dependency(str(_PACKAGE / "errors.py"))
        modules = model.wire_modules()
        shapes = {module.__name__: model.module_shapes(module) for module in modules}
        anchors = {s.name: s.anchor for found in shapes.values() for s in found}
        sections: list[nodes.Node] = []
        for module in modules:
            title = _MODULE_TITLES[module.__name__]
            section = _section(model.slug(module.__name__), title)
            intro = model.paragraphs(module.__doc__)
            at = _INTRO.get(module.__name__, 0)
            section.extend(_paragraph(p) for p in intro[at : at + 1])
            source = module.__name__.replace(".", "/") + ".py"
            section += _paragraph(f"Defined in ``{source}``.")
            for shape in shapes[module.__name__]:
                section += _shape_section(shape, anchors)
            sections.append(section)
        return sections


# --- the daemons --------------------------------------------------------------------------------


def _daemon_section(program: str, options: Any) -> nodes.section:
    section = _section(model.slug(program), f"twistd {program}", code=True)
    section += _paragraph(model.option_longdesc(options))
    entries = nodes.definition_list()
    for option in model.daemon_options(options):
        term = f"--{option.long}" + (" VALUE" if option.takes_value else "")
        if option.short:
            term += f", -{option.short}" + (" VALUE" if option.takes_value else "")
        default = f"Default: ``{option.default}``." if option.default is not None else ""
        entries += _definition([option.anchor(program)], term, [option.help, default])
    section += entries
    return section


class DaemonReference(_Reference):
    def run(self) -> list[nodes.Node]:
        self.depend_on("relay/tap.py", "compose/listen.py")
        from agentcall.compose.listen import Options as ListenOptions
        from agentcall.relay.tap import Options as RelayOptions

        return [
            _daemon_section("agentcall-relay", RelayOptions()),
            _daemon_section("agentcall-listen", ListenOptions()),
        ]


def setup(app: Sphinx) -> dict[str, Any]:
    app.add_directive("agentcall-cli", CliReference)
    app.add_directive("agentcall-wire", WireReference)
    app.add_directive("agentcall-daemons", DaemonReference)
    return {"parallel_read_safe": True, "parallel_write_safe": True, "version": "1"}
