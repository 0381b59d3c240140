"""TensorBoard event files checked against the run they show, by
writers/src/tensorboard/EVENTS.md, read with TensorBoard's own reader
(EventAccumulator): for `tensortap tensorboard`'s export
(test_tensorboard_export.py) and the recorder's own events alike.

    import tb_check
    tb_check.check_events_against_run(events_root, run_dir, histograms_every=100, exported=False)

`events_root` mirrors the run's layout: the folder of the events of a
single-rank run (the run directory itself for the recorder's), or the
folder holding rank<r>/ folders of a multi-rank run. Raises AssertionError
naming what differs; returns counts of what it compared.

What is expected is computed here from the run through the reader, not by
tensortap/_tensorboard/export.py (only an older run's dumps, which have no line in
dumps.jsonl, are rendered by its dump_line). Events may come in any order (a
layout's place is checked: check_layouts);
histograms are expected only at steps where step % histograms_every == 0.
TensorBoard is not a dependency of tensortap: its folder comes from
scripts/common.sh (install_tensorboard, tensorboard_dir) and must be on
PYTHONPATH.
"""

import bisect
import json
import math
import os
import re
import struct
import sys

import numpy as np

import tensortap
from tensortap import _files, _names

INSTALL_HINT = (
    "TensorBoard's reader is needed (tensorboard.backend.event_processing): install it with\n"
    "    bash -c 'source scripts/common.sh; install_tensorboard'\n"
    "and put its folder on PYTHONPATH:\n"
    "    PYTHONPATH=python:$(bash -c 'source scripts/common.sh; tensorboard_dir') "
    "/usr/bin/python3 tests/python/test_tensorboard_export.py")

STATS_FIELDS = ("min", "max", "mean", "std", "norm", "nan", "posinf", "neginf", "zeros", "numel")
DEFAULT_STATS = ("mean", "std", "min", "max", "norm")  # TensorBoardOptions::stats' default
DUMPS_TAG = "tensortap/dumps"
LAYOUT_TAG = "custom_scalars__config__"
DT_STRING = 7


def tensorboard():
    """(event_accumulator, event_file_loader, masked_crc32c) of TensorBoard;
    AssertionError with INSTALL_HINT when it cannot be imported."""
    try:
        from tensorboard.backend.event_processing import event_accumulator, event_file_loader
        from tensorboard.compat.tensorflow_stub.pywrap_tensorflow import masked_crc32c
    except ImportError as e:
        raise AssertionError(f"cannot import TensorBoard ({e}) with this Python ({sys.executable}).\n"
                             + INSTALL_HINT) from None
    return event_accumulator, event_file_loader, masked_crc32c


# -- the spec, written out here again ----------------------------------------------------


def bucket_limits():
    positive = []
    v = 1e-12
    while v < 1e20:
        positive.append(v)
        v = v * 1.1
    positive.append(sys.float_info.max)
    return [-x for x in reversed(positive)] + [0.0] + positive


LIMITS = bucket_limits()
LIMIT_SET = set(LIMITS)


def tag_text(tag):
    """A tag as events hold it: a name's bytes that are not UTF-8 (lone
    surrogates in the reader's str) as U+FFFD."""
    return re.sub("[\ud800-\udfff]", "\ufffd", tag)


def values_of(array):
    a = np.asarray(array)
    v = np.abs(a.astype(np.complex128)) if a.dtype.kind == "c" else a.astype(np.float64)
    v = v.ravel()
    return v[np.isfinite(v)]


def expected_histogram(array):
    """(min, max, num, sum, sum_squares, limits, counts) per the spec, or None
    for an array without finite elements. Binned by bisect_right; DBL_MAX,
    above every limit but its own, in the last bucket."""
    v = values_of(array)
    if v.size == 0:
        return None
    counts = [0] * len(LIMITS)
    for x in v.tolist():
        counts[min(bisect.bisect_right(LIMITS, x), len(LIMITS) - 1)] += 1
    limits, out = [], []
    empty_run = False
    for k, c in enumerate(counts):
        if c:
            if empty_run:
                limits.append(LIMITS[k - 1])
                out.append(0.0)
            limits.append(LIMITS[k])
            out.append(float(c))
            empty_run = False
        else:
            empty_run = True
    if empty_run:
        limits.append(LIMITS[-1])
        out.append(0.0)
    with np.errstate(over="ignore"):
        squares = (v * v).tolist()
    return (float(v.min()), float(v.max()), float(v.size), exact_sum(v.tolist()), exact_sum(squares), limits, out)


