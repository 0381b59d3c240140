"""A run in pandas: which layer's gradient norm grew fastest, and the first
step at which any activation's max passed a threshold.

    python3 examples/analyse_with_pandas.py runs/spike [THRESHOLD]

Needs a run with statistics (Options::stats_every) and Debian's python3-pandas.
"""
import sys

import tensortap

run = tensortap.open(sys.argv[1])
threshold = float(sys.argv[2]) if len(sys.argv) > 2 else 10.0

stats = run.stats_frame()
stats = stats[stats["rank"] == stats["rank"].min()]  # one rank of a multi-rank run
norms = stats[stats["kind"] == "grad"].pivot(index="step", columns="name", values="norm")
growth = norms.iloc[-1] / norms.iloc[0]
print(f"fastest-growing gradient norm: {growth.idxmax()} "
      f"(x{growth.max():.3g} from step {norms.index[0]} to step {norms.index[-1]})")
over = stats[(stats["kind"] == "activation") & (stats["max"] > threshold)].sort_values(["step", "name"])
if over.empty:
    print(f"no activation's max passed {threshold:g}")
else:
    print(f"first activation max above {threshold:g}: step {over['step'].iloc[0]} ({over['name'].iloc[0]})")
