"""Masks that replace variable parts of a log line before template mining.

Drain groups lines by their constant tokens, so every identifier that changes from line to line
(a GPU UUID, a PCI address, an IP and port, a block id, a number) is first rewritten to a named
placeholder such as ``<PCI>``. Masks run in the order of :data:`MASK_PATTERNS`: the most specific
shapes first, so that ``0000:3b:00.0`` becomes one ``<PCI>`` rather than three ``<NUM>``.

Each pattern carries its own boundaries (look-arounds) so it rewrites only the variable itself and
keeps the punctuation around it: ``[10.0.0.1]`` becomes ``[<IP>]``.
"""

from __future__ import annotations

import re

from drain3.masking import MaskingInstruction

# A variable starts where the previous character cannot be part of the same token...
_LEFT = r"(?<![\w.\-/:])"
# ...and ends where the next character cannot continue it (a trailing "." or ":" is punctuation).
_RIGHT = r"(?![\w\-]|[.:/]\w)"

_HEX = "[0-9a-fA-F]"
_UUID_BODY = rf"{_HEX}{{8}}-{_HEX}{{4}}-{_HEX}{{4}}-{_HEX}{{4}}-{_HEX}{{12}}"

_SOURCE_EXT = "py|pyx|go|java|scala|kt|c|cc|cpp|cu|h|hpp|rs|js|ts|rb"
_IP = r"/?(?:\d{1,3}\.){3}\d{1,3}(?::\d{1,5})?"

MASK_PATTERNS: dict[str, str] = {
    # NVIDIA GPU and MIG UUIDs (GPU-8f3c...), request ids (req-<uuid>) and plain UUIDs.
    "UUID": rf"(?<![\w\-])(?:GPU-|MIG-|req-)?{_UUID_BODY}(?![\w\-])",
    # PCI bus ids: 0000:3b:00.0 (lspci, DCGM) and the NVRM kernel form PCI:0000:3b:00.
    "PCI": rf"(?<![\w:])(?:PCI:)?{_HEX}{{4,8}}:{_HEX}{{2}}:{_HEX}{{2}}(?:\.[0-7])?(?![\w:])",
    # Dates and clock times: ISO 8601 (2024-05-21, 2024-05-21T10:15:33.123Z) and hh:mm:ss[.fff]. A log
    # line often starts with one, and a first token that stays literal routes every line to its own
    # branch of the prefix tree.
    "TIME": (
        r"(?<![\w.\-:/])(?:\d{4}-\d{2}-\d{2}(?:[T ]\d{2}:\d{2}(?::\d{2}(?:[.,]\d{1,9})?)?(?:Z|[+-]\d{2}:?\d{2})?)?"
        r"|\d{1,2}:\d{2}:\d{2}(?:[.,]\d{1,9})?)(?![\w\-]|[.:/]\w)"
    ),
    # URLs before paths and IPs, so that a URL stays one token.
    # a scheme is short (RFC 3986 names none over 32 characters): bounding it keeps a long run of
    # "x.x.x..." from being rescanned from every letter (quadratic time on a hostile line)
    "URL": r"(?<![\w])[a-zA-Z][a-zA-Z0-9+.\-]{0,31}://[^\s\"'<>()\[\],]+",
    # IPv4 with an optional port, the leading slash Java prints (/10.0.0.1:50010) and Java's
    # host/address form (node-7/10.0.0.1:8030); a comma-separated list (an X-Forwarded-For chain)
    # is one variable. "10.0.0.1:50010:Got" keeps its ":Got".
    "IP": rf"(?<![\w.\-:/])(?:[A-Za-z][\w\-.]*(?=/))?{_IP}(?:,{_IP})*(?![\w\-]|\.\w|:\d)",
    # host:port where the host has a dot or a hyphen (node-7:8030, db.internal:5432), so that
    # key:value pairs such as status:200 are left alone, and source locations (engine.py:165,
    # reflector.go:424) stay constant: they tell templates apart.
    "HOSTPORT": (
        rf"(?<![\w.\-/:])(?![\w.\-]*\.(?:{_SOURCE_EXT}):)"
        r"[A-Za-z][\w]*(?:[.\-][\w]+)+:\d{2,5}(?![\w\-]|\.\w|:\d)"
    ),
    # Absolute paths with at least two components (/var/log/x, /v2/tenant/servers); components
    # may hold placeholders already written by the masks above.
    "PATH": rf"(?<![\w.\-:/<>])(?:/(?:[\w.\-~%+=@,]|<[A-Z]+>)+){{2,}}/?{_RIGHT}",
    # Block ids (blk_<n>), including negative ones (blk_-6952295868487656571); a space-separated run of
    # them is one variable, so "delete blk_1 blk_2 blk_3" keeps the template of "delete blk_1".
    "BLK": r"(?<![\w])blk_-?\d+(?:\s+blk_-?\d+)*(?![\w])",
    # Hexadecimal literals and long hex digests (32-char ids, sha prefixes).
    "HEX": rf"{_LEFT}(?:0[xX]{_HEX}+|{_HEX}{{16,}}){_RIGHT}",
    # Identifiers that end in a long number after an underscore (application_1445144423722_0020,
    # DFSClient_NONMAPREDUCE_1537864556_1); a short suffix (layer_3) stays part of the word.
    # the lookahead finds the "_1234" once and the possessive run never backtracks into it: the plain
    # "[A-Za-z]\w*?_\d{4,}\w*" took quadratic time (14 s for a 40 KB hostile line)
    "SERIAL": rf"{_LEFT}[A-Za-z](?=\w*?_\d{{4}})\w*+{_RIGHT}",
    # Decimal numbers, signed or not, with an optional fraction and unit-less.
    "NUM": rf"{_LEFT}[-+]?\d+(?:\.\d+)?{_RIGHT}",
}
"""Named mask patterns, in application order."""

