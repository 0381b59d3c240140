"""What the export writes and how TensorBoard shows it: the statistics
chosen (check_stats, the run's own), the custom scalars' layout (a chart
per top-level module, at most SERIES_PER_CHART series each), and the
flight recorder's dumps as text lines."""

from __future__ import annotations

import collections
import json
import os
import re
from typing import Dict, Iterable, List, Tuple

import numpy as np

from .._base import NONFINITE, STATS_FIELDS, RunError, _is_int64, _warn
from .._base import json_string as _json_string
from .._files import _open_regular, _rank_dumps
from .._names import DUMPS
from .events import tag_text


# TensorBoardOptions::stats' default (sdk/include/tensortap/options.h).
DEFAULT_STATS: Tuple[str, ...] = ("mean", "std", "min", "max", "norm")


def check_stats(stats) -> Tuple[str, ...]:
    """`stats` as a tuple of statistics' names (TensorSummary's fields), or
    ValueError naming the first that is not one."""
    if isinstance(stats, str):
        raise ValueError(f"stats wants a list of statistics' names, not the string {stats!r}")
    out = tuple(stats)
    for name in out:
        if name not in STATS_FIELDS:
            raise ValueError(f"stats: {name!r} is not a statistic; the fields are {', '.join(STATS_FIELDS)}")
    return out


def written_fields(stats) -> Tuple[List[str], bool]:
    """The statistics' tag suffixes a row writes, in the table's order, and
    whether the NaN/Inf counts go as one `nonfinite` tag (none of them named)."""
    chosen = set(stats)
    return [f for f in STATS_FIELDS if f in chosen], not chosen & set(NONFINITE)


SCALARS_CATEGORY = "tensortap: 0-d tensors (loss, learning rate)"


NORMS_CATEGORY = "tensortap: gradient norms"


STDS_CATEGORY = "tensortap: activations' std"


# A chart of more lines than this is a solid block (36 gradient
# norms in one colour); past it a module's series go on in further charts.
SERIES_PER_CHART = 16


# What Python's re.escape escapes (3.7 on), written out so that the export
# and the recorder (regex_escape in writers/src/tensorboard/events.cpp)
# follow EVENTS.md's list, not whatever the running Python's re does.
_REGEX_SPECIAL = frozenset("()[]{}?*+-|^$\\.&~# \t\n\r\v\f")


_SEPARATORS = re.compile("[./]")


Layout = List[Tuple[str, List[Tuple[str, List[str]]]]]


def _key(value) -> str:
    """A JSON object's value as a string equal for equal objects (key order aside)."""
    return json.dumps(value, sort_keys=True, allow_nan=True)


def regex_escape(text: str) -> str:
    """`text` with a backslash before each character EVENTS.md lists."""
    return "".join("\\" + c if c in _REGEX_SPECIAL else c for c in text)


def _series_regex(tag: str) -> str:
    """The one regular expression that matches the tag and nothing else
    (TensorBoard's route matches from the tag's start, re.match: the `$`
    keeps `tensor/lr` from matching `tensor/lr2`)."""
    return "^" + regex_escape(tag) + "$"


def _prefix(name: str, components: int) -> str:
    """`name` up to (not including) its `components`-th '.' or '/'; the whole
    name when it has fewer."""
    ends = [m.start() for m in _SEPARATORS.finditer(name)]
    return name[:ends[components - 1]] if len(ends) >= components else name


