"""Label matchers with Alertmanager's syntax and semantics.

A matcher is ``name OP value`` with ``OP`` one of ``=``, ``!=``, ``=~``, ``!~``. The value may be
double-quoted (``severity="critical"``) or bare (``severity=critical``); inside quotes ``\\"``, ``\\\\``
and ``\\n`` are escapes and any other backslash is kept as written, so ``'job=~"node\\.x"'`` keeps
its regex escape. A string may hold several comma-separated matchers, optionally inside braces:
``{severity="critical", node=~"gpu-.*"}``.

Semantics that surprise people, kept on purpose because Alertmanager has them:

* a missing label reads as the empty string, so ``foo=""`` matches alerts *without* ``foo`` and
  ``foo!=""`` matches alerts that have it;
* regexes are anchored at both ends: ``node=~"gpu"`` does not match ``gpu-1``; write ``gpu.*``.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Literal

Operator = Literal["=", "!=", "=~", "!~"]
OPERATORS: tuple[Operator, ...] = ("=~", "!~", "!=", "=")  # longest first: the parser tries them in order
LABEL_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


@dataclass(frozen=True)
class Matcher:
    """One label matcher.

    Attributes:
        name: the label name.
        op: ``=``, ``!=``, ``=~`` or ``!~``.
        value: the value, or the regex for ``=~`` / ``!~`` (anchored when matching).
    """

    name: str
    op: Operator
    value: str
    _regex: re.Pattern[str] | None = field(default=None, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if self.op not in OPERATORS:
            raise ValueError(f"unknown matcher operator {self.op!r} (use =, !=, =~ or !~)")
        if not self.name:
            raise ValueError("a matcher needs a label name")
        if self.op in ("=~", "!~"):
            try:
                # fullmatch anchors at both ends like Alertmanager's ^(?:re)$; unlike '$' it does not
                # accept a trailing newline.
                compiled = re.compile(f"(?:{self.value})")
            except re.error as exc:
                raise ValueError(f"invalid regex {self.value!r} in matcher on {self.name!r}: {exc}") from exc
            object.__setattr__(self, "_regex", compiled)

    def matches_value(self, value: str) -> bool:
        """Whether a label value (``""`` for a missing label) satisfies this matcher."""
        if self.op == "=":
            return value == self.value
        if self.op == "!=":
            return value != self.value
        assert self._regex is not None
        hit = self._regex.fullmatch(value) is not None
        return hit if self.op == "=~" else not hit

    def matches(self, labels: Mapping[str, str]) -> bool:
        """Whether a label set satisfies this matcher (a missing label reads as ``""``)."""
        return self.matches_value(labels.get(self.name, ""))

    def __str__(self) -> str:
        name = self.name if LABEL_NAME.match(self.name) else json.dumps(self.name, ensure_ascii=False)
        return f"{name}{self.op}{json.dumps(self.value, ensure_ascii=False)}"


def matches_all(matchers: Iterable[Matcher], labels: Mapping[str, str]) -> bool:
    """Whether every matcher matches (true for no matchers, as Alertmanager's empty list is)."""
    return all(m.matches(labels) for m in matchers)


def format_matchers(matchers: Iterable[Matcher]) -> str:
    """``{a="b", c=~"d"}``: the form Alertmanager uses in route keys."""
    return "{" + ", ".join(str(m) for m in matchers) + "}"


class _Reader:
    """A tiny cursor over one matcher list string."""

    def __init__(self, text: str, source: str) -> None:
        self.text = text
        self.source = source
        self.pos = 0

    def error(self, what: str) -> ValueError:
        return ValueError(f"invalid matcher {self.source!r}: {what}")

    def eof(self) -> bool:
        return self.pos >= len(self.text)

    def skip_space(self) -> None:
        while not self.eof() and self.text[self.pos].isspace():
            self.pos += 1

    def quoted(self) -> str:
        """Read a double-quoted string starting at the cursor, with Alertmanager's escapes."""
        assert self.text[self.pos] == '"'
        self.pos += 1
        out: list[str] = []
        while not self.eof():
            ch = self.text[self.pos]
            self.pos += 1
            if ch == '"':
                return "".join(out)
            if ch == "\\" and not self.eof():
                nxt = self.text[self.pos]
                self.pos += 1
                if nxt == "n":
                    out.append("\n")
                elif nxt in ('"', "\\"):
                    out.append(nxt)
                else:  # a spurious escape is literal, so regex escapes such as \. survive
                    out.append("\\" + nxt)
                continue
            out.append(ch)
        raise self.error("missing closing quote")

    def name(self) -> str:
        if not self.eof() and self.text[self.pos] == '"':
            name = self.quoted()
            if not name:
                raise self.error("empty label name")
            return name
        start = self.pos
        while not self.eof() and (self.text[self.pos].isalnum() or self.text[self.pos] == "_"):
            self.pos += 1
        name = self.text[start : self.pos]
        if not LABEL_NAME.match(name):
            raise self.error(f"expected a label name at position {start}")
        return name

    def operator(self) -> Operator:
        for op in OPERATORS:
            if self.text.startswith(op, self.pos):
                self.pos += len(op)
                return op
        raise self.error(f"expected one of =, !=, =~, !~ at position {self.pos}")

    def value(self) -> str:
        if not self.eof() and self.text[self.pos] == '"':
            return self.quoted()
        start = self.pos
        while not self.eof() and self.text[self.pos] != ",":
            if self.text[self.pos] == '"':
                raise self.error("a bare value cannot contain a double quote; quote the whole value")
            self.pos += 1
        return self.text[start : self.pos].strip()


def parse_matchers(text: str) -> tuple[Matcher, ...]:
    """Parse one string of comma-separated matchers, optionally wrapped in braces.

    Args:
        text: e.g. ``'severity=~"critical|warning"'`` or ``'{alertname="X", node!=""}'``.

    Returns:
        The matchers in the order written.

    Raises:
        ValueError: the syntax is wrong or a regex does not compile; the message quotes the input.
    """
    body = text.strip()
    if body.startswith("{"):
        if not body.endswith("}"):
            raise ValueError(f"invalid matcher {text!r}: missing closing '}}'")
        body = body[1:-1]
    elif body.endswith("}"):
        raise ValueError(f"invalid matcher {text!r}: missing opening '{{'")
    reader = _Reader(body, text)
    out: list[Matcher] = []
    while True:
        reader.skip_space()
        if reader.eof():
            break
        name = reader.name()
        reader.skip_space()
        op = reader.operator()
        reader.skip_space()
        value = reader.value()
        try:
            out.append(Matcher(name, op, value))
        except ValueError as exc:
            raise reader.error(str(exc)) from exc
        reader.skip_space()
        if reader.eof():
            break
        if reader.text[reader.pos] != ",":
            raise reader.error(f"expected ',' between matchers at position {reader.pos}")
        reader.pos += 1
    if not out:
        raise ValueError(f"invalid matcher {text!r}: no matcher in it")
    return tuple(out)


def parse_matcher(text: str) -> Matcher:
    """Parse exactly one matcher such as ``severity="critical"``.

    Raises:
        ValueError: the text is not exactly one valid matcher.
    """
    found = parse_matchers(text)
    if len(found) != 1:
        raise ValueError(f"invalid matcher {text!r}: expected one matcher, found {len(found)}")
    return found[0]


def parse_matcher_list(items: Iterable[str]) -> tuple[Matcher, ...]:
    """Parse a YAML list of matcher strings (each may hold several comma-separated matchers)."""
    out: list[Matcher] = []
    for item in items:
        if not isinstance(item, str):
            raise ValueError(f"expected a matcher string such as 'severity=\"critical\"', got {item!r}")
        out.extend(parse_matchers(item))
    return tuple(out)
