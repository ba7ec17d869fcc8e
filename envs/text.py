"""Plain text for the console: the one column layout every table is printed with, and dollars as it shows them."""

from __future__ import annotations

from collections.abc import Sequence


def text_table(rows: Sequence[Sequence[str]], align: str) -> list[str]:
    """``rows`` (the header first) as lines, columns two spaces apart: column i left-aligned where ``align[i]`` is
    "l", else right-aligned; no line ends in spaces."""
    widths = [max(len(row[i]) for row in rows) for i in range(len(align))]
    return [
        "  ".join(c.ljust(w) if a == "l" else c.rjust(w) for c, w, a in zip(row, widths, align, strict=True)).rstrip()
        for row in rows
    ]


def money(x: float | None) -> str:
    """Dollars as the console shows them: ``$1,234.50``, ``-$12.00``; ``-`` for None."""
    if x is None:
        return "-"
    return f"-${-x:,.2f}" if x < 0 else f"${x:,.2f}"
