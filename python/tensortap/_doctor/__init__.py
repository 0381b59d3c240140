"""Training health rules (docs/design.md#health-rules): `tensortap doctor RUN` and
`tensortap.doctor(run)` name what is wrong with a run, rule by rule, the
tensor and the steps: SageMaker Debugger's (smdebug's) built-in rules for
deep learning, on tensortap's statistics. This docstring is the rules'
definition; the live rules of C++ (`Trigger::vanishing_gradient()`, ...)
evaluate the same, and docs/health.md tabulates them.

Input. Each rank is judged on its own, from its statistics rows: stats.npy
where the rank has one, otherwise rows computed from its full records with
the recorder's definitions (tensortap/_doctor/rows.py; said once on stderr).
A row is one tensor (kind, name) at one step: min, max, mean, std
(population), norm (L2) over the finite values, counts nan, posinf, neginf,
zeros, numel. A tensor's evaluations are its rows in step order. A row that
holds a NaN or an infinity, or no element, is no evaluation of any rule but
exploding_tensor (it is exploding_tensor's). RMS = norm / sqrt(numel).

Selection. A rule looks at the tensors of its `kinds` whose name its
`include` finds: a pattern in the recorder's ECMAScript syntax (the live
rules' matcher, _pattern.Pattern, in linear time) searched anywhere in the name,
ASCII letters matched without regard to case (re.search with re.IGNORECASE
| re.ASCII; in C++, an ECMAScript search with icase). A name it does not
find is never judged. "" finds every name. Repeats (`name#1`) are names of their
own.

Episodes. Where a rule's condition holds at `patience` consecutive
evaluations of a tensor, an episode opens at the first of them. It goes on
through the evaluations where the condition holds, over a gap of at most one
evaluation where it does not, and closes at the second evaluation in a row
where it does not (or at the tensor's last). One finding per (rule, rank,
kind, name, episode): first_step is the step of its first evaluation (of the
earlier step, for rules whose evaluation compares two steps), last_step that
of its last evaluation where the condition held; value is the most extreme
measure over those evaluations (the smallest for a rule of "below", the
largest for one of "above"), threshold the bound it was compared with. Live,
a rule fires where its episode opens: at the patience-th evaluation.

The rules, with their defaults (each `--set <rule>.<parameter>=<value>`, and
a chained setter of the same name on the C++ Trigger):

vanishing_gradient (kinds=grad, include="weight", threshold=1e-7, patience=3):
    condition RMS < threshold. value: the smallest RMS. smdebug's measure is
    the mean |g|; RMS >= mean |g|, so whatever this finds smdebug would.
    include "weight" (smdebug's "weights" collection) leaves out biases: a
    bias before a normalization gets no gradient by design (the
    normalization subtracts it), only rounding noise.

exploding_tensor (kinds=all six, include="", bound=0):
    a row explodes when nan + posinf + neginf > 0, or, with bound > 0, when
    max(|min|, |max|) > bound. A blow-up is a maximal run of the rank's
    evaluated steps (the steps with a selected row) at each of which some
    selected row explodes, a gap of one such step bridged. One finding per
    blow-up, naming its first exploding row: the first of the first step's
    in the order the writer got them (the order training made them: a
    step's parameters, its forward, the loss, its backward). value: that
    tensor's largest count of non-finite elements in the blow-up (threshold
    0), or, for a blow-up of it without any, its largest max(|min|, |max|)
    (threshold bound). The message counts the other tensors that exploded in
    the blow-up. It differs from Trigger::non_finite() in what it reports: a
    finding naming the first tensor, not a dump.

all_zero (kinds=activation+activation_grad+param+grad, include="", patience=2):
    condition zeros == numel. A param's first row is no evaluation:
    BatchNorm biases, zero-initialized gates and LoRA's B start at 0.
    value: zeros / numel (1), threshold 1.

unchanged_tensor (kind param, include="weight", num_steps=3):
    an evaluation compares a param's row with its previous one: the
    condition holds when all ten statistics are equal and the last grad row
    of that name at a step in [previous step, this step) has norm > 0
    (a gradient reached it; a frozen parameter has no grad rows and is never
    judged). patience = num_steps - 1, so the statistics are identical at
    num_steps evaluations; first_step is the first of them. value: the
    largest such gradient norm (threshold 0). smdebug's compares the values
    with allclose; identical statistics are the test a row allows. include
    "weight": a bias before a normalization gets a gradient of rounding noise,
    whose updates are lost in rounding.

loss_not_decreasing (kind tensor, name="loss", window=20, min_decrease=0.001, min_progress=0.05):
    the values are the mean of the rows of the tensor named exactly `name`
    (a 0-d loss's value), taken in whole windows of `window` values, as
    smdebug checks every num_steps: when the k-th window is complete (k >= 2,
    so from the 2 window-th value on), A = its mean, B = the (k-1)-th
    window's, F = the first window's, R = the smallest window mean so far.
    Condition: B - A <= min_decrease * |B| (it did not fall by more than
    0.1%) and R > F - min_progress * |F| (it never fell 5% below where it
    started: a run that learned and plateaus is not flagged). patience 1;
    the evaluation's step is the window's last. value: the smallest relative
    decrease (B - A) / |B| (0 when B is 0), threshold min_decrease. Without a
    tensor of that name, or with fewer than 2 window values, it is not
    evaluated.

dead_relu (kind activation, include="relu", threshold=0.95, patience=3):
    f = zeros / numel, the fraction of the ReLU's outputs that are 0 in the
    batch; condition f > threshold; value the largest f. A tap named
    `<name>_input` (a ReLU's input, ending so, or `_input#k`) is never
    judged. From the
    statistics alone, live too. smdebug's counts units whose output is 0 for
    (almost) the whole batch and fires when over half the layer's units
    are: a layer with a fraction u of such units has f >= u, so a layer all
    but dead is found by both; f counts a unit alive in part of the batch
    as partly dead, hence the high threshold.

saturated_activation (kind activation, include="tanh|sigmoid", derivative=0.1, threshold=0.5, patience=3):
    an element is saturated where the function's derivative is below
    `derivative` times its peak: with t = sqrt(1 - derivative), an output y
    of tanh where |y| > t, of sigmoid where |2y - 1| > t; an input x (a tap
    named `<name>_input`) of tanh where |x| > atanh(t), of sigmoid where
    |x| > 2 atanh(t) (1.82 and 3.64 by default). A name holding "sigmoid"
    is a sigmoid's, any other a tanh's. f = the fraction saturated;
    condition f > threshold; value the largest f. From full records (a run
    without statistics): f exactly, from the values. From a statistics row:
    a lower bound of f, with v the judged value (y, 2y - 1 or x), E = the
    mean of v^2, M = the largest |v| and a the bound:
    f >= (E - a^2) / (M^2 - a^2) (0 where M <= a), since an element within
    the bound adds at most a^2 to E and one beyond it at most M^2; for
    sigmoid's outputs E = 4 norm^2/numel - 4 mean + 1, M = max(|2 min - 1|,
    |2 max - 1|). So a finding from statistics is one from the values too.
    smdebug's bounds (|x| > 9.4 for tanh, -23/+17 for sigmoid) are where
    float32 saturates exactly; ours are where training has all but stopped.

tensor_variance (kinds=activation+activation_grad+param+grad, include="", factor=100, window=50):
    the std of a row against the median std of the tensor's previous
    min(window, evaluations so far) evaluations (the median of an even
    count: the mean of the middle two), once it has min(window, 3) earlier
    ones (as Trigger::spike) and where that median is > 0:
    condition std > factor * median or std < median / factor. patience 1.
    value: the ratio std / median farthest from 1, threshold factor (or
    1 / factor when the std fell). smdebug's has no default bounds.

poor_weight_initialization (kind activation, include="(relu|tanh|sigmoid).*_input", threshold=10):
    at the rank's first step with a selected row, over the selected
    activations there (the inputs of the nonlinearities, tapped as
    `<name>_input`) whose std is > 0: condition max std / min std >
    threshold; at least two are needed. value: that ratio. One finding for
    the model: kind and name "-" (None in the frame), steps that step.
    smdebug's compares variances (its 10 is a std ratio of 3.2) over the
    first steps; a model of default initializations keeps within 10.

weight_update_ratio (kind param, include="weight", large=0.1, small=1e-8, patience=1):
    from full param records at consecutive recorded steps s < s' (not from
    statistics: it needs the values of both): r = ||w_s' - w_s|| / ||w_s||
    / (s' - s), evaluated where ||w_s|| > 0. Two conditions, each with its
    own episodes: r > large; and r < small while the last grad row of that
    name at a step in [s, s') has norm > 0 (a frozen parameter is never too
    slow). value: the largest r (the smallest), threshold large (small).
    include "weight" leaves out biases, as smdebug's "weights" collection
    does. smdebug's large threshold is 10: an update 100x too large
    (r about 0.1 where 1e-3 is usual) would pass it.

stalled_training (no parameters):
    a finding per dumps.jsonl line with reason "stall" (Options::stall_after):
    kind and name "-", steps last_step..last_step, value stalled_seconds,
    threshold stall_after in seconds (NaN when run.json does not say). Not
    evaluated when no rank recorded with stall_after and there is no such
    dump.

overfit (a validation series) is not among them yet.

Which activations dead_relu, saturated_activation and
poor_weight_initialization judge: besides `include`, the taps run.json's
"taps" declares as their function, and for dead_relu a ReLU inferred from
the statistics (tensortap/_doctor/taps.py).

Output. Findings causes first, in groups (tensortap/_doctor/groups.py: the
rule's tier, first_step, rank, place in the model); a group is one rule and
kind on tensors whose episodes overlap. A rule not evaluated (no tensor it
could judge, on any rank) is named with why, and is no finding. doctor()
returns a pandas DataFrame with the columns COLUMNS (`group`: the group's
place) and attrs["not_evaluated"] = {rule: why}; `tensortap doctor` prints
`likely cause: <a finding's line>`, one line per group (a group of one: its
finding's `<rule>: <kind> <name>[ rank <r>] steps <first>..<last>:
<message>`), then `<rule>: not evaluated: <why>` lines, then `N findings`
(groups); --all a line per finding instead of the likely cause and the
groups; --json one object per finding instead, without the count.

Cost: one pass over each rank's statistics rows, vectorized, and over the
full param records for weight_update_ratio (one record and its predecessor
in memory); a run without statistics is read once, record by record.
"""

# The rules' parts: settings.py (each rule's parameters), verdict.py (a
# finding, episodes), rules.py (the rules), command.py (evaluate, doctor(),
# `tensortap doctor`); rows.py, groups.py and taps.py beside them.
