"""The docs site: its reference pages hold every command, flag, wire shape and daemon option.

The pure reads behind the reference (``docs/_ext/reference_model.py``) are checked with plain
values. One module-scoped build of the whole site (Sphinx, warnings as errors, offline) is then
compared with the parser, the wire classes and the twistd option tables, each walked here
independently of the walk the pages are made from, so a command, flag, shape or option the
generator skipped fails a test.
"""

from __future__ import annotations

import argparse
import enum
import html
import re
import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import attrs
import pytest
from twisted.python import usage

from agentcall.cli.main import build_parser
from agentcall.compose.listen import Options as ListenOptions
from agentcall.relay.tap import Options as RelayOptions
from agentcall.wire import frames, keyrecords, local
from docs._ext import reference_model as model

REPO = Path(__file__).resolve().parents[2]


# --- plain reads ----------------------------------------------------------------------------


def test_slug_makes_html_ids_of_words_and_flags() -> None:
    assert model.slug("agentcall", "relay", "backup") == "agentcall-relay-backup"
    assert model.slug("agentcall.wire.frames") == "agentcall-wire-frames"
    assert model.slug("--Max_Handshakes") == "max-handshakes"


def test_a_flag_anchor_cannot_be_taken_for_a_subcommand_anchor() -> None:
    tree = model.commands(_tree())
    config = next(c for c in tree if c.path == ("agentcall", "config"))
    get = next(c for c in config.subcommands if c.path[-1] == "get")
    assert model.command_anchor(get) == "agentcall-config-get"
    assert model.flag_anchor(config, "--get") == "agentcall-config--get"


def test_paragraphs_split_on_blank_lines_and_join_wrapped_lines() -> None:
    doc = """First line
        goes on.

        Second.
    """
    assert model.paragraphs(doc) == ["First line goes on.", "Second."]
    assert model.paragraphs(None) == []
    assert model.paragraphs("") == []


def test_spans_turn_roles_and_literals_into_code() -> None:
    text = "See :class:`~agentcall.wire.local.LocalCall`, ``type`` and :func:`a.b` or `x`."
    assert model.spans(text) == [
        ("text", "See "),
        ("code", "LocalCall"),
        ("text", ", "),
        ("code", "type"),
        ("text", " and "),
        ("code", "a.b"),
        ("text", " or "),
        ("code", "x"),
        ("text", "."),
    ]
    assert model.spans("plain") == [("text", "plain")]


SOURCE = '''
class Shape:
    """Doc."""

    # why the first
    # field is here
    first: int = 1  # and a note
    second: str = "a # not a comment"
    third: str  # only after
    plain: str

class Other:
    # not Shape's
    first: int
'''


def test_field_comments_are_the_lines_above_and_the_one_after() -> None:
    assert model.field_comments(SOURCE, "Shape") == {
        "first": "why the first field is here and a note",
        "third": "only after",
    }
    assert model.field_comments(SOURCE, "Other") == {"first": "not Shape's"}
    assert model.field_comments(SOURCE, "Missing") == {}


def test_an_attrs_shape_has_wire_names_defaults_and_its_tag() -> None:
    shape = model.attrs_shape(frames.IncomingCall, _source(frames))
    assert shape.tag == ("type", "incoming_call")
    by_name = {f.name: f for f in shape.fields}
    assert "from" in by_name and "from_" not in by_name  # as on the wire
    assert by_name["call_id"].required and by_name["call_id"].default is None
    assert not by_name["groups"].required and by_name["groups"].default == "()"
    assert by_name["caller_keys"].only_when_set
    assert by_name["caller_keys"].type == "KeysResponse | None"
    assert "relay-verified" in by_name["from"].comment
    # Only its own docstring: IncomingCall has none, and none is borrowed from a base class.
    assert shape.doc == ()
    assert model.attrs_shape(frames.Ready, _source(frames)).doc[0].startswith("The relay's first")


def test_a_local_line_has_its_wire_names_requirement_and_defaults() -> None:
    shape = model.line_shape(local.LocalCall, _source(local))
    assert shape.tag == ("type", "call")
    by_name = {f.name: f for f in shape.fields}
    assert "continue" in by_name and "continue_" not in by_name
    assert by_name["target"].required and by_name["target"].type == "str"
    assert not by_name["queue"].required and by_name["queue"].default == "True"


