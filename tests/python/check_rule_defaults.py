#!/usr/bin/env python3
"""The health rules' defaults held across languages (ctest doctor.defaults).

The C++ factories (`Trigger::dead_relu()`, ...) and the doctor's PARAMETERS
(python/tensortap/_doctor/rules.py) each write every rule's defaults; docs.snippets
holds docs/health.md's column to PARAMETERS. Here a C++ run with every live
rule at its defaults (tests/programs/health_runs.cpp, its shortest mode,
about a second) is read back: run.json's `options.dump_on` lists each rule
with its parameters, which must be PARAMETERS' names and values, rule by
rule, and every rule of PARAMETERS must be there but the two that are not
live (weight_update_ratio needs two steps' values; stalled_training is the
watchdog's).

    check_rule_defaults.py HEALTH_RUNS        make the run, then check it
    check_rule_defaults.py --run RUN_DIR      check a run made already
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any, Dict, List

from tensortap._doctor import rules as _doctor

NOT_LIVE = {"weight_update_ratio", "stalled_training"}
MODE = "poor_init"  # the shortest of health_runs' modes with the rules on
# What a trigger's line has besides the rule's parameters.
NOT_PARAMETERS = {"kind", "cooldown"}


def same(cpp: Any, python: Any) -> bool:
    if isinstance(python, str):
        # kinds are a list in run.json, joined by "+" in PARAMETERS.
        return ("+".join(cpp) if isinstance(cpp, list) else cpp) == python
    if isinstance(cpp, (int, float)) and not isinstance(cpp, bool):
        return math.isclose(float(cpp), float(python), rel_tol=1e-12, abs_tol=0.0)
    return bool(cpp == python)


def check(run: Path) -> List[str]:
    options = json.loads((run / "run.json").read_text(encoding="utf-8"))["options"]
    rules: Dict[str, Dict[str, Any]] = {}
    for t in options["dump_on"]:
        if t.get("kind") in _doctor.PARAMETERS:
            rules[t["kind"]] = {k: v for k, v in t.items() if k not in NOT_PARAMETERS}
    errors: List[str] = []
    for rule, params in _doctor.PARAMETERS.items():
        if rule in NOT_LIVE:
            if rule in rules:
                errors.append(f"{rule}: live in run.json, but this check takes it for offline only")
            continue
        if rule not in rules:
            errors.append(f"{rule}: PARAMETERS has it, run.json's dump_on does not (is it live? health_runs on?)")
            continue
        cpp = rules[rule]
        for p, (_, default) in params.items():
            if p not in cpp:
                errors.append(f"{rule}.{p}: PARAMETERS' default {default!r}, the C++ side writes no {p}")
            elif not same(cpp[p], default):
                errors.append(f"{rule}.{p}: C++ writes {cpp[p]!r}, PARAMETERS says {default!r}")
        for p in sorted(set(cpp) - set(params)):
            errors.append(f"{rule}.{p}: the C++ side has it ({cpp[p]!r}), PARAMETERS does not")
    for rule in sorted(set(rules) - set(_doctor.PARAMETERS)):
        errors.append(f"{rule}: a live rule in run.json that the doctor does not know")
    print(f"{len(rules)} live rules compared with PARAMETERS ({len(_doctor.PARAMETERS)} rules)")
    return errors


def main(argv: List[str]) -> int:
    if len(argv) == 3 and argv[1] == "--run":
        errors = check(Path(argv[2]))
    elif len(argv) == 2:
        with tempfile.TemporaryDirectory(prefix="tt-defaults-") as tmp:
            subprocess.run([argv[1], tmp, MODE], check=True, stdout=subprocess.DEVNULL)
            errors = check(Path(tmp) / MODE)
    else:
        print(__doc__)
        return 2
    for e in errors:
        print("FAIL:", e)
    print(f"{len(errors)} difference(s)" if errors else "the C++ defaults are PARAMETERS'")
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