SCALARS_TITLE = "tensortap: 0-d tensors (loss, learning rate)"
NORMS_TITLE = "tensortap: gradient norms"
STDS_TITLE = "tensortap: activations' std"
PER_CHART = 16


def top_module(name, deep):
    """A name's top-level module: up to its first '.' or '/', or, `deep`,
    up to its second; the whole name when it has no such separator."""
    return re.match(r"[^./]*(?:[./][^./]*)?" if deep else r"[^./]*", name).group(0)


def module_charts(names, kind, stat):
    """[(chart title, [regex])] of one category: the names grouped by
    top-level module (one component deeper when they all share the first
    and one has more), groups and names in order, 16 series a chart at most,
    each series `^` + re.escape(tag) + `$`."""
    names = sorted(set(names))
    deep = len({top_module(n, False) for n in names}) == 1 and any(re.search("[./]", n) for n in names)
    groups = {}
    for n in names:
        groups.setdefault(top_module(n, deep), []).append(n)
    out = []
    for module in sorted(groups):
        members = groups[module]
        count = (len(members) + PER_CHART - 1) // PER_CHART
        for i in range(count):
            title = module if count == 1 else "%s (%d/%d)" % (module, i + 1, count)
            out.append((title, ["^" + re.escape(f"{kind}/{n}/{stat}") + "$"
                                for n in members[i * PER_CHART:(i + 1) * PER_CHART]]))
    return out


def expected_layout(scalars=(), grads=(), activations=()):
    """The custom scalars layout EVENTS.md gives for these names (as in the
    tags: the 0-d tensors', the gradients whose norm is written, the
    activations whose std is), as (category title, [(chart title, [tag
    regex])]) in order."""
    out = []
    scalars = sorted(set(scalars))
    if "loss" in scalars:
        scalars.remove("loss")
        scalars.insert(0, "loss")
    if scalars:
        out.append((SCALARS_TITLE, [(n, ["^" + re.escape("tensor/" + n) + "$"]) for n in scalars]))
    if grads:
        out.append((NORMS_TITLE, module_charts(grads, "grad", "norm")))
    if activations:
        out.append((STDS_TITLE, module_charts(activations, "activation", "std")))
    return out


def charted_names(tags, stats, zero_d_tags, statistics_tags):
    """The names a file's layout charts, from the scalar tags it holds:
    (0-d tensors, gradients, activations). A `tensor/` tag is a 0-d
    tensor's when the run says so (`zero_d_tags`) or when it is no
    statistic of a tensor (`statistics_tags`: a tag may be both, two charts
    mixing, which the writers warn of); a gradient is charted when its norm
    is written, an activation when its std is."""
    def named(prefix, suffix):
        return {t[len(prefix):len(t) - len(suffix)] for t in tags
                if t.startswith(prefix) and t.endswith(suffix) and len(t) >= len(prefix) + len(suffix)}

    scalars = {t[len("tensor/"):] for t in tags
               if t.startswith("tensor/") and (t in zero_d_tags or t not in statistics_tags)}
    grads = named("grad/", "/norm") if "norm" in stats else set()
    activations = named("activation/", "/std") if "std" in stats else set()
    return scalars, grads, activations


def layout_problem(layout, tags):
    """Why a layout is not one TensorBoard can show as EVENTS.md means it,
    or None: a chart of more than 16 series, or a series whose expression
    is not ^...$ or matches (as TensorBoard's scalars route: re.match) not
    exactly one of `tags`, the file's scalar tags."""
    for category, charts in layout:
        for title, regexes in charts:
            if not regexes or len(regexes) > PER_CHART:
                return f"{category} / {title}: {len(regexes)} series"
            for r in regexes:
                if not (r.startswith("^") and r.endswith("$")):
                    return f"{category} / {title}: {r!r} is not anchored"
                hits = [t for t in tags if re.match(r, t)]
                if len(hits) != 1:
                    return f"{category} / {title}: {r!r} matches {len(hits)} tags {hits[:3]}"
    return None


