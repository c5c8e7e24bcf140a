"""A report document as Markdown (plots as PNG files beside it), self-contained HTML, or PDF.

The HTML inlines its plots as ``data:`` URIs and its style sheet, and loads nothing else (no script, no
font, no favicon), so it opens anywhere, offline, and prints as it shows. The PDF is that HTML printed by
headless Chromium (``--print-to-pdf``), the same engine a reader's browser would use; Chromium is Debian's
``chromium`` package, looked up on ``PATH``.
"""

from __future__ import annotations

import base64
import html
import os
import re
import shutil
import subprocess
import tempfile
from pathlib import Path

from services.reports.document import Bullets, Document, Figure, Note, Para, Section, Table
from services.reports.errors import RenderError

CHROMIUM_NAMES = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")
CHROMIUM_FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
)
PDF_TIMEOUT_S = 90.0


# --------------------------------------------------------------------------------------- markdown


def _md_escape_cell(text: str) -> str:
    return text.replace("|", "\\|")


def to_markdown(doc: Document, *, image_uri: bool = False) -> str:
    """The document as GitHub-flavoured Markdown.

    Args:
        image_uri: inline each plot as a ``data:`` URI (one self-contained text, for the API) instead of
            linking the PNG file of the same name beside the Markdown.
    """
    out = [f"# {doc.title}", "", f"_{doc.subtitle}_", ""]
    for section in doc.sections:
        out += [f"## {section.title}", ""]
        for block in section.blocks:
            if isinstance(block, Para):
                out += [block.text, ""]
            elif isinstance(block, Bullets):
                out += [f"- {item}" for item in block.items] + [""]
            elif isinstance(block, Note):
                out += [f"> **Missing:** {block.text}", ""]
            elif isinstance(block, Table):
                out.append("| " + " | ".join(_md_escape_cell(h) for h in block.header) + " |")
                out.append("|" + "|".join("---" for _ in block.header) + "|")
                out += ["| " + " | ".join(_md_escape_cell(c) for c in row) + " |" for row in block.rows]
                out.append("")
            elif isinstance(block, Figure):
                src = _data_uri(block.png) if image_uri else block.name
                out += [f"### {block.title}", "", f"![{block.title}]({src})", "", f"_{block.caption}_", ""]
    return "\n".join(out).rstrip() + "\n"


# ------------------------------------------------------------------------------------------- html


_STYLE = """
:root { color-scheme: light; }
body { font: 14px/1.5 -apple-system, "Segoe UI", "DejaVu Sans", Helvetica, Arial, sans-serif; color: #1d2731;
       max-width: 1100px; margin: 24px auto; padding: 0 24px; }
h1 { font-size: 22px; margin: 0 0 4px; }
.subtitle { color: #5d6d7e; margin: 0 0 20px; }
h2 { font-size: 17px; border-bottom: 2px solid #e5e8eb; padding-bottom: 4px; margin-top: 28px; }
h3 { font-size: 15px; margin: 18px 0 6px; }
table { border-collapse: collapse; width: 100%; margin: 8px 0 14px; font-size: 12.5px; }
th, td { border: 1px solid #dde1e5; padding: 4px 6px; text-align: left; vertical-align: top; }
th { background: #f4f6f7; }
tr:nth-child(even) td { background: #fbfcfc; }
td.source { font-family: "DejaVu Sans Mono", monospace; font-size: 11px; color: #5d6d7e; word-break: break-all; }
code { font-family: "DejaVu Sans Mono", monospace; font-size: 12px; background: #f4f6f7; padding: 0 3px; }
.missing { border-left: 4px solid #e67e22; background: #fdf2e9; padding: 6px 10px; margin: 8px 0; }
figure { margin: 10px 0 18px; }
figure img { width: 100%; height: auto; border: 1px solid #e5e8eb; }
figcaption { color: #5d6d7e; font-size: 12.5px; }
@media print { body { margin: 0; max-width: none; } h2 { break-after: avoid; } figure, tr { break-inside: avoid; } }
"""

_BOLD = re.compile(r"\*\*(.+?)\*\*")
_CODE = re.compile(r"`([^`]+)`")
_ITALIC = re.compile(r"(?<![\w*])\*([^*]+)\*(?![\w*])")


def _inline(text: str) -> str:
    """The little inline Markdown the builder writes (bold, code, italics), escaped for HTML."""
    out = html.escape(text, quote=False)
    out = _CODE.sub(r"<code>\1</code>", out)
    out = _BOLD.sub(r"<strong>\1</strong>", out)
    return _ITALIC.sub(r"<em>\1</em>", out)


