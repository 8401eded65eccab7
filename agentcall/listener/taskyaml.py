"""The small, safe subset of YAML that a SKILL.md frontmatter may use.

Owners write task frontmatter by hand, and the listener reads it for every call, so the parser
is deliberately tiny and strict rather than a general YAML engine (no PyYAML dependency, no
tags, anchors, aliases, flow maps, block scalars or multi-line plain scalars — nothing that
could build an object or surprise a reader). What it accepts reads the same in real YAML:

* ``key: value`` pairs at column 0, one per line, each key at most once;
* values: plain scalars, ``"double"`` (with ``\\" \\\\ \\n \\t`` escapes) or ``'single'``
  (``''`` for a quote) strings, integers, ``true``/``false``;
* lists, either inline ``[a, "b, c", 3]`` on one line or as a block of indented ``- item`` lines
  under a key with no value;
* blank lines and ``#`` comments (a whole line, or after a value following a space).

Anything else raises :class:`FrontmatterError` with the 1-based line number in the file.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Final, TypeAlias

import attrs

Scalar: TypeAlias = str | int | bool
Value: TypeAlias = Scalar | list[Scalar] | None

_KEY = re.compile(r"([A-Za-z_][A-Za-z0-9_-]*)[ \t]*:(?:[ \t]+|\Z)(.*)\Z")
_INTEGER = re.compile(r"[-+]?[0-9]{1,18}\Z")
_BOOLEANS: Final = {"true": True, "True": True, "false": False, "False": False}
_NULLS: Final = frozenset({"null", "Null", "NULL", "~"})
# A plain scalar may not start with these: in YAML they begin something this parser refuses.
_INDICATORS: Final = frozenset("[]{}&*!|>%@`,?")
_ESCAPES: Final = {'"': '"', "\\": "\\", "n": "\n", "t": "\t", "/": "/"}


class FrontmatterError(Exception):
    """The frontmatter is not in the supported subset; ``line`` is 1-based within the file."""

    def __init__(self, line: int, message: str) -> None:
        super().__init__(message)
        self.line = line
        self.message = message


@attrs.frozen
class Entry:
    """One ``key: value`` of the frontmatter and the line it starts on."""

    value: Value
    line: int


def _plain(text: str, line: int) -> Scalar | None:
    """A plain (unquoted) scalar whose trailing comment is already removed."""
    if text[0] in _INDICATORS or text.startswith("- ") or text == "-":
        raise FrontmatterError(line, f"unsupported YAML at {text[:20]!r}; quote the value")
    if ": " in text or text.endswith(":"):
        raise FrontmatterError(line, "a ': ' inside a value needs quotes around the value")
    if text in _NULLS:
        return None
    if text in _BOOLEANS:
        return _BOOLEANS[text]
    if _INTEGER.match(text):
        return int(text)
    return text


def _strip_comment(text: str) -> str:
    """Drop a ``#`` comment that follows whitespace in unquoted text."""
    match = re.search(r"(?:^|[ \t])#", text)
    if match is not None:
        text = text[: match.start()]
    return text.rstrip(" \t")


def _quoted(text: str, line: int) -> tuple[str, str]:
    """Read a quoted string at the start of ``text``; returns it and the rest of the text."""
    quote = text[0]
    out: list[str] = []
    index = 1
    while index < len(text):
        char = text[index]
        if quote == "'" and char == "'":
            if text.startswith("''", index):
                out.append("'")
                index += 2
                continue
            return "".join(out), text[index + 1 :]
        if quote == '"' and char == '"':
            return "".join(out), text[index + 1 :]
        if quote == '"' and char == "\\":
            escaped = text[index + 1 : index + 2]
            if escaped not in _ESCAPES:
                raise FrontmatterError(line, f"unsupported escape \\{escaped} in a quoted string")
            out.append(_ESCAPES[escaped])
            index += 2
            continue
        out.append(char)
        index += 1
    raise FrontmatterError(line, "a quoted string is not closed on the same line")