def layout_of(tensor_proto):
    """A custom scalars config tensor read with TensorBoard's own Layout message."""
    from tensorboard.plugins.custom_scalar import layout_pb2

    assert tensor_proto.dtype == DT_STRING and not tensor_proto.tensor_shape.dim \
        and len(tensor_proto.string_val) == 1, f"the layout is not one string, no dims: {tensor_proto}"
    layout = layout_pb2.Layout()
    layout.ParseFromString(tensor_proto.string_val[0])
    return [(c.title, [(ch.title, list(ch.multiline.tag)) for ch in c.chart]) for c in layout.category]


def f32(value):
    """A value as a scalar event holds it: as a double (the statistics'
    value of an element), then a float32."""
    with np.errstate(over="ignore", invalid="ignore"):
        return float(np.asarray(value).astype(np.float64).astype(np.float32))


def same_float(a, b):
    return (math.isnan(a) and math.isnan(b)) or a == b


def close(a, b, scale):
    return a == b or abs(a - b) <= 1e-6 * scale + 1e-300


def exact_sum(values):
    try:
        return math.fsum(values)
    except OverflowError:  # DBL_MAX and more: infinite either way
        return float(np.sum(values))


# -- reading the events ---------------------------------------------------------------


def frames(path, masked_crc32c):
    """The serialized events of the TFRecord file `path`, each record's two
    masked CRC-32Cs checked (with TensorBoard's own CRC), the file whole."""
    with open(path, "rb") as f:
        data = f.read()
    out = []
    at = 0
    while at < len(data):
        assert len(data) - at >= 12, f"{path}: {len(data) - at} bytes at {at}, not a record header"
        header = data[at:at + 8]
        (n,) = struct.unpack("<Q", header)
        (crc,) = struct.unpack("<I", data[at + 8:at + 12])
        assert crc == masked_crc32c(header), f"{path}: the length's CRC at byte {at} is wrong"
        assert at + 12 + n + 4 <= len(data), f"{path}: the record at byte {at} ({n} bytes) runs past the end"
        body = data[at + 12:at + 12 + n]
        (crc,) = struct.unpack("<I", data[at + 12 + n:at + 16 + n])
        assert crc == masked_crc32c(body), f"{path}: the event's CRC at byte {at} is wrong"
        out.append(body)
        at += 16 + n
    return out


