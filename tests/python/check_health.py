"""`tensortap doctor` on runs of real programs (tests/CMakeLists.txt, doctor.*):

    check_health.py examples NAME=RUN...   the examples' runs, healthy: no finding, and
                                           the rules that their kinds allow evaluated
    check_health.py planted OUT            tests/programs/health_runs.cpp's runs: each planted
                                           problem named by its rule, on a tensor of the planted
                                           layer; the healthy modes: no finding. And the live
                                           rules (C++ Trigger::dead_relu() and the rest, on in
                                           every run with statistics) agree with the doctor:
                                           a rule fired live exactly where the doctor's first
                                           episode of it opens, and never where it finds none

Each run's doctor output is printed, with the steps from the plant to the
detection (docs/health.md's table).
"""

import contextlib
import io
import re
import sys
import warnings

import tensortap
from tensortap import __main__ as cli
from tensortap._doctor.rules import PARAMETERS, RULES

# The GAN's losses oscillate by design (two players): loss_not_decreasing off.
ALL_BUT_LOSS = ",".join(r for r in RULES if r != "loss_not_decreasing")


def doctor(path, *args):
    """(exit status, stdout lines, stderr) of `tensortap doctor PATH ARGS`."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        status = cli.main(["doctor", path, *args])
    return status, out.getvalue().splitlines(), err.getvalue()


def check_examples(pairs):
    for label, path in pairs:
        args = ["--rules", ALL_BUT_LOSS] if label == "gan" else []
        status, lines, err = doctor(path, *args)
        print(f"{label}: tensortap doctor {' '.join(args)}\n  " + "\n  ".join(lines))
        assert status == 0 and lines[-1] == "0 findings", (label, lines, err)
        # With statistics (TENSORTAP_OPTIONS, tests/CMakeLists.txt): not from records.
        assert "computed from the full records" not in err, (label, err)
        frame = tensortap.doctor(path, rules=args[1].split(",") if args else None)
        assert frame.empty, (label, frame)
        skipped = frame.attrs["not_evaluated"]
        # What every example's kinds allow, evaluated: a rule quietly not run proves nothing.
        for rule in ("vanishing_gradient", "exploding_tensor", "all_zero", "unchanged_tensor", "tensor_variance"):
            assert rule not in skipped, (label, rule, skipped)
        if label in ("mlp", "mnist"):
            assert "loss_not_decreasing" not in skipped, (label, skipped)
        if label in ("gan", "mnist"):
            assert "weight_update_ratio" not in skipped, (label, skipped)
    print(f"examples: no finding on {len(pairs)} healthy runs")


# mode -> (rule, kind, name pattern, the step the problem starts) findings that must be there
EXPECTED = {
    "vanishing": [("vanishing_gradient", "grad", r"fc1\.weight", 0)],
    "exploding": [("exploding_tensor", None, r".+", 0)],
    "dead_relu": [("dead_relu", "activation", r"relu2", 0)],
    "saturated": [("saturated_activation", "activation", r"tanh2", 0)],
    "saturated_records": [("saturated_activation", "activation", r"tanh2", 0),
                          ("saturated_activation", "activation", r"tanh2_input", 0)],
    "stuck": [("loss_not_decreasing", "tensor", r"loss", 0), ("unchanged_tensor", "param", r"fc\d\.weight", 0)],
    "frozen_zero": [("all_zero", "param", r"fc2\.weight", 0)],
    "poor_init": [("poor_weight_initialization", None, None, 0)],
    "update_ratio": [("weight_update_ratio", "param", r"fc\d\.weight", 0)],
    "variance": [("tensor_variance", "activation", r"relu1(_input)?", 60)],
    "stall": [("stalled_training", None, None, 20)],
}
# mode -> (rule, name pattern) findings that must not be there
FORBIDDEN = {
    # A frozen layer is never "unchanged", nor too slow.
    "frozen_zero": [("unchanged_tensor", r"fc2\."), ("weight_update_ratio", r"fc2\.")],
}
HEALTHY = ("healthy", "healthy_records")


def detection(frame, row):
    """The step at which a live rule would fire: its episode's patience-th
    evaluation (every step is evaluated in these runs)."""
    params = PARAMETERS[row.rule]
    if row.rule == "unchanged_tensor":
        return row.first_step + params["num_steps"][1] - 1
    if row.rule == "weight_update_ratio":  # an evaluation ends a step after it starts
        return row.first_step + params["patience"][1]
    if "patience" in params:
        return row.first_step + params["patience"][1] - 1
    return row.first_step


LIVE = [r for r in RULES if r not in ("weight_update_ratio", "stalled_training")]


def check_live(mode, run, frame):
    """The live rules' dumps against the doctor's findings over the same rows:
    each rule fires once (cooldown 0), at the step where its earliest episode
    opens (`detection`), on a tensor of such an episode; no finding, no dump."""
    fired = {d["reason"]: d for d in reversed(run.dumps) if d.get("reason") in LIVE}
    on = {t["kind"] for t in run.info["options"]["dump_on"]}
    assert on == set(LIVE), (mode, on)
    for rule in LIVE:
        found = frame[frame.rule == rule]
        if found.empty:
            assert rule not in fired, (mode, rule, fired.get(rule))
            continue
        assert rule in fired, (mode, rule, "the doctor finds it, the live rule never fired")
        at = [detection(frame, row) for row in found.itertuples()]
        first = min(at)
        d = fired[rule]
        assert d["step"] == first, (mode, rule, "live at", d["step"], "doctor at", first)
        assert d["trigger"]["kind"] == rule and "threshold" in d and "value" in d, d
        names = {row.name for row, step in zip(found.itertuples(), at) if step == first}
        if rule == "poor_weight_initialization":
            assert d["kind"] == "activation", d
        else:
            assert d["name"] in names, (mode, rule, d["name"], names)
        print(f"  live {rule}: {d['kind']} {d['name']} at step {d['step']} (value {d['value']:.4g}, "
              f"threshold {d['threshold']:.4g}): where the doctor's episode opens")


def check_planted(out):
    modes = sorted(set(EXPECTED) | set(HEALTHY))
    for mode in modes:
        path = f"{out}/{mode}"
        status, lines, err = doctor(path)
        print(f"== {mode}: tensortap doctor\n  " + "\n  ".join(lines))
        frame = tensortap.doctor(path)
        if not mode.endswith("_records"):
            with tensortap.Run(path) as run:
                check_live(mode, run, frame)
        if mode in HEALTHY:
            assert status == 0 and frame.empty, (mode, lines)
            # Every rule evaluated on a healthy run of every kind (no stall watchdog here).
            assert list(frame.attrs["not_evaluated"]) == ["stalled_training"], frame.attrs["not_evaluated"]
            source = "records" if mode.endswith("_records") else "statistics"
            assert set(frame.attrs["statistics"].values()) == {source}, frame.attrs["statistics"]
            continue
        assert status == 1, (mode, status, err)
        for rule, kind, pattern, start in EXPECTED[mode]:
            hits = frame[frame.rule == rule]
            if kind is not None:
                hits = hits[hits.kind == kind]
            if pattern is not None:
                hits = hits[[re.fullmatch(pattern, n) is not None for n in hits.name]]
            assert len(hits), (mode, rule, kind, pattern, lines)
            first = hits.sort_values("first_step").iloc[0]
            print(f"  -> {rule} on {first.kind or '-'} {first['name'] or '-'}: planted at step {start}, "
                  f"detected at step {detection(frame, first)}")
        for rule, pattern in FORBIDDEN.get(mode, []):
            bad = frame[(frame.rule == rule) & [re.match(pattern, n or "") is not None for n in frame.name]]
            assert bad.empty, (mode, rule, bad)
    print(f"planted: {len(modes)} runs, each problem named by its rule, live and offline in agreement")


if __name__ == "__main__":
    # The rules divide by statistics that may be 0: a RuntimeWarning is a defect.
    warnings.simplefilter("error", RuntimeWarning)
    if len(sys.argv) >= 3 and sys.argv[1] == "examples":
        check_examples([a.split("=", 1) for a in sys.argv[2:]])
    elif len(sys.argv) == 3 and sys.argv[1] == "planted":
        check_planted(sys.argv[2])
    else:
        sys.exit(__doc__)