DEFAULT_MASKS: tuple[str, ...] = tuple(MASK_PATTERNS)
"""The masks a miner applies when its settings do not say otherwise."""

MASK_GUARDS: dict[str, tuple[str, ...]] = {
    "UUID": ("-",),
    "PCI": (":",),
    "TIME": (":", "-"),
    "URL": ("://",),
    "IP": (".",),
    "HOSTPORT": (":",),
    "PATH": ("/",),
    "BLK": ("blk_",),
    "SERIAL": ("_",),
}
"""For a mask, substrings of which every match holds at least one: a line holding none of them is left
alone without running the pattern. Masking is most of the miner's time, and most lines hold no URL, no
block id and no path, so a substring test (in C) spares most of the pattern scans."""


class GuardedMaskingInstruction(MaskingInstruction):
    """A drain3 masking instruction that runs its pattern only on lines holding one of its guards."""

    def __init__(self, pattern: str, mask_with: str, guards: tuple[str, ...]) -> None:
        super().__init__(pattern, mask_with)
        self.guards = guards

    def mask(self, content: str, mask_prefix: str, mask_suffix: str) -> str:
        """The line with every match replaced, or the line itself when it holds no guard."""
        if not any(guard in content for guard in self.guards):
            return content
        return str(super().mask(content, mask_prefix, mask_suffix))


_PLACEHOLDER = re.compile(r"<([A-Z][A-Z0-9_]*)>")


def masking_instructions(names: tuple[str, ...], extra: tuple[tuple[str, str], ...] = ()) -> list[MaskingInstruction]:
    """Build drain3 masking instructions.

    Args:
        names: library masks from :data:`MASK_PATTERNS`, applied in this order.
        extra: ``(name, regex)`` pairs applied before the library masks (system-specific shapes).

    Returns:
        The instructions, in application order.

    Raises:
        KeyError: a name is not in :data:`MASK_PATTERNS`.
    """
    instructions = [MaskingInstruction(pattern, name) for name, pattern in extra]
    instructions += [
        GuardedMaskingInstruction(MASK_PATTERNS[name], name, MASK_GUARDS[name])
        if name in MASK_GUARDS
        else MaskingInstruction(MASK_PATTERNS[name], name)
        for name in names
    ]
    return instructions


def generic_template(template: str, mask_names: frozenset[str] | None = None) -> str:
    """Rewrite named placeholders (``<IP>``, ``<NUM>``...) as the generic ``<*>``.

    Args:
        template: a mined template.
        mask_names: the placeholder names to rewrite; every upper-case ``<NAME>`` when ``None``.

    Returns:
        The template with the chosen placeholders replaced by ``<*>``.
    """

    def swap(match: re.Match[str]) -> str:
        if mask_names is None or match.group(1) in mask_names:
            return "<*>"
        return match.group(0)

    return _PLACEHOLDER.sub(swap, template)
