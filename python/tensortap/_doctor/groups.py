"""The doctor's findings in the order a reader should meet them, and grouped
(docs/design.md#health-rules: a reader meets the cause before its
consequences, and one line a problem); docs/health.md explains the order.

Order. One problem shows up in many rules: a learning rate too high makes
the update ratio too large, then non-finite values, then dead units, zero
gradients and jumps in every tensor's variance. Listed by first step, the
consequences (found on many tensors, often at the same step) bury the cause.
So findings are ranked, first by the rule's tier, the rules that name a
cause before those that name its consequences:

    0  weight_update_ratio above `large`, poor_weight_initialization:
       an update or an initialization out of range, set by the program
    1  exploding_tensor: a non-finite value's first appearance
    2  dead_relu, saturated_activation: units that stopped passing a signal
    3  vanishing_gradient, all_zero; then (3.5) weight_update_ratio below `small`:
       what reaches the parameters (or does not) when units are dead or
       saturated; a too-small update is a vanishing gradient's effect
    4  unchanged_tensor: a parameter that stopped moving
    5  tensor_variance, loss_not_decreasing, stalled_training: symptoms
       any of the above causes

then by first step (the earliest episode), then by rank, then by position in
the model (`positions`), then by the rules' order in RULES, kind and name.

Groups. One rule and one kind on many tensors at once is one problem: a
group is a set of tensors of one rank, rule and kind (and, for
weight_update_ratio, one side: above `large` and below `small` are two
problems, in two tiers) linked by episodes that overlap in steps, directly
or through another tensor of the group; every episode of its tensors is its
member, its steps their union. A group of one finding prints that finding's
line; one tensor with several episodes, that line's form over their union
with "(<k> episodes)". Findings about the whole model (kind None) are groups
of one. Groups are ordered by their first member; members by the same key.
"""

from __future__ import annotations

import math
import re
from typing import TYPE_CHECKING, Callable, Dict, List, Sequence, Tuple

from .._base import KINDS, _safe

if TYPE_CHECKING:
    from .verdict import Finding
    from .rows import Rows

_TIERS = {"weight_update_ratio": 0, "poor_weight_initialization": 0, "exploding_tensor": 1, "dead_relu": 2,
          "saturated_activation": 2, "vanishing_gradient": 3, "all_zero": 3, "unchanged_tensor": 4,
          "tensor_variance": 5, "loss_not_decreasing": 5, "stalled_training": 5}
# Within a tier, at one step and place: the order of the rules' definitions.
_RULE_ORDER = ("weight_update_ratio", "poor_weight_initialization", "exploding_tensor", "dead_relu",
               "saturated_activation", "vanishing_gradient", "all_zero", "unchanged_tensor", "tensor_variance",
               "loss_not_decreasing", "stalled_training")

Position = Dict[Tuple[int, str, str], float]
"""(rank, kind, name) -> place in the model, 0 (input side) to 1 (the loss)."""


def num(x: float) -> str:
    """A number in three significant digits, exponents unpadded: 3e-9, 1.5e+4 as 1.5e4."""
    if not math.isfinite(x):
        return str(x)
    s = f"{x:.3g}"
    m = re.fullmatch(r"(-?[\d.]+)e([+-])0*(\d+)", s)
    return s if m is None else f"{m.group(1)}e{'-' if m.group(2) == '-' else ''}{m.group(3)}"


def pct(x: float) -> str:
    return f"{100 * x:.3g}%"


def rule_tier(rule: str) -> float:
    """The rule's tier (module docstring); weight_update_ratio's, above `large`."""
    return _TIERS.get(rule, 5)


def tier(f: Finding) -> float:
    if f.rule == "weight_update_ratio" and f.value < f.threshold:
        return 3.5  # too small an update: a gradient that vanished (tier 3's), not a rate set too high
    return _TIERS.get(f.rule, 5)