class Events:
    """What one folder's tensortap event files hold, as TensorBoard reads it."""

    def __init__(self, folder):
        event_accumulator, event_file_loader, masked_crc32c = tensorboard()
        self.folder = folder
        self.files = sorted(n for n in os.listdir(folder) if _names.is_events_file_name(n))
        self.scalars = {}     # tag -> [(step, value)]
        self.histograms = {}  # tag -> [(step, HistogramValue)]
        self.dumps = []       # [(step, bytes)]
        self.layouts = []     # [(file, step, layout_of)]
        self.order = {}       # file -> [(step, layout_of or None)] as written
        self.file_tags = {}   # file -> its scalar tags
        self.events = 0
        for name in self.files:
            path = os.path.join(folder, name)
            raw = frames(path, masked_crc32c)
            # Parsed by TensorBoard's protobuf, every one (a bad string field
            # fails the parse), then through its compat layers (the server's path).
            parsed = list(event_file_loader.LegacyEventFileLoader(path).Load())
            assert len(parsed) == len(raw), f"{path}: TensorBoard reads {len(parsed)} of {len(raw)} events"
            assert parsed[0].file_version == "brain.Event:2" and parsed[0].step == 0, \
                f"{path}: the first event is not file_version brain.Event:2 at step 0: {parsed[0]}"
            assert not any(e.HasField("file_version") for e in parsed[1:]), f"{path}: file_version again"
            for e in parsed[1:]:
                assert e.HasField("summary") and e.wall_time > 0, f"{path}: an event without summary: {e}"
            # In the order written: a layout's step against the events before it.
            self.order[name] = [(e.step, next((layout_of(v.tensor) for v in e.summary.value if v.tag == LAYOUT_TAG),
                                              None)) for e in parsed]
            with np.errstate(over="ignore"):  # DBL_MAX limits as float32 in TensorBoard's compat layer
                list(event_file_loader.EventFileLoader(path).Load())
            self.events += len(parsed)
            acc = event_accumulator.EventAccumulator(
                path, size_guidance={"scalars": 0, "histograms": 0, "tensors": 0, "images": 0, "audio": 0,
                                     "compressedHistograms": 0})
            with np.errstate(over="ignore"):  # its distributions interpolate up to DBL_MAX
                acc.Reload()
            tags = acc.Tags()
            for kind in ("images", "audio"):
                assert not tags[kind], f"{path}: {kind} {tags[kind]}"
            self.file_tags[name] = set(tags["scalars"])
            for tag in tags["scalars"]:
                self.scalars.setdefault(tag, []).extend((e.step, e.value) for e in acc.Scalars(tag))
            for tag in tags["histograms"]:
                self.histograms.setdefault(tag, []).extend((e.step, e.histogram_value) for e in acc.Histograms(tag))
            assert set(tags["tensors"]) <= {DUMPS_TAG, LAYOUT_TAG}, f"{path}: tensors {tags['tensors']}"
            if LAYOUT_TAG in tags["tensors"]:
                meta = acc.SummaryMetadata(LAYOUT_TAG)
                assert meta.plugin_data.plugin_name == "custom_scalars", f"{path}: the layout's plugin {meta}"
                self.layouts.extend((name, e.step, layout_of(e.tensor_proto)) for e in acc.Tensors(LAYOUT_TAG))
            if DUMPS_TAG in tags["tensors"]:
                meta = acc.SummaryMetadata(DUMPS_TAG)
                assert meta.plugin_data.plugin_name == "text", f"{path}: dumps' plugin {meta.plugin_data}"
                for e in acc.Tensors(DUMPS_TAG):
                    t = e.tensor_proto
                    assert t.dtype == DT_STRING and not t.tensor_shape.dim and len(t.string_val) == 1, \
                        f"{path}: a dump at step {e.step} is not one string, no dims: {t}"
                    self.dumps.append((e.step, bytes(t.string_val[0])))


# -- what the run says ---------------------------------------------------------------


def dump_lines(directory, info):
    """(step, the dump's line of dumps.jsonl) for each dump of the rank in
    `directory`, as the reader lists them."""
    dumps = _files._rank_dumps(directory, info)
    lines = []
    path = os.path.join(directory, _names.DUMPS)
    if os.path.isfile(path) and not os.path.islink(path):
        with open(path, "rb") as f:
            for raw in f.read().split(b"\n"):
                try:
                    value = json.loads(raw)
                except ValueError:
                    continue
                if isinstance(value, dict):
                    lines.append([raw, value])
    out = []
    for d in dumps:
        if not isinstance(d.get("step"), int) or isinstance(d.get("step"), bool):
            continue
        for pair in lines:
            if pair[1] is not None and pair[1] == d:
                out.append((d["step"], pair[0]))
                pair[1] = None
                break
        else:
            from tensortap._tensorboard.export import dump_line  # an older run: no line to take

            out.append((d["step"], dump_line(d).encode("utf-8")))
    return out


def run_stats(info):
    """The statistics the rank's recorder wrote (run.json options.tensorboard.stats),
    or the default for a run recorded without TensorBoard."""
    tb = (info.get("options") or {}).get("tensorboard")
    return tuple(tb["stats"]) if isinstance(tb, dict) and "stats" in tb else DEFAULT_STATS