def test_types_read_as_written_even_once_resolved() -> None:
    """Other code may resolve the annotations of the wire classes; the page still names them
    as the source does."""

    @attrs.frozen
    class Resolved:
        keys: keyrecords.KeysResponse | None
        count: int

    attrs.resolve_types(Resolved, globals(), {"keyrecords": keyrecords})
    assert not isinstance(attrs.fields(Resolved).keys.type, str)  # resolved: no longer text
    shape = model.attrs_shape(Resolved, "")
    assert [f.type for f in shape.fields] == ["keyrecords.KeysResponse | None", "int"]
    assert model._type_text(keyrecords.KeysResponse | None) == "KeysResponse | None"
    assert model._type_text(tuple[frames.Ready, ...]) == "tuple[Ready, ...]"
    assert model._type_text(int) == "int"


def test_an_enumeration_lists_its_values() -> None:
    shape = model.enum_shape(frames.CallState)
    assert shape.values == ("ringing", "answered", "working")
    assert model.enum_shape(frames.JobError).doc[0].startswith("What a listener reports")


class _Sample(usage.Options):
    optFlags = [["quiet", "q", "Say less."]]
    optParameters = [["port", "p", "8080", "Where to\n   listen."], ["name", None, None, "Who."]]

    def opt_extra(self, value: str) -> None:
        """An option of its own method."""


def test_daemon_options_are_read_as_twisted_gathers_them() -> None:
    found = {o.long: o for o in model.daemon_options(_Sample())}
    assert set(found) == {"quiet", "port", "name", "extra"}  # not help, version, nor -p
    assert found["port"] == model.DaemonOption("port", "p", True, "8080", "Where to listen.")
    assert found["quiet"] == model.DaemonOption("quiet", "q", False, None, "Say less.")
    assert found["name"].default is None
    assert found["extra"].takes_value and found["extra"].help == "An option of its own method."
    assert found["port"].anchor("agentcall-relay") == "agentcall-relay--port"


def test_usage_line_names_subcommands_positionals_and_options() -> None:
    by_path = {c.path: c for c in model.commands(_tree())}
    assert model.usage_line(by_path[("agentcall", "members")]).startswith(
        "agentcall members SUBCOMMAND"
    )
    assert model.usage_line(by_path[("agentcall", "block")]) == "agentcall block HANDLE [OPTIONS]"


def test_a_comment_is_shown_as_a_sentence() -> None:
    assert model.sentence("the recipient's key epoch") == "The recipient's key epoch."
    assert model.sentence(" Done. ") == "Done."
    assert model.sentence("ends (so)") == "Ends (so)"
    assert model.sentence("") == ""