def positions(rows: Rows) -> Position:
    """Where each of the rank's tensors sits in the model, as a fraction of
    the depth: activations by their place in the forward (the order the
    writer got them at their first step), parameters (and buffers) by their
    place among the model's parameters; an activation's gradient and a
    parameter's gradient take their tensor's place, or, without it, the
    reverse of the backward's order; a `tensor` (the loss) comes last. The
    two scales are not one, so across kinds the place is a fraction of each."""
    out: Position = {}
    if not len(rows):
        return out
    first_step = rows.step[rows.starts]
    first_seq = rows.seq[rows.starts]
    present = rows.series[rows.starts].tolist()
    by_kind: Dict[str, List[Tuple[int, int, str]]] = {}
    for j, sid in enumerate(present):
        kind, name = rows.keys[sid]
        by_kind.setdefault(kind, []).append((int(first_step[j]), int(first_seq[j]), name))

    def scale(kind: str, reverse: bool = False) -> Dict[str, float]:
        items = sorted(by_kind.get(kind, []), reverse=reverse)
        n = max(len(items) - 1, 1)
        return {name: i / n for i, (_, _, name) in enumerate(items)}

    forward, params = scale("activation"), scale("param")
    for kind, own in (("activation", forward), ("param", params), ("buffer", scale("buffer"))):
        for name, x in own.items():
            out[(rows.rank, kind, name)] = x
    for kind, base in (("activation_grad", forward), ("grad", params)):
        # The backward runs from the loss back: its order reversed is the model's.
        backward = scale(kind, reverse=True)
        for name, x in backward.items():
            out[(rows.rank, kind, name)] = base.get(name, x)
    for _, _, name in by_kind.get("tensor", []):
        out[(rows.rank, "tensor", name)] = 1.0
    return out


def _key(f: Finding, where: Position) -> Tuple:
    place = where.get((f.rank, f.kind or "", f.name or ""), 0.0)
    return (tier(f), f.first_step, f.rank, place, _RULE_ORDER.index(f.rule) if f.rule in _RULE_ORDER else 99,
            KINDS.index(f.kind) if f.kind in KINDS else -1, f.name or "", f.last_step)


def arrange(findings: Sequence[Finding], where: Position) -> List[List[Finding]]:
    """The findings in groups, groups and members in order (module
    docstring); sets each finding's `group` to its group's place."""
    buckets: Dict[Tuple, List[Finding]] = {}
    groups: List[List[Finding]] = []
    for f in findings:
        if f.kind is None or f.name is None:
            groups.append([f])
        else:
            buckets.setdefault((f.rank, f.rule, f.kind, tier(f)), []).append(f)
    for members in buckets.values():
        groups += _tensors_together(members)
    for g in groups:
        g.sort(key=lambda f: _key(f, where))
    groups.sort(key=lambda g: _key(g[0], where))
    for i, g in enumerate(groups):
        for f in g:
            f.group = i
    return groups


def _tensors_together(members: List[Finding]) -> List[List[Finding]]:
    """The findings of one rule and kind in groups of tensors: two tensors
    are in one group when an episode of one overlaps an episode of the
    other, directly or through a third; a tensor's every episode is in its
    group (a layer that dies twice is one problem, not two)."""
    parent: Dict[str, str] = {}

    def root(n: str) -> str:
        while parent.setdefault(n, n) != n:
            parent[n] = parent[parent[n]]
            n = parent[n]
        return n

    # A sweep over the episodes by first step: each one that starts before
    # the running end of the current cluster joins its tensor to it.
    ordered = sorted(members, key=lambda f: (f.first_step, f.last_step))
    end, head = None, ""
    for f in ordered:
        name = f.name or ""
        if end is not None and f.first_step <= end:
            parent[root(name)] = root(head)
            end = max(end, f.last_step)
        else:
            end, head = f.last_step, name
            root(name)
    out: Dict[str, List[Finding]] = {}
    for f in ordered:
        out.setdefault(root(f.name or ""), []).append(f)
    return list(out.values())