def scalar_series(run, rank, table, series):
    """Series ids of 0-d tensor records (EVENTS.md): a 0-d `tensor` record of the
    name in the index; none of the name there at all and every row one value."""
    zero_d, other = set(), set()
    for rec in run.records:
        if rec.get("rank") == rank and rec["kind"] == "tensor":
            (other if rec["shape"] else zero_d).add(rec["name"])
    out = set()
    for s, (kind, name) in series.items():
        if kind != "tensor":
            continue
        rows = table[table["series"] == s]
        if name in zero_d or (name not in other and bool(np.all(rows["numel"] == 1))):
            out.add(s)
    return out


def expected(run, rank, histograms_every, stats):
    """(stats scalars, tensor scalars, histograms, dumps) of one rank:
    {tag: [(step, float32 value)]}, {tag: [(step, float32)]},
    {tag: [(step, expected_histogram)]}, [(step, line)]. A statistics row
    gives the statistics `stats` and, unless a NaN/Inf count is among them,
    `nonfinite` (their sum) from the series' first row where it is not 0; a
    0-d tensor's row gives `tensor/<name>` where no record of its step is
    stored, and its records no histogram."""
    directory = run._dirs[rank]
    stats_tags, tensors, histograms = {}, {}, {}
    fields = [f for f in STATS_FIELDS if f in stats]
    nonfinite = not {"nan", "posinf", "neginf"} & set(stats)
    stored = {(rec["name"], rec["step"]) for rec in run.records
              if rec.get("rank") == rank and rec["kind"] == "tensor" and rec["shape"] == []}
    # A complex 0-d tensor has no scalar: not from its records, not from its rows.
    silent = {rec["name"] for rec in run.records if rec.get("rank") == rank and rec["kind"] == "tensor"
              and rec["shape"] == [] and str(rec["dtype"]).startswith("complex")}
    if os.path.exists(os.path.join(directory, _names.STATS_TABLE)):
        table, series = run.stats_table(rank=rank)
        scalars = scalar_series(run, rank, table, series)
        gone = set()
        for row in table[np.argsort(table["step"], kind="stable")]:
            s = int(row["series"])
            key = series.get(s)
            if key is None:
                continue
            step = int(row["step"])
            if s in scalars:
                if (key[1], step) not in stored and key[1] not in silent:
                    value = (math.nan if row["nan"] else math.inf if row["posinf"] else -math.inf if row["neginf"]
                             else row["min"])
                    tensors.setdefault(tag_text(f"tensor/{key[1]}"), []).append((step, f32(value)))
                continue
            for f in fields:
                stats_tags.setdefault(tag_text(f"{key[0]}/{key[1]}/{f}"), []).append((step, f32(row[f])))
            bad = int(row["nan"]) + int(row["posinf"]) + int(row["neginf"])
            if nonfinite and (bad or s in gone):
                gone.add(s)
                stats_tags.setdefault(tag_text(f"{key[0]}/{key[1]}/nonfinite"), []).append((step, f32(bad)))
    for rec in run.records:
        if rec.get("rank") != rank:
            continue
        scalar = rec["kind"] == "tensor" and rec["shape"] == []
        histo = not scalar and histograms_every > 0 and rec["step"] % histograms_every == 0
        if not (scalar or histo):
            continue
        a = run._read(rec, mmap=False)
        if scalar and np.asarray(a).dtype.kind != "c":
            tensors.setdefault(tag_text(f"tensor/{rec['name']}"), []).append((rec["step"], f32(a)))
        if histo:
            h = expected_histogram(a)
            if h is not None:
                histograms.setdefault(tag_text(f"{rec['kind']}/{rec['name']}"), []).append((rec["step"], h))
    return stats_tags, tensors, histograms, dump_lines(directory, run.infos[rank])


# -- comparing -----------------------------------------------------------------------------


def _take(found, step, match):
    """Removes and returns the first (step, value) of `found` at `step` whose
    value `match` accepts, or None."""
    for i, (s, v) in enumerate(found):
        if s == step and match(v):
            return found.pop(i)
    return None