def module_charts(names: Iterable[str], kind: str, stat: str) -> List[Tuple[str, List[str]]]:
    """The charts of one category (EVENTS.md, "The layout"): `names` (as in
    the tags) grouped by top-level module, groups in name order, each group
    in charts of at most SERIES_PER_CHART series `^<kind>/<name>/<stat>$`."""
    names = sorted(set(names))
    # A model whose parameters all sit under one module (`model.`) would be
    # one group of everything: then the module is one component deeper.
    firsts = {_prefix(n, 1) for n in names}
    depth = 2 if len(firsts) == 1 and any(_SEPARATORS.search(n) for n in names) else 1
    groups: Dict[str, List[str]] = {}
    for n in names:
        groups.setdefault(_prefix(n, depth), []).append(n)
    charts = []
    for module in sorted(groups):
        members = groups[module]
        parts = -(-len(members) // SERIES_PER_CHART)
        for p in range(parts):
            title = module if parts == 1 else f"{module} ({p + 1}/{parts})"
            chunk = members[p * SERIES_PER_CHART:(p + 1) * SERIES_PER_CHART]
            charts.append((title, [_series_regex(f"{kind}/{n}/{stat}") for n in chunk]))
    return charts


def layout(scalars: Iterable[str] = (), grads: Iterable[str] = (), activations: Iterable[str] = ()) -> Layout:
    """The custom scalars layout (EVENTS.md, "The layout"), as
    _custom_scalars_value takes it: a chart per 0-d tensor name of `scalars`
    (`loss` first), then the gradients' norms of the `grads` names and the
    activations' std of the `activations` names (empty: no category; pass
    none where the statistic is not written). Names are taken as the tags
    hold them (U+FFFD for bytes that are not UTF-8): the same tag is one
    series, and Python's order of code points is then the UTF-8 bytes' order,
    the recorder's."""
    scalars, grads, activations = ({tag_text(n) for n in names} for names in (scalars, grads, activations))
    out: Layout = []
    if scalars:
        # The loss first: the chart a user opens the tab for.
        order = sorted(scalars, key=lambda n: (n != "loss", n))
        out.append((SCALARS_CATEGORY, [(n, [_series_regex(f"tensor/{n}")]) for n in order]))
    if grads:
        out.append((NORMS_CATEGORY, module_charts(grads, "grad", "norm")))
    if activations:
        out.append((STDS_CATEGORY, module_charts(activations, "activation", "std")))
    return out


def run_stats(info) -> Tuple[str, ...]:
    """The statistics a rank's recorder wrote to TensorBoard (run.json's
    options.tensorboard.stats), or DEFAULT_STATS: a run without TensorBoard,
    or of a tensortap before the setting."""
    tb = (info.get("options") or {}).get("tensorboard") if isinstance(info, dict) else None
    stats = tb.get("stats") if isinstance(tb, dict) else None
    if isinstance(stats, list) and all(isinstance(f, str) and f in STATS_FIELDS for f in stats):
        return tuple(stats)
    return DEFAULT_STATS


def _json_text(value) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        if not np.isfinite(value):
            return "null"
        text = repr(value)  # the shortest form that reads back, as fmt's "{}"
        return text[:-2] if text.endswith(".0") else text
    if isinstance(value, str):
        return _json_string(value)
    if isinstance(value, (list, tuple)):
        return "[" + ",".join(_json_text(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{_json_string(str(k))}: {_json_text(v)}" for k, v in value.items()) + "}"
    return _json_string(str(value))


def dump_line(dump: dict) -> str:
    """A dump as the writer puts its line of dumps.jsonl (append_dump_json,
    sdk/src/sinks/run_json.cpp: members separated by ", ", ": " after a key,
    arrays of integers without spaces), for a dump that has no line there
    (a run of a tensortap before dumps.jsonl)."""
    return _json_text(dump)


def dump_lines(directory: str, info: dict) -> List[tuple]:
    """(step, the dump's line of dumps.jsonl as bytes, without its newline)
    for each dump of the rank in `directory` (run.json `info`), the dumps the
    reader gives (Run.dumps). Each is matched to the first line not taken
    yet that reads as the same object; a dump without one (an older run, or
    an append that failed) is written as the writer would have (dump_line).
    dumps.jsonl is opened only as a regular file, never through a link."""
    dumps = _rank_dumps(directory, info)
    lines: Dict[str, collections.deque] = {}
    path = os.path.join(directory, DUMPS)
    if dumps and os.path.lexists(path):
        try:
            with _open_regular(path, follow=False) as f:
                data = f.read()
        except (RunError, OSError):
            data = b""  # _rank_dumps said so, where it read the file
        for raw in data.split(b"\n"):
            try:
                value = json.loads(raw.decode("utf-8"))
            except (ValueError, RecursionError):  # UnicodeDecodeError is a ValueError
                continue
            if isinstance(value, dict):
                lines.setdefault(_key(value), collections.deque()).append(raw)
    out: List[tuple] = []
    for d in dumps:
        step = d.get("step")
        if not _is_int64(step):
            _warn(f"{os.path.join(directory, DUMPS)}: a dump without an integer \"step\" is not exported: "
                  f"{dump_line(d)[:80]}")
            continue
        # The first line not taken yet that reads as the same object: one
        # lookup, not a scan (20,000 dumps took a quadratic 11 s).
        same = lines.get(_key(d))
        out.append((step, same.popleft() if same else dump_line(d).encode("utf-8")))
    return out