def _span(values: Sequence[float], fmt: Callable[[float], str]) -> str:
    lo, hi = fmt(min(values)), fmt(max(values))
    return lo if lo == hi else f"{lo}..{hi}"


def _what(members: List[Finding]) -> str:
    """A group's `<what>`: the rule's words with the range of its members'
    values and the threshold."""
    f = members[0]
    rule, thr = f.rule, f.threshold
    values = [m.value for m in members]
    if rule == "vanishing_gradient":
        return f"RMS {_span(values, num)} below {num(thr)}"
    if rule == "all_zero":
        return "all values zero"
    if rule == "unchanged_tensor":
        return f"statistics unchanged while its gradient is not zero (norm up to {_span(values, num)})"
    if rule == "dead_relu":
        inferred = sum("(ReLU inferred" in m.message for m in members)
        note = f" (ReLU inferred for {inferred} of {len(members)})" if inferred else ""
        return f"{_span(values, pct)} of values zero, above {pct(thr)}{note}"
    if rule == "saturated_activation":
        how = "at least " if any(m.message.startswith("at least ") for m in members) else ""
        tail = f.message.split(" of values saturated", 1)[-1]
        return f"{how}{_span(values, pct)} of values saturated{tail}"
    if rule == "tensor_variance":
        # Above `factor` and below 1/`factor` are one rule's two sides.
        sides = sorted({m.threshold for m in members})
        bound = f"above {num(thr)}x" if sides == [thr] and thr > 1 else f"below {num(thr)}x" if sides == [thr] \
            else f"outside {num(sides[0])}x..{num(sides[-1])}x"
        return f"std {_span(values, num)}x the median of its last evaluations ({bound})"
    if rule == "weight_update_ratio":
        return f"update ratio {_span(values, num)} a step, {'above' if f.value > thr else 'below'} {num(thr)}"
    if rule == "exploding_tensor" and thr == 0:
        return f"{_span(values, lambda x: str(int(x)))} values non-finite"
    return f"value {_span(values, num)}, threshold {num(thr)}"


def group_line(members: List[Finding], ranks: bool) -> str:
    """`<rule>: <n> <kind>s (<first name> ... <last name>)[ rank <r>] steps
    <first>..<last>: <what>`; a group of one, the finding's own line."""
    if len(members) == 1:
        return members[0].line(ranks)
    f = members[0]
    names: Dict[str, None] = {}
    for m in members:
        names.setdefault(m.name or "-", None)
    ordered = list(names)
    n = len(ordered)
    where = f" rank {f.rank}" if ranks else ""
    first = min(m.first_step for m in members)
    last = max(m.last_step for m in members)
    if n == 1:
        # One tensor, several episodes: its own line's form, over their union.
        return (f"{f.rule}: {f.kind} {_safe(ordered[0])}{where} steps {first}..{last}: {_what(members)} "
                f"({len(members)} episodes)")
    return f"{f.rule}: {n} {f.kind}s ({_safe(ordered[0])} ... {_safe(ordered[-1])}){where} steps {first}..{last}: " \
        f"{_what(members)}"


def by_place(members: List[Finding], where: Position) -> List[Finding]:
    """A group's members from the input side to the loss: the order its
    line names them in."""
    return sorted(members, key=lambda f: (where.get((f.rank, f.kind or "", f.name or ""), 0.0), f.name or "",
                                          f.first_step))


def lines(groups: List[List[Finding]], where: Position, ranks: bool, every: bool) -> List[str]:
    """The findings' lines: the likely cause and one line per group, or
    (`every`) one line per finding. The count and the rules not evaluated
    are the caller's."""
    if every:
        return [f.line(ranks) for g in groups for f in g]
    if not groups:
        return []
    return [f"likely cause: {groups[0][0].line(ranks)}"] + \
        [group_line(by_place(g, where), ranks) for g in groups]

