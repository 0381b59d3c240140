"""python3 -m tensortap: six commands on a run directory. inspect summarizes a run and checks its files;
report writes its HTML page; tensorboard exports it as TensorBoard event files; diff compares two runs
record by record; doctor names what is wrong with the training (the health rules); ctl steers a job while
it trains.

    python3 -m tensortap inspect RUN_DIR [--check]
    python3 -m tensortap report RUN_DIR [-o report.html] [--steps 0,100,200] [--histograms 6]
    python3 -m tensortap tensorboard RUN_DIR [--logdir DIR] [--histograms-every 100] [--stats mean,std,...|all]
    python3 -m tensortap diff RUN_A RUN_B [--rtol R] [--atol A] [--floor A2 ... [--factor F] [--ulps U]]
                              [--steps A..B] [--kinds a,b] [--exclude REGEX] [--common-only] [--html OUT.html]
                              [--json]
    python3 -m tensortap doctor RUN_DIR [--rules a,b] [--set RULE.PARAM=VALUE ...] [--json] [--all]
    python3 -m tensortap ctl RUN_DIR dump | capture --steps N [--kinds a,b] [--include PATTERN] | every N
                                 | pause | resume | status   [--rank R] [--timeout S]

The summary lists kinds, names, the steps captured, shapes, dtypes, bytes,
dropped records and whether the run was closed cleanly, and how often the
health rules fired live (dumps; inspect evaluates no rule: doctor does).
--check also opens every file the index names and compares its shape and
dtype with the index; the exit status is 1 if any does not match or cannot
be read, or if a damaged line of the index or the statistics was skipped, or
the statistics cannot be read. A run that cannot be opened at all exits with 2.

report writes one self-contained HTML page (figures and data inline, no
network): first the health rules' findings (the doctor's, each linked to a
chart of its tensor), the summary, curves of the scalar tensor records (the
loss), gradient norms, activation histograms, heatmaps of
statistics and the flight recorder's dumps (tensortap/report.py).

tensorboard writes the run as TensorBoard event files, one per rank
(tensortap/_tensorboard.py, writers/src/tensorboard/EVENTS.md): statistics
as scalars <kind>/<name>/<stat> (--stats, default the run's own
TensorBoard setting or mean, std, min, max and norm; NaN and Inf counts as
<kind>/<name>/nonfinite from a tensor's first), 0-d tensor records (the
loss) as the one scalar tensor/<name>, histograms of the other records at
every --histograms-every'th step, the flight recorder's dumps as text, and
a custom scalars layout (the loss, gradient norms, activations' std). Into the run directory, unless
the recorder wrote events there already; with --logdir DIR, into
DIR/<the run's folder name>/. Then: tensorboard --logdir DIR.

diff compares two runs record by record (tensortap/_diff.py has the rules),
A the reference: it prints the first divergence (the earliest step with a
record beyond tolerance, the first such record in A's order) and where it
arises (in the initial state, the forward, the loss, the backward, the
update, a buffer), with the record that agreed before it and the next that
differ, the records on one side only, and last "compared N, differ D, only
in A X, only in B Y". --floor A2 (A's program with its initial weights
perturbed by tensortap.torch.perturb) makes a record that differs from A no
more than --factor times A2 does "noise", an agreement (", noise K" in the
last line); --floor given several times (seeds 0, 1, 2) makes the envelope
of the floor runs the floor, and says where they disagree. --json prints an
object per record (with both runs' dtypes) and one for the comparison.
--steps, --kinds and --exclude choose the records compared. It
streams: a few bytes per record beyond the runs' indexes. Exit status 0:
every record is on both sides and agrees within tolerance (default:
exactly); 1: some differ, are unreadable, or are on one side only (unless
--common-only); 2: bad input.

doctor evaluates the training health rules (smdebug's built-in rules:
vanishing_gradient, exploding_tensor, dead_relu, ...; tensortap/_doctor.py
defines each) over a run's statistics, or over statistics computed from its
full records where it has none: first "likely cause: <a finding's line>",
then one line per group (one rule and kind on tensors whose episodes
overlap), causes before consequences (docs/health.md), "<rule>: <n> <kind>s
(<first name> ... <last name>) steps <first>..<last>: <what>" (a group of
one: "<rule>: <kind> <name> steps <first>..<last>: <message>"); --all: a
line per finding instead; a line per rule it could not evaluate, and "N
findings" (groups, or findings under --all). Exit status 0: no finding; 1:
findings; 2: bad input, or no rule could be evaluated.

ctl steers a job while it trains (tensortap/_ctl/, docs/leaving-it-on.md):
it writes a request into each addressed rank's control/ and prints one line
per rank, "rank <r>: <command> ok at step <s>: <what>", "... refused:
<why>", "... no answer (withdrawn)", "... taken at step <s>, not yet in
effect", "no live recorder (<why>)" or "no control channel (<why>)". Exit
status 0: every addressed rank answered ok within --timeout; 1: any other
line; 2: bad input.
"""

