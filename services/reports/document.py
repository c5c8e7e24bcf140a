"""The report as a document: sections of paragraphs, lists, tables, notes and figures.

The builder (services/reports/build.py) turns facts into this; the renderers (services/reports/render.py)
turn this into Markdown and HTML, so both formats say exactly the same thing. A :class:`Note` is how a
section says what is missing; renderers show it apart from the facts.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TypeAlias


@dataclass(frozen=True)
class Para:
    """A paragraph."""

    text: str


@dataclass(frozen=True)
class Bullets:
    """A bulleted list."""

    items: tuple[str, ...]


@dataclass(frozen=True)
class Table:
    """A table; every row has as many cells as the header."""

    header: tuple[str, ...]
    rows: tuple[tuple[str, ...], ...]


@dataclass(frozen=True)
class Note:
    """What is missing or uncertain ("No diagnosis is stored for this incident.")."""

    text: str


@dataclass(frozen=True)
class Figure:
    """A plot: its file name beside the Markdown, its PNG bytes, and what it shows."""

    name: str
    title: str
    caption: str
    png: bytes


Block: TypeAlias = Para | Bullets | Table | Note | Figure


@dataclass(frozen=True)
class Section:
    """A titled section."""

    title: str
    blocks: tuple[Block, ...]


@dataclass(frozen=True)
class Document:
    """A titled document with a one-line subtitle."""

    title: str
    subtitle: str
    sections: tuple[Section, ...] = field(default=())

    def figures(self) -> list[Figure]:
        """Every figure, in the order they appear."""
        return [b for s in self.sections for b in s.blocks if isinstance(b, Figure)]
