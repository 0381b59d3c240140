"""A run judged by every rule, rank by rank (evaluate), tensortap.doctor()
and `tensortap doctor`: its lines, JSON lines and monitoring lines."""

from __future__ import annotations

import json
import math
from typing import TYPE_CHECKING, Any, Callable, Dict, Iterable, List, Mapping, Optional, Sequence, Tuple, Union

from . import groups as groups_
from . import rows as rows_
from . import taps as taps_
from .._base import RunError, _safe, _warn
from .._files import has_statistics, monitoring_line
from .._run import Run
from .rows import ValueMeasure
from .rules import (_all_zero, _dead_relu, _exploding_tensor, _loss_not_decreasing, _num, _poor_weight_initialization,
                    _saturated_activation, _tensor_variance, _unchanged_tensor, _vanishing_gradient,
                    _weight_update_ratio, saturation_measure)
from .settings import Settings, parse_sets
from .verdict import COLUMNS, Finding, Result, _Rank, _Verdict

if TYPE_CHECKING:
    import os

    import pandas


def _stalled_training(run: Run) -> Tuple[List[Finding], bool]:
    """The stall dumps' findings, and whether any rank recorded with stall_after."""
    out = []
    watched = False
    thresholds: Dict[Optional[int], float] = {}
    for key, info in run.infos.items():
        opts = info.get("options")
        ms = opts.get("stall_after_ms") if isinstance(opts, dict) else None
        if isinstance(ms, (int, float)) and not isinstance(ms, bool) and ms > 0:
            watched = True
            thresholds[key] = float(ms) / 1000
        else:
            thresholds[key] = math.nan
    for d in run.dumps:
        if d.get("reason") != "stall":
            continue
        key = d.get("rank") if run.ranks else None
        rank = _rank_number(run, key)
        last, secs = d.get("last_step"), d.get("stalled_seconds")
        if not isinstance(last, int) or isinstance(last, bool) or not isinstance(secs, (int, float)) \
                or isinstance(secs, bool):
            _warn(f"a stall dump without an integer last_step and a number stalled_seconds was skipped: "
                        f"{_safe(d)}")
            continue
        thr = thresholds.get(key, math.nan)
        limit = f" (stall_after {_num(thr)} s)" if math.isfinite(thr) else ""
        out.append(Finding(rank, "stalled_training", None, None, last, last, float(secs), thr,
                           f"no step() for {_num(float(secs))} s after step {last}{limit}"))
    return out, watched


def _rank_number(run: Run, key: Optional[int]) -> int:
    if key is not None:
        return key
    rank = run.info.get("rank", 0)
    return rank if isinstance(rank, int) and not isinstance(rank, bool) else 0


_PER_RANK: Dict[str, Callable[[_Rank, Dict[str, Any], _Verdict], None]] = {
    "vanishing_gradient": _vanishing_gradient, "exploding_tensor": _exploding_tensor, "all_zero": _all_zero,
    "unchanged_tensor": _unchanged_tensor, "loss_not_decreasing": _loss_not_decreasing, "dead_relu": _dead_relu,
    "saturated_activation": _saturated_activation, "tensor_variance": _tensor_variance,
    "poor_weight_initialization": _poor_weight_initialization,
}


def evaluate(run: Run, settings: Optional[Settings] = None) -> Result:
    """Every rule of `settings` (default: all, default parameters) over `run`."""
    chosen = settings if settings is not None else Settings()
    keys: List[Optional[int]] = list(run.ranks) if run.ranks else [None]
    has_table = {k: _has_table(run, k) for k in keys}
    sat = chosen["saturated_activation"]

    declared = taps_.declared_any(run)

    def measure_of(kind: str, name: str) -> ValueMeasure:
        function = taps_.function_of(name, declared)
        if "saturated_activation" in chosen.rules and kind == "activation" and \
                (function in taps_.SATURATING or function is None and sat["include"].search(name)):
            return saturation_measure(name, sat["derivative"], taps_.saturating_function(name, declared))
        return None

    from_records = {k: _rank_number(run, k) for k in keys if not has_table[k]}
    computed = rows_.from_records(run, from_records, measure_of) if from_records else {}
    verdicts: Dict[str, List[_Verdict]] = {rule: [] for rule in chosen.rules}
    sources: Dict[int, str] = {}
    where: groups_.Position = {}
    for k in keys:
        rows = computed[k] if k in computed else rows_.from_table(run, k, _rank_number(run, k))
        sources[rows.rank] = rows.source
        where.update(groups_.positions(rows))
        r = _Rank(rows)
        r.taps = taps_.declared(run, k)
        for rule in chosen.rules:
            if rule == "stalled_training":
                continue
            v = _Verdict()
            if rule == "weight_update_ratio":
                _weight_update_ratio(r, chosen[rule], v, run)
            else:
                _PER_RANK[rule](r, chosen[rule], v)
            verdicts[rule].append(v)
    findings: List[Finding] = []
    not_evaluated: Dict[str, str] = {}
    for rule in chosen.rules:
        if rule == "stalled_training":
            stalls, watched = _stalled_training(run)
            findings += stalls
            if not stalls and not watched:
                not_evaluated[rule] = "the run was recorded without stall_after (Options::stall_after)"
            continue
        vs = verdicts[rule]
        for v in vs:
            findings += v.findings
        if not any(v.evaluated for v in vs):
            not_evaluated[rule] = next((v.why for v in vs if v.why), "nothing to judge")
    groups = groups_.arrange(findings, where)
    return Result([f for g in groups for f in g], not_evaluated, sources, bool(run.ranks), groups, where)