def test_type_words_pick_out_the_names_to_link() -> None:
    assert model.type_words("tuple[JobInfo, ...]") == [
        ("tuple", True),
        ("[", False),
        ("JobInfo", True),
        (", ...]", False),
    ]
    assert model.type_words("str | None") == [("str", True), (" | ", False), ("None", True)]


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The whole site built once, as CI builds it: warnings are errors, nothing fetched."""
    pytest.importorskip("sphinx", reason="the docs extra (Sphinx, MyST) is not installed")
    pytest.importorskip("myst_parser", reason="the docs extra (Sphinx, MyST) is not installed")
    out = tmp_path_factory.mktemp("site")
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "sphinx",
            "-W",
            "--keep-going",
            "-q",
            "-E",
            "-b",
            "html",
            "-d",
            str(out / "doctrees"),
            str(REPO / "docs"),
            str(out / "html"),
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stderr == "", done.stderr
    return out / "html"


def _ids(page: Path) -> list[str]:
    return [html.unescape(i) for i in re.findall(r'\bid="([^"]+)"', page.read_text("utf-8"))]


@pytest.mark.slow
def test_no_page_repeats_an_id(site: Path) -> None:
    for page in site.rglob("*.html"):
        repeated = [i for i, n in Counter(_ids(page)).items() if n > 1]
        assert not repeated, (page.name, repeated)


def _parser_walk(
    parser: argparse.ArgumentParser, path: tuple[str, ...]
) -> list[tuple[tuple[str, ...], str | None]]:
    """(command path, flag or None) for the parser and every subparser, read from argparse."""
    found: list[tuple[tuple[str, ...], str | None]] = [(path, None)]
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, child in action.choices.items():
                found += _parser_walk(child, (*path, name))
        elif action.help is not argparse.SUPPRESS:
            for flag in action.option_strings or [action.dest]:
                found.append((path, flag))
    return found


@pytest.mark.slow
def test_every_command_and_flag_of_the_parser_has_an_entry(site: Path) -> None:
    ids = set(_ids(site / "reference" / "cli.html"))
    walked = _parser_walk(build_parser(), ("agentcall",))
    commands = {path for path, flag in walked if flag is None and len(path) > 1}
    assert len(commands) > 40  # the walk itself reached the subcommands
    for path, flag in walked:
        if len(path) == 1:
            continue  # the program's own --help and --version: the man page's business
        anchor = model.slug(*path)
        expected = anchor if flag is None else f"{anchor}--{model.slug(flag)}"
        assert expected in ids, (path, flag)


def _wire_classes() -> list[type[Any]]:
    found: list[type[Any]] = []
    for name in model.WIRE_MODULES:
        module = sys.modules.get(name) or __import__(name, fromlist=["_"])
        for value in vars(module).values():
            if not isinstance(value, type) or value.__module__ != name:
                continue
            if value.__name__.startswith("_"):
                continue
            if attrs.has(value) or issubclass(value, enum.StrEnum):
                found.append(value)
    return found


@pytest.mark.slow
def test_every_wire_shape_has_an_entry_with_each_of_its_fields(site: Path) -> None:
    page = (site / "reference" / "wire.html").read_text("utf-8")
    ids = set(_ids(site / "reference" / "wire.html"))
    every: set[type[Any]] = {
        *_wire_classes(),
        *frames.FRAME_TYPES.values(),
        *local.LOCAL_TYPES.values(),
    }
    assert frames.CallRequest in every and local.LocalJobsEnded in every
    for cls in every:
        anchor = model.slug("wire", cls.__name__)
        assert anchor in ids, cls
        # The entry runs from its own id to the next entry's.
        start = page.index(f'id="{anchor}"')
        following = [page.find(f'id="{model.slug("wire", o.__name__)}"', start + 1) for o in every]
        end = min([p for p in following if p > start] or [len(page)])
        entry = page[start:end]
        if attrs.has(cls):
            names = [a.name.rstrip("_") for a in attrs.fields(cls)]
        elif isinstance(cls, type) and issubclass(cls, enum.Enum):
            names = [str(m.value) for m in cls]
        else:
            names = [spec.wire for spec in cls._specs]
        for name in names:
            assert f">{html.escape(name)}</span>" in entry, (cls, name)
        tag = cls.__dict__.get("type")
        if isinstance(tag, str):
            assert f"&quot;{tag}&quot;</span>" in entry, cls


@pytest.mark.slow
def test_every_option_of_both_daemons_has_an_entry(site: Path) -> None:
    ids = set(_ids(site / "reference" / "daemons.html"))
    for program, options in (
        ("agentcall-relay", RelayOptions),
        ("agentcall-listen", ListenOptions),
    ):
        declared = [row[0] for row in (*options.optParameters, *options.optFlags)]
        gathered = [o.rstrip("=") for o in options().longOpt if o not in ("help", "version")]
        assert declared and set(declared) <= set(gathered)
        for long in gathered:
            assert f"{program}--{long}" in ids, (program, long)


@pytest.mark.slow
def test_the_index_reaches_every_guide_and_reference_page(site: Path) -> None:
    index = (site / "index.html").read_text("utf-8")
    for name in ("user", "owner", "administration", "operations", "packaging", "permissions"):
        assert f'href="{name}.html"' in index, name
    for name in ("cli", "wire", "daemons"):
        assert f'href="reference/{name}.html"' in index, name
    for source in (REPO / "docs").glob("*.md"):  # agents.md and a2a.md too, once they exist
        if source.stem != "index":
            assert f'href="{source.stem}.html"' in index, source.name


# --- helpers --------------------------------------------------------------------------------


def _tree() -> Any:
    from agentcall.cli.reference import command_tree

    return command_tree()


def _source(module: Any) -> str:
    import inspect

    return inspect.getsource(module)