def histogram_problem(h):
    """Why the HistogramValue `h` is not one the spec allows, or None."""
    limits, counts = list(h.bucket_limit), list(h.bucket)
    if len(limits) != len(counts) or not limits:
        return f"{len(limits)} limits, {len(counts)} buckets"
    if any(b <= a for a, b in zip(limits, limits[1:])):
        return "limits not increasing"
    if not set(limits) <= LIMIT_SET:
        return f"limits not the spec's: {sorted(set(limits) - LIMIT_SET)[:3]}"
    if limits[-1] != sys.float_info.max:
        return f"the last limit is {limits[-1]}, not DBL_MAX"
    if any(c != int(c) or c < 0 for c in counts):
        return "counts not whole"
    if any(a == 0 and b == 0 for a, b in zip(counts, counts[1:])):
        return "two empty buckets in a row (runs of empty buckets are one)"
    # A written empty bucket stands for a run ending just below the next written one.
    for k in range(len(limits) - 1):
        if counts[k] == 0 and LIMITS.index(limits[k]) + 1 != LIMITS.index(limits[k + 1]):
            return f"the empty run ending at {limits[k]} does not reach the next bucket"
    if sum(counts) != h.num or h.num <= 0:
        return f"counts sum to {sum(counts)}, num is {h.num}"
    if not h.min <= h.max:
        return f"min {h.min} > max {h.max}"
    return None


def same_histogram(h, want):
    mn, mx, num, total, squares, limits, counts = want
    # Summed in another order: within what rounding can do (inf beyond DBL_MAX).
    biggest = max(abs(mn), abs(mx))
    return (h.min == mn and h.max == mx and h.num == num and list(h.bucket_limit) == limits
            and list(h.bucket) == counts and close(h.sum, total, biggest * num)
            and close(h.sum_squares, squares, biggest * biggest * num))


def statistics_tags(run, rank, stats):
    """Every tag a statistic of a tensor that is not 0-d may write (`tensor/<name>/<stat>`):
    its records have a shape, or its rows are not a 0-d tensor's."""
    fields = [f for f in STATS_FIELDS if f in stats] + ["nonfinite"]
    names = {rec["name"] for rec in run.records if rec.get("rank") == rank and rec["kind"] == "tensor" and rec["shape"]}
    if os.path.exists(os.path.join(run._dirs[rank], _names.STATS_TABLE)):
        table, series = run.stats_table(rank=rank)
        scalars = scalar_series(run, rank, table, series)
        names |= {name for s, (kind, name) in series.items() if kind == "tensor" and s not in scalars}
    return {tag_text(f"tensor/{n}/{f}") for n in names for f in fields}


def check_layouts(events, name, chosen, zero_d_tags, stats_tags, exported):
    """The custom scalars layouts of one file (EVENTS.md, "The layout"),
    against the layout expected of the names its tags show. The export:
    one, the second event, at step 0. The recorder: written again as names
    come, each at a step no lower than any event before it (TensorBoard
    shows the last), the last one the layout of every name in the file
    (none written: a file without names to chart)."""
    where = os.path.join(events.folder, name)
    tags = events.file_tags[name]
    want = expected_layout(*charted_names(tags, chosen, zero_d_tags, stats_tags))
    order = events.order[name]
    mine = [(i, step, layout) for i, (step, layout) in enumerate(order) if layout is not None]
    for i, step, layout in mine:
        problem = layout_problem(layout, tags)
        assert problem is None, f"{where}: the layout at step {step} (event {i}): {problem}"
    if exported:
        assert len(mine) == 1, f"{where}: {len(mine)} custom scalars layouts, not one"
        i, step, layout = mine[0]
        assert (i, step) == (1, 0), f"{where}: the layout is event {i} at step {step}, not the second at step 0"
        assert layout == want, f"{where}: layout\n  have {layout}\n  want {want}"
        return
    highest = None
    for k, (step, layout) in enumerate(order):
        if layout is not None and highest is not None:
            assert step >= highest, f"{where}: a layout at step {step} (event {k}) after an event at step {highest}"
        highest = step if highest is None else max(highest, step)
    last = mine[-1][2] if mine else []
    assert last == want, f"{where}: the last layout\n  have {last}\n  want {want}"