def _has_table(run: Run, key: Optional[int]) -> bool:
    return has_statistics(run._dirs[key])


def lines(result: Result, every: bool = False) -> List[str]:
    """The command's output: the likely cause and a line per group (`every`:
    a line per finding), rules not evaluated, the count (of the lines above)."""
    out = groups_.lines(result.groups, result.positions, result.ranks, every)
    out += [f"{rule}: not evaluated: {why}" for rule, why in result.not_evaluated.items()]
    n = len(result.findings) if every else len(result.groups)
    out.append(f"{n} finding{'' if n == 1 else 's'}")
    return out


def json_lines(result: Result) -> List[str]:
    """--json: one object per finding (the frame's columns), then one per rule not evaluated."""
    return [f.json() for f in result.findings] + \
        [json.dumps({"rule": rule, "not_evaluated": why}) for rule, why in result.not_evaluated.items()]


def doctor(run: Union[Run, str, "os.PathLike[str]"], rules: Optional[Iterable[str]] = None,
           params: Optional[Mapping[str, Any]] = None) -> pandas.DataFrame:
    """The training health rules over `run` (a Run or a run directory): a
    pandas DataFrame of findings, one row per (rule, rank, kind, name,
    episode), columns rank, rule, kind, name, first_step, last_step, value,
    threshold, message (kind and name None for rules about the whole
    model); attrs["not_evaluated"] = {rule: why}, attrs["statistics"] =
    {rank: "statistics" | "records"} (where its rows came from).
    `rules`: names to evaluate (default all); `params`: {"<rule>.<parameter>":
    value}, as `--set` (tensortap/_doctor.py defines each). A bad rule or
    parameter raises ValueError naming it."""
    from .._optional import need

    pd = need("pandas", "python3-pandas", "tensortap.doctor()")
    settings = Settings(rules, params)
    if isinstance(run, Run):
        result = evaluate(run, settings)
    else:
        with Run(run) as opened:
            result = evaluate(opened, settings)
    frame = pd.DataFrame({
        "rank": pd.Series([f.rank for f in result.findings], dtype="int64"),
        "rule": pd.Series([f.rule for f in result.findings], dtype=object),
        "kind": pd.Series([f.kind for f in result.findings], dtype=object),
        "name": pd.Series([f.name for f in result.findings], dtype=object),
        "first_step": pd.Series([f.first_step for f in result.findings], dtype="int64"),
        "last_step": pd.Series([f.last_step for f in result.findings], dtype="int64"),
        "value": pd.Series([f.value for f in result.findings], dtype="float64"),
        "threshold": pd.Series([f.threshold for f in result.findings], dtype="float64"),
        "message": pd.Series([f.message for f in result.findings], dtype=object),
        "group": pd.Series([f.group for f in result.findings], dtype="int64"),
    }, columns=list(COLUMNS))
    frame.attrs["not_evaluated"] = dict(result.not_evaluated)
    frame.attrs["statistics"] = dict(result.sources)
    return frame


def _monitoring_lines(run: Run) -> List[str]:
    """Above the findings: where statistics stopped (run.json's
    "monitoring"), the rules saw no step after it."""
    out: List[str] = []
    for rank, info in sorted(run.infos.items(), key=lambda kv: -1 if kv[0] is None else kv[0]):
        line = monitoring_line(info)
        m = info.get("monitoring") or {}
        if line and m.get("resumed_at") is None:
            where = "" if rank is None else f"rank {rank}: "
            out.append(f"{where}{line} (the rules saw no step after {m['statistics_stopped_at']})")
        elif line:
            out.append(("" if rank is None else f"rank {rank}: ") + line)
    # Budget::KeepLatest gave up the oldest statistics (docs/design.md#leaving-it-on):
    # the rules saw the steps kept, from the first row on.
    for rank, info in sorted(run.infos.items(), key=lambda kv: -1 if kv[0] is None else kv[0]):
        budget = info.get("budget")
        gone = budget.get("stats_rows_given_up") if isinstance(budget, dict) else None
        if not isinstance(gone, int) or gone <= 0 or not _has_table(run, rank):
            continue
        try:
            table, _ = run.stats_table(rank=rank)
        except RunError:
            continue
        if len(table):
            where = "" if rank is None else f"rank {rank}: "
            out.append(f"{where}the rules saw steps {int(table['step'].min())}..{int(table['step'].max())}: "
                       f"{gone} older statistics rows were given up (Budget::KeepLatest)")
    return out


def run_command(path: str, rules: Optional[str], sets: Sequence[str], as_json: bool,
                say: Callable[[str], None], every: bool = False) -> Tuple[List[str], int]:
    """`tensortap doctor`: (the lines to print, the exit status). `say` gets
    the one note for stderr (statistics computed from records). ValueError:
    bad input (exit 2); RunError, OSError: a run that cannot be read."""
    settings = Settings(rules.split(",") if rules is not None else None, parse_sets(sets))
    with Run(path) as run:
        result = evaluate(run, settings)
        stopped = _monitoring_lines(run)
    computed = sorted(r for r, s in result.sources.items() if s == "records")
    if computed:
        where = "" if not result.ranks else f" (rank{'s' if len(computed) > 1 else ''} " + \
            ", ".join(map(str, computed)) + ")"
        say(f"no statistics table (stats.npy){where}: the rules use statistics computed from the full records, "
            "with the recorder's definitions (Options::stats_every records them every step)")
    out = json_lines(result) if as_json else stopped + lines(result, every)
    status = 2 if len(result.not_evaluated) == len(settings.rules) else 1 if result.findings else 0
    return out, status
