"""The report page's section on `tensortap ctl` (report.py): how many
requests each rank answered, and the last ones that changed what was
recorded (control.jsonl, read by _ctl_log.py)."""

from __future__ import annotations

import html
from typing import TYPE_CHECKING

from .._base import _safe
from .._ctl.log import SHOWN, logs
from .frame import _Page

if TYPE_CHECKING:
    from .._run import Run

HEADING = "Control requests"


def section(page: _Page, run: Run) -> None:
    found = logs(run)
    if not found:
        page.section(HEADING, "<p>No requests (tensortap ctl).</p>")
        return
    parts = []
    for r, log in found:
        where = "" if r is None else f"Rank {r}: "
        text = f"{where}{log.ok + log.refused} answered, {log.ok} ok, {log.refused} refused"
        if log.skipped:
            text += f", {log.skipped} damaged lines skipped"
        if log.applied > len(log.last):
            text += f"; the last {SHOWN} of {log.applied} applied requests are listed"
        parts.append(f"<p>{html.escape(text)}.</p>")
        if log.last:
            rows = "".join("<tr>" + "".join(f"<td>{html.escape(_safe(v))}</td>"
                                            for v in ("?" if step is None else step, command, message)) + "</tr>"
                           for command, step, message in log.last)
            parts.append("<table><tr><th>first step in effect</th><th>command</th><th>what the recorder said</th>"
                         f"</tr>{rows}</table>")
    page.section(HEADING, "".join(parts))