def check_rank(events, run, rank, histograms_every, exact, stats, exported):
    where = events.folder
    if stats is None:
        stats = run_stats(run.infos[rank])
    chosen = stats
    stats, tensors, histograms, dumps = expected(run, rank, histograms_every, stats)
    stats_tags = statistics_tags(run, rank, chosen)
    for name in events.files:
        check_layouts(events, name, chosen, set(tensors), stats_tags, exported)
    found = {tag: list(v) for tag, v in events.scalars.items()}
    for source in (stats, tensors):
        for tag, want in source.items():
            have = found.get(tag, [])
            for step, value in want:
                got = _take(have, step, lambda v, value=value: same_float(v, value))
                if got is None:
                    raise AssertionError(f"{where}: scalar {tag!r} at step {step}: want {value!r}, "
                                         f"have {[v for s, v in have if s == step] or 'none'}")
    for tag, left in found.items():
        if not left:
            continue
        if not exact and tag.startswith("tensor/") and tag not in stats:
            continue  # a 0-d tensor the recorder held or took for statistics only
        raise AssertionError(f"{where}: scalar {tag!r} has values the run does not: {left[:5]}")
    n_hist = 0
    left = {tag: list(v) for tag, v in events.histograms.items()}
    for tag, have in left.items():
        for step, h in have:
            problem = histogram_problem(h)
            assert problem is None, f"{where}: histogram {tag!r} at step {step}: {problem}: {h}"
            assert histograms_every > 0 and step % histograms_every == 0, \
                f"{where}: histogram {tag!r} at step {step}, not a multiple of {histograms_every}"
    for tag, want in histograms.items():
        have = left.get(tag, [])
        for step, h in want:
            if _take(have, step, lambda v, h=h: same_histogram(v, h)) is None:
                raise AssertionError(f"{where}: histogram {tag!r} at step {step}: want {h[:5]} with "
                                     f"{len(h[6])} buckets; have {[v for s, v in have if s == step]}")
            n_hist += 1
    if exact:
        extra = {t: [s for s, _ in v] for t, v in left.items() if v}
        assert not extra, f"{where}: histograms the run does not have (tag: steps): {extra}"
    have = sorted(events.dumps)
    want = sorted(dumps)
    assert have == want, f"{where}: dumps\n  have {have}\n  want {want}"
    return {"scalars": sum(len(v) for v in stats.values()) + sum(len(v) for v in tensors.values()),
            "tensors": sum(len(v) for v in tensors.values()), "histograms": n_hist, "dumps": len(want),
            "files": len(events.files), "events": events.events}


def check_events_against_run(events_root, run, histograms_every=100, exact=True, stats=None, *, exported):
    """Asserts that the tensortap event files under `events_root` show `run`
    (a path or a tensortap.Run) as EVENTS.md says: every statistics row's
    scalars of `stats` (None: the run's TensorBoardOptions::stats, or the
    default five) and nonfinite (float32 of the table's values), every 0-d
    tensor record's tensor/<name> and none of its statistics, a histogram of
    every other record at the steps where step % histograms_every == 0 (and
    none elsewhere), every dump's line of dumps.jsonl as text, and the
    custom scalars layout of the names the file holds: `exported` (the
    export, `tensortap tensorboard`): one, at step 0; else (the recorder's
    own) the last one, none at a step below an event before it (check_layouts).
    With exact=False (the recorder's own events) the
    events may also hold 0-d tensors and histograms of records the index does
    not list (held by the flight recorder, or taken for statistics only), each
    still checked for form. Each rank's folder must hold at least one file.
    Returns the counts compared, summed over ranks."""
    own = not isinstance(run, tensortap.Run)
    if own:
        run = tensortap.open(run)
    try:
        totals = {}
        for rank in ([None] if not run.ranks else run.ranks):
            folder = events_root if rank is None else os.path.join(events_root, os.path.basename(run._dirs[rank]))
            events = Events(folder)
            assert events.files, f"{folder}: no tensortap event file"
            for k, v in check_rank(events, run, rank, histograms_every, exact, stats, exported).items():
                totals[k] = totals.get(k, 0) + v
        return totals
    finally:
        if own:
            run.close()