def _scalar(text: str, line: int) -> Scalar | None:
    """A whole value that is one scalar, quoted or plain, with an optional comment."""
    if text[0] in "\"'":
        value, rest = _quoted(text, line)
        if _strip_comment(rest):
            raise FrontmatterError(line, "unexpected text after a quoted string")
        return value
    plain = _strip_comment(text)
    return _plain(plain, line) if plain else None


def _item(text: str, line: int) -> Scalar:
    value = _scalar(text, line)
    if value is None:
        raise FrontmatterError(line, "a list item has no value")
    return value


def _inline_list(text: str, line: int) -> list[Scalar]:
    """``[a, "b", 3]`` on one line; items are scalars, never nested lists."""
    items: list[Scalar] = []
    rest = text[1:].lstrip(" \t")
    if rest.startswith("]"):
        if _strip_comment(rest[1:]):
            raise FrontmatterError(line, "unexpected text after a list")
        return items
    while True:
        rest = rest.lstrip(" \t")
        if not rest:
            raise FrontmatterError(line, "an inline list must end with ] on the same line")
        if rest[0] in "\"'":
            value, rest = _quoted(rest, line)
            items.append(value)
            rest = rest.lstrip(" \t")
        else:
            match = re.match(r"[^,\]]*", rest)
            raw = match.group(0).strip(" \t") if match else ""
            if not raw:
                raise FrontmatterError(line, "an inline list has an empty item")
            if "#" in raw:
                raise FrontmatterError(line, "an inline list must end with ] on the same line")
            items.append(_item(raw, line))
            rest = rest[len(match.group(0)) if match else 0 :]
        if not rest:
            raise FrontmatterError(line, "an inline list must end with ] on the same line")
        if rest.startswith(","):
            rest = rest[1:]
            continue
        if rest.startswith("]"):
            if _strip_comment(rest[1:]):
                raise FrontmatterError(line, "unexpected text after a list")
            return items
        raise FrontmatterError(line, "list items must be separated by commas")


def _is_blank(text: str) -> bool:
    stripped = text.strip(" \t")
    return not stripped or stripped.startswith("#")


def parse_frontmatter(lines: Sequence[str], first_line: int) -> dict[str, Entry]:
    """Parse frontmatter ``lines`` (without the ``---`` fences); ``first_line`` numbers the first.

    :raises FrontmatterError: anything outside the subset, naming the line.
    """
    result: dict[str, Entry] = {}
    index = 0
    while index < len(lines):
        number = first_line + index
        text = lines[index].rstrip("\r")
        index += 1
        if _is_blank(text):
            continue
        if text[0] in " \t":
            raise FrontmatterError(number, "unexpected indentation (is a key missing?)")
        match = _KEY.match(text)
        if match is None:
            raise FrontmatterError(number, "expected `key: value`")
        key, raw = match.group(1), match.group(2).strip(" \t")
        if key in result:
            raise FrontmatterError(
                number, f"{key!r} appears twice (first on line {result[key].line})"
            )
        value: Value
        if raw.startswith("["):
            value = _inline_list(raw, number)
        elif raw and not raw.startswith("#"):
            value = _scalar(raw, number)
        else:
            items: list[Scalar] = []
            while index < len(lines):
                item_text = lines[index].rstrip("\r")
                if _is_blank(item_text):
                    index += 1
                    continue
                if item_text[0] not in " \t-":
                    break
                stripped = item_text.lstrip(" ")
                if "\t" in item_text[: len(item_text) - len(stripped)] or stripped[0] == "\t":
                    raise FrontmatterError(first_line + index, "tabs cannot indent YAML")
                if not (stripped == "-" or stripped.startswith("- ")):
                    raise FrontmatterError(first_line + index, "expected a `- item` line")
                items.append(_item(stripped[1:].strip(" \t") or "~", first_line + index))
                index += 1
            value = items if items else None
        result[key] = Entry(value, number)
    return result
