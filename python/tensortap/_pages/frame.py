"""The frame the package's HTML pages share: `tensortap report`'s page about
a run (report.py, with its dumps section in _report_dumps.py) and
`tensortap diff --html`'s page about two (diff_page.py).

A page is self-contained: its figures are PNGs inside it (data: URLs) and
the data behind its tables is in it as JSON, so that it opens from disk
with no network. Here: the HTML skeleton and its style, a figure as a data
URL, text from a run made safe for HTML, JSON and matplotlib, the figures'
shared helpers (matplotlib, a legend outside its axes, histogram bins), and
the page written whole or not at all.
"""

from __future__ import annotations

import base64
import html
import io
import json
import math
import os
import tempfile
from typing import Any, List, Sequence, Union

import numpy as np

from .._base import _safe
from .._optional import need

# Names longer than this are cut in figures (the tables keep them whole).
FIGURE_NAME_CHARS = 60

_STYLE = """
body { font-family: system-ui, sans-serif; margin: 1.5rem auto; max-width: 1400px; padding: 0 1rem;
       color: #222; background: #fff; }
h1 { font-size: 1.4rem; word-break: break-all; }
h2 { font-size: 1.15rem; border-bottom: 1px solid #ddd; padding-bottom: .2rem; margin-top: 2rem; }
pre { background: #f6f6f6; padding: .8rem; overflow-x: auto; font-size: .8rem; }
img.figure { display: block; max-width: 100%; height: auto; margin: .6rem 0; }
table { border-collapse: collapse; font-size: .85rem; }
td, th { border: 1px solid #ccc; padding: .2rem .5rem; text-align: left; }
h3 { font-size: 1rem; margin: 1.2rem 0 .3rem; word-break: break-all; }
.compact { font-size: .8rem; color: #444; margin: .3rem 0; }
"""


class _Page:
    def __init__(self, title: str) -> None:
        self.title = title
        self.sections: List[str] = []
        self.data: Any = {}

    def note(self, text: str) -> None:
        self.sections.insert(1, f"<p><em>{html.escape(text)}</em></p>")

    def section(self, heading: str, body: str) -> None:
        anchor = heading.lower().replace(" ", "-")
        self.sections.append(f'<section id="{anchor}"><h2>{html.escape(heading)}</h2>{body}</section>')

    @staticmethod
    def figure(fig: Any, alt: str) -> str:
        buf = io.BytesIO()
        # Cut to what is drawn: a legend outside the axes is kept whole.
        fig.savefig(buf, format="png", dpi=90, bbox_inches="tight", pad_inches=0.1)
        data = base64.b64encode(buf.getvalue()).decode("ascii")
        return f'<img class="figure" alt="{html.escape(alt)}" src="data:image/png;base64,{data}">'

    def render(self) -> str:
        # No "<" at all inside the script element: "</script" would end it,
        # "<!--" would change how it is parsed. JSON reads \u003c back as "<".
        data = json.dumps(self.data, default=str, allow_nan=False).replace("<", "\\u003c")
        return (f'<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
                f'<meta name="viewport" content="width=device-width, initial-scale=1">'
                f"<title>{html.escape(self.title)}</title><style>{_STYLE}</style></head>\n<body>"
                f"<h1>{html.escape(self.title)}</h1>\n" + "\n".join(self.sections)
                + f'\n<script type="application/json" id="tensortap-data">{data}</script>\n</body></html>\n')


def _write_page(content: str, out_path: Union[str, "os.PathLike[str]"]) -> str:
    # Written whole or not at all: a failed page leaves no empty file behind.
    directory = os.path.dirname(os.path.abspath(out_path))
    fd, tmp = tempfile.mkstemp(prefix=".report-", suffix=".html", dir=directory)
    try:
        # mkstemp makes it 0600; a page is made to be shared, as any file
        # written with open() would be: 0666 less the umask.
        os.fchmod(fd, 0o666 & ~_umask())
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(content)
        os.replace(tmp, out_path)
    except BaseException:
        os.unlink(tmp)
        raise
    return os.fspath(out_path)


def _umask() -> int:
    """The process's umask, read without changing it (os.umask can only set
    it, which another thread would see for a moment)."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def _jsonable(value: Any) -> Any:
    """`value` with names made printable and non-finite numbers as null, so
    that the page's JSON is strict JSON."""
    if isinstance(value, dict):
        return {_safe(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, str):
        return _safe(value)
    return value


def _span(steps: Sequence[int]) -> str:
    """Steps as a page says them: "first..last (n steps)"."""
    if not steps:
        return "none"
    return f"{steps[0]}..{steps[-1]} ({len(steps)} steps)" if len(steps) > 1 else str(steps[0])


# -- figures -------------------------------------------------------------


def _pyplot() -> Any:
    matplotlib = need("matplotlib", "python3-matplotlib", "tensortap report")
    matplotlib.use("Agg")  # no display: a file
    import matplotlib.pyplot as plt

    return plt


def _text(s: Any) -> str:
    """A name from a user's model as matplotlib text: printable, cut to a
    length a figure can hold, "$" not TeX, a leading "_" not hiding a legend
    entry."""
    s = _safe(s)
    if len(s) > FIGURE_NAME_CHARS:
        s = s[:FIGURE_NAME_CHARS - 1] + "\u2026"
    s = s.replace("$", r"\$")
    return " " + s if s.startswith("_") or not s else s


def _legend_outside(ax: Any, below: bool = False, **kw: Any) -> Any:
    """A legend beside `ax` (to its right), or under it (`below`: for panels
    side by side, where the right is the next panel), never over its curves.
    The figure's constrained layout makes room for it, and the page's PNG is
    cut to what is drawn (bbox_inches="tight"), so it is not cut off."""
    kw.setdefault("fontsize", 7)
    if below:
        from matplotlib.transforms import ScaledTranslation

        # Half an inch under the axes: under the tick labels and "step".
        return ax.legend(loc="upper center", bbox_to_anchor=(0.5, 0.0), ncol=2, borderaxespad=0.0,
                         bbox_transform=ax.transAxes + ScaledTranslation(0, -0.5, ax.figure.dpi_scale_trans),
                         **kw)
    return ax.legend(loc="upper left", bbox_to_anchor=(1.02, 1.0), borderaxespad=0.0, **kw)


def _bins(lo: float, hi: float, n: int = 60) -> np.ndarray:
    """n equal bins from lo to hi, even when hi - lo overflows a double."""
    if not hi > lo:
        return np.array([lo - 0.5, lo + 0.5]) if abs(lo) < 1e300 else np.array([lo, lo + abs(lo) * 1e-9 + 1])
    step = hi / n - lo / n  # no overflow: each term is at most max/n
    edges = lo + step * np.arange(n + 1)
    edges[-1] = hi
    return np.maximum.accumulate(edges)