def _data_uri(png: bytes) -> str:
    return "data:image/png;base64," + base64.b64encode(png).decode("ascii")


def _section_html(section: Section) -> list[str]:
    out = [f"<section><h2>{html.escape(section.title)}</h2>"]
    for block in section.blocks:
        if isinstance(block, Para):
            out.append(f"<p>{_inline(block.text)}</p>")
        elif isinstance(block, Bullets):
            out.append("<ul>" + "".join(f"<li>{_inline(i)}</li>" for i in block.items) + "</ul>")
        elif isinstance(block, Note):
            out.append(f'<p class="missing"><strong>Missing:</strong> {_inline(block.text)}</p>')
        elif isinstance(block, Table):
            source = len(block.header) - 1 if block.header and block.header[-1] == "source" else -1
            head = "".join(f"<th>{html.escape(h)}</th>" for h in block.header)
            rows = "".join(
                "<tr>"
                + "".join(
                    f'<td class="source">{html.escape(c)}</td>' if i == source else f"<td>{_inline(c)}</td>"
                    for i, c in enumerate(row)
                )
                + "</tr>"
                for row in block.rows
            )
            out.append(f"<table><thead><tr>{head}</tr></thead><tbody>{rows}</tbody></table>")
        elif isinstance(block, Figure):
            out.append(
                f'<figure><h3>{html.escape(block.title)}</h3><img alt="{html.escape(block.title)}"'
                f' src="{_data_uri(block.png)}"><figcaption>{_inline(block.caption)}</figcaption></figure>'
            )
    out.append("</section>")
    return out


def to_html(doc: Document) -> str:
    """The document as one self-contained HTML page (plots and style inlined, nothing fetched)."""
    parts = [
        "<!DOCTYPE html>",
        '<html lang="en"><head><meta charset="utf-8">',
        '<meta name="viewport" content="width=device-width, initial-scale=1">',
        # no favicon request: the page loads nothing but itself
        '<link rel="icon" href="data:,">',
        f"<title>{html.escape(doc.title)}</title>",
        f"<style>{_STYLE}</style></head><body>",
        f"<h1>{html.escape(doc.title)}</h1>",
        f'<p class="subtitle">{html.escape(doc.subtitle)}</p>',
    ]
    for section in doc.sections:
        parts += _section_html(section)
    parts.append("</body></html>")
    return "\n".join(parts) + "\n"


# -------------------------------------------------------------------------------------------- pdf


def find_chromium() -> str:
    """The Chromium binary on ``PATH``.

    Raises:
        RenderError: none is installed.
    """
    for name in CHROMIUM_NAMES:
        found = shutil.which(name)
        if found:
            return found
    raise RenderError(
        "PDF needs headless Chromium and none is on PATH: install Debian's chromium package"
        " (apt-get install chromium), or ask for --format html"
    )


def html_to_pdf(page: str, *, chromium: str | None = None, timeout_s: float = PDF_TIMEOUT_S) -> bytes:
    """Print an HTML page to PDF with headless Chromium (A4, no header or footer).

    Raises:
        RenderError: Chromium is missing, failed, or took longer than ``timeout_s``.
    """
    binary = chromium or find_chromium()
    with tempfile.TemporaryDirectory(prefix="medic-report-") as tmp:
        source = Path(tmp) / "report.html"
        target = Path(tmp) / "report.pdf"
        source.write_text(page, encoding="utf-8")
        cmd = [
            binary,
            *CHROMIUM_FLAGS,
            f"--user-data-dir={Path(tmp) / 'profile'}",
            "--no-pdf-header-footer",
            f"--print-to-pdf={target}",
            source.as_uri(),
        ]
        try:
            done = subprocess.run(
                cmd, capture_output=True, timeout=timeout_s, check=False, env={**os.environ, "HOME": tmp}
            )
        except subprocess.TimeoutExpired as exc:
            raise RenderError(f"Chromium did not print the PDF within {timeout_s:.0f} s") from exc
        except OSError as exc:
            raise RenderError(f"cannot run {binary}: {exc}") from exc
        if not target.exists() or target.stat().st_size == 0:
            tail = done.stderr.decode("utf-8", "replace").strip().splitlines()[-3:]
            raise RenderError(f"Chromium exited {done.returncode} without a PDF: {' / '.join(tail)}")
        return target.read_bytes()
