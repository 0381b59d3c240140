"""`tensortap diff --json`: one JSON object per line, a record's row each
(the DataFrame's columns, and both runs' dtypes: "dtype_a", "dtype_b", null
on the side without the record), then one object for the whole comparison:
{"summary": true, "first_divergence", "dropout_masks_differ", "compared",
"differ", "noise" (with a floor), "only_a", "only_b", "floor_saturated_step",
"floor_disagrees_step", "floor_disagrees", "uninformative",
"without_floor", "exit"}. A value that is not finite is null, as the
doctor's --json writes it.
"""

from __future__ import annotations

import json
import math
from typing import TYPE_CHECKING, Any, Callable, Dict, Optional

if TYPE_CHECKING:
    from .tally import Tally


def _plain(v: Any) -> Any:
    if isinstance(v, float) and not math.isfinite(v):
        return None
    if hasattr(v, "item"):  # a NumPy scalar
        return _plain(v.item())
    return v


def row_line(row: Dict[str, Any]) -> str:
    from .side import COLUMNS

    d = {c: _plain(row[c]) for c in COLUMNS}
    d["dtype_a"], d["dtype_b"] = row["_dtype_a"], row["_dtype_b"]
    if row["_detail"]:
        d["detail"] = row["_detail"]
    return json.dumps(d)


def printer(write: Callable[[str], None], also: Optional[Callable[[Dict[str, Any]], None]] = None
            ) -> Callable[[Dict[str, Any]], None]:
    """An on_row for run_command that writes each row's line as it comes
    (and hands the row to `also`, the page's collector, first)."""
    def on_row(row: Dict[str, Any]) -> None:
        if also is not None:
            also(row)
        write(row_line(row))
    return on_row


def summary_line(tally: "Tally", status: int) -> str:
    counts = tally.counts
    d: Dict[str, Any] = {"summary": True, "first_divergence": tally.first_divergence(),
                         "dropout_masks_differ": tally.dropout(), "compared": tally.compared,
                         "differ": tally.differ, "only_a": counts["only_a"], "only_b": counts["only_b"]}
    if tally.floor:
        disagree = tally.floor_disagrees()
        d.update({"noise": counts["noise"], "floor_saturated_step": tally.saturated_step(),
                  "floor_disagrees_step": None if disagree is None else disagree["step"],
                  "floor_disagrees": None if disagree is None else {k: _plain(v) for k, v in disagree.items()},
                  "uninformative": tally.uninformative(), "without_floor": tally.n_without_floor})
    d["exit"] = status
    return json.dumps(d)


__all__ = ["row_line", "printer", "summary_line"]