from __future__ import annotations

from typing import Any, Callable, Dict, Optional, Sequence

import argparse
import signal
import sys
import warnings

from ._base import STATS_FIELDS, RunError, RunWarning, _safe
from ._run import Run
from ._views.summary import check, summarize

def main(argv: Optional[Sequence[str]] = None) -> int:
    # `tensortap inspect RUN | head` ends quietly, like any other command.
    if hasattr(signal, "SIGPIPE"):
        signal.signal(signal.SIGPIPE, signal.SIG_DFL)
    args = _parser().parse_args(argv)
    if args.command == "ctl":
        from ._ctl import client as _ctl

        return _ctl.main(args, print, lambda line: print(line, file=sys.stderr))
    if args.command == "doctor":
        return _doctor(args)
    if args.command == "diff":
        return _diff(args)
    if args.command == "report":
        return _report(args)
    if args.command == "tensorboard":
        return _tensorboard(args)
    return _inspect(args)


def _parser() -> argparse.ArgumentParser:
    """The command's arguments, a subcommand after another."""
    parser = argparse.ArgumentParser(prog="tensortap", description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("inspect", help="summarize a run directory")
    p.add_argument("run", help="the run directory")
    p.add_argument("--check", action="store_true", help="read every indexed file and verify shape and dtype")
    p = sub.add_parser("report", help="write a self-contained HTML page about a run")
    p.add_argument("run", help="the run directory")
    p.add_argument("-o", "--output", default="report.html", help="the page to write (default: report.html)")
    p.add_argument("--steps", help="steps of the activation histograms, e.g. 0,100,200 "
                   "(default: first, middle and last)")
    p.add_argument("--histograms", type=int, default=6, help="at most this many activations get histograms")
    p = sub.add_parser("tensorboard", help="write a run as TensorBoard event files")
    p.add_argument("run", help="the run directory")
    p.add_argument("--logdir", help="write into LOGDIR/<the run's folder name>/ (rank<r>/ per rank) instead of "
                   "into the run directory, which is refused where the recorder wrote events already")
    p.add_argument("--histograms-every", type=int, default=100, metavar="N",
                   help="histograms of every record at steps that are multiples of N (default: 100; 0: none)")
    p.add_argument("--stats", metavar="LIST",
                   help="the statistics written as scalars, comma-separated among min,max,mean,std,norm,nan,posinf,"
                   "neginf,zeros,numel, or 'all' (default: the run's own TensorBoardOptions::stats, or "
                   "mean,std,min,max,norm)")
    _diff_parser(sub)
    p = sub.add_parser("doctor", help="name what is wrong with a training run (health rules)")
    p.add_argument("run", help="the run directory")
    p.add_argument("--rules", metavar="LIST", help="evaluate these rules only, comma-separated (default: all)")
    p.add_argument("--set", action="append", default=[], metavar="RULE.PARAM=VALUE",
                   help="a rule's parameter, e.g. dead_relu.threshold=0.9 (repeatable; docs/health.md lists them)")
    p.add_argument("--json", action="store_true", help="one JSON object per line: the findings, then the rules "
                   "not evaluated")
    p.add_argument("--all", action="store_true", help="a line per tensor and episode instead of a line per group "
                   "(a rule on tensors whose episodes overlap) and the likely cause")
    _ctl_parser(sub)
    return parser


def _diff_parser(sub: Any) -> None:
    p = sub.add_parser("diff", help="compare two runs record by record, A the reference")
    p.add_argument("a", metavar="RUN_A", help="the reference run")
    p.add_argument("b", metavar="RUN_B", help="the run compared with it")
    p.add_argument("--rtol", type=float, default=0.0, help="relative tolerance: |a-b| <= atol + rtol*|a| (default 0)")
    p.add_argument("--atol", type=float, default=0.0, help="absolute tolerance (default 0)")
    p.add_argument("--floor", metavar="A2", action="append", help="A's program again, its initial parameters "
                   "moved by tensortap.torch.perturb: a record of B that differs from A no more than --factor times "
                   "A2 does is noise, an agreement; repeat it for several seeds (the largest of their floors counts)")
    p.add_argument("--factor", type=float, help="the floor's factor (default 10)")
    p.add_argument("--ulps", type=int, help="A2's step-0 params must be within this many ulps of A's (default 1)")
    p.add_argument("--steps", metavar="A..B", help="compare the steps A to B only (A.., ..B, or one step N)")
    p.add_argument("--kinds", metavar="LIST", help="compare these kinds only, comma-separated (activation, "
                   "activation_grad, param, buffer, grad, tensor)")
    p.add_argument("--exclude", metavar="REGEX", help="leave out the names this pattern finds (the recorder's "
                   "ECMAScript syntax, in linear time)")
    p.add_argument("--common-only", action="store_true",
                   help="compare the records both runs hold; those on one side only do not fail")
    p.add_argument("--html", metavar="OUT", help="also write a self-contained page: the summary, the error by "
                   "name and step for every kind, and a view of the records that differ most")
    p.add_argument("--json", action="store_true", help="one JSON object per line: a record each (with both runs' "
                   "dtypes), then the comparison's (first_divergence, floor_disagrees_step, the counts)")


def _inspect(args: argparse.Namespace) -> int:
    """`tensortap inspect RUN [--check]`: the summary, the damaged lines, and with --check every file read."""
    with warnings.catch_warnings(record=True) as caught:
        # Every damaged line, even one a warning filter already showed once.
        warnings.simplefilter("always", RunWarning)
        try:
            run = Run(args.run)
        except (RunError, OSError, ValueError) as e:
            print(f"tensortap: {_safe(e)}", file=sys.stderr)
            return 2
        with run:
            problems = summarize(run, doctor_hint=True)
            damaged = [_safe(w.message) for w in caught if issubclass(w.category, RunWarning)]
            for message in damaged:
                print(f"tensortap: warning: {message}", file=sys.stderr)
            failed = args.check and check(run, found=damaged + list(problems)) > 0
    # Shown only now: inside the block, showing one would record it again.
    for w in caught:
        if not issubclass(w.category, RunWarning):
            warnings.showwarning(w.message, w.category, w.filename, w.lineno)
    return 1 if failed else 0


def _ctl_parser(sub):
    from ._ctl.client import COMMANDS, MAX_TIMEOUT_S

    p = sub.add_parser("ctl", help="steer a running job: dump, capture, every, pause, resume, status")
    p.add_argument("run", help="the run directory, or a distributed run's root (every rank)")
    p.add_argument("action", metavar="COMMAND", choices=COMMANDS,
                   help="dump (the flight recorder now, or a mark), capture (the next steps in full), every "
                   "(the cadence from the next step), pause, resume (full tensors), status (records, bytes, "
                   "budget, seconds since the last step)")
    p.add_argument("value", nargs="?", metavar="N", help="every N: every N-th step from the next one is "
                   "captured (0: no full tensors; statistics go on)")
    p.add_argument("--steps", metavar="N", help="capture: how many steps, from the next one, are captured in full")
    p.add_argument("--kinds", metavar="LIST", help="capture: these kinds for those steps, comma-separated "
                   "(activation, activation_grad, param, buffer, grad, tensor; default: the recorder's)")
    p.add_argument("--include", metavar="PATTERN", help="capture: only the names this pattern finds (the "
                   "recorder's ECMAScript syntax; replaces its include, its exclude still applies)")
    p.add_argument("--rank", metavar="R", help="address rank R of a distributed run only")
    p.add_argument("--timeout", metavar="S", default="30", help="wait at most S seconds for every answer, "
                   f"then withdraw what was not taken (default 30, at most {MAX_TIMEOUT_S:.0f})")


def _report(args):
    from ._pages.report import write_report

    steps = None
    if args.steps:
        try:
            steps = [int(s) for s in args.steps.split(",") if s.strip()]
        except ValueError:
            print(f"tensortap: --steps wants integers separated by commas, not {_safe(args.steps)!r}", file=sys.stderr)
            return 2
    out = args.output

    def work():
        with Run(args.run) as run:
            write_report(run, out, steps=steps, histograms=max(0, args.histograms))
        return out

    if _command("report", work) is None:
        return 2
    print(f"tensortap: wrote {_safe(out)}")
    return 0


def _command(what, work):
    """Runs a command's `work()`: each warning about the run (a damaged
    line skipped, a record not exported) printed once, any other shown; an
    error printed as one line, never a traceback. Returns what `work`
    returned, or None after an error."""
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always", RunWarning)
            result = work()
        for w in caught:
            if issubclass(w.category, RunWarning):
                print(f"tensortap: warning: {_safe(w.message)}", file=sys.stderr)
            else:
                warnings.showwarning(w.message, w.category, w.filename, w.lineno)
    except (RunError, OSError, ValueError, KeyError, ImportError) as e:
        print(f"tensortap: {_safe(e)}", file=sys.stderr)
        return None
    except Exception as e:  # noqa: BLE001 - a command prints what failed, not a traceback
        print(f"tensortap: the {what} failed: {type(e).__name__}: {_safe(e)}", file=sys.stderr)
        return None
    return result


def _tensorboard(args):
    from ._tensorboard.export import export_tensorboard

    if args.histograms_every < 0:
        print(f"tensortap: --histograms-every wants an integer >= 0 (0: no histograms), not {args.histograms_every}",
              file=sys.stderr)
        return 2
    stats = None
    if args.stats is not None:
        stats = list(STATS_FIELDS) if args.stats == "all" else [f for f in args.stats.split(",") if f]
        bad = [f for f in stats if f not in STATS_FIELDS]
        if bad:
            print(f"tensortap: --stats: {bad[0]!r} is not a statistic; the fields are {','.join(STATS_FIELDS)} "
                  "(or 'all')", file=sys.stderr)
            return 2

    def work():
        with Run(args.run) as run:
            return export_tensorboard(run, args.logdir, args.histograms_every, stats)

    written = _command("export", work)
    if written is None:
        return 2
    for path in written:
        print(f"tensortap: wrote {_safe(path)}")
    return 0


def _diff(args):
    import contextlib
    from ._diff.compare import run_command
    from ._diff.side import Options
    from ._diff.text import esc
    from ._diff.align import Selection, parse_kinds, parse_steps
    from ._pattern import Pattern

    try:
        steps = parse_steps(args.steps) if args.steps is not None else (None, None)
        kinds = parse_kinds(args.kinds) if args.kinds is not None else None
        if args.exclude is not None:
            Pattern(args.exclude, "--exclude")  # PatternError (a ValueError) names it
        if args.floor is None and (args.factor is not None or args.ulps is not None):
            raise ValueError("--factor and --ulps go with --floor A2")
        opts = Options(args.rtol, args.atol, 10.0 if args.factor is None else args.factor,
                       1 if args.ulps is None else args.ulps, Selection(steps, kinds, args.exclude))
    except ValueError as e:
        print(f"tensortap: {esc(e)}", file=sys.stderr)
        return 2

    def work():
        try:
            return compare()
        except (RunError, OSError, ValueError) as e:
            # Names and paths come from outside: bidi controls escaped too.
            raise RunError(esc(e)) from None

    def compare():
        with contextlib.ExitStack() as stack:
            floors = args.floor or []
            runs = [stack.enter_context(Run(path)) for path in [args.a, args.b] + floors]
            rows = None
            if args.html:
                from ._pages.diff import Collector

                rows = Collector(floor=bool(floors))
            on_row: Optional[Callable[[Dict[str, Any]], None]] = rows
            if args.json:
                from ._diff.jsonout import printer, summary_line

                on_row = printer(print, rows)
            lines, status, tally = run_command(runs, opts, args.common_only, on_row=on_row)
            if rows is not None:
                from ._pages.diff import write_diff_page

                write_diff_page(args.html, tally, rows, lines, (args.a, args.b, floors or None), opts)
            if args.json:
                lines = [summary_line(tally, status)]
        return lines, status

    result = _command("comparison", work)
    if result is None:
        return 2
    lines, status = result
    for line in lines:
        print(line)
    if args.html:
        print(f"tensortap: wrote {esc(args.html)}", file=sys.stderr if args.json else sys.stdout)
    return status


def _doctor(args):
    from ._doctor.command import run_command
    from ._doctor.settings import Settings

    try:
        # Bad rules and parameters first: exit 2 before any reading.
        Settings(args.rules.split(",") if args.rules is not None else None, _doctor_sets(args.set))
    except ValueError as e:
        print(f"tensortap: {_safe(e)}", file=sys.stderr)
        return 2
    result = _command("doctor", lambda: run_command(args.run, args.rules, args.set, args.json,
                                                    lambda note: print(f"tensortap: {note}", file=sys.stderr),
                                                    every=args.all))
    if result is None:
        return 2
    lines, status = result
    for line in lines:
        print(line)
    return status


def _doctor_sets(items):
    from ._doctor.settings import parse_sets

    return parse_sets(items)


if __name__ == "__main__":
    sys.exit(main())
