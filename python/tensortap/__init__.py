"""Read tensortap runs with NumPy (and h5py for HDF5 runs).

    import tensortap
    run = tensortap.open("runs/exp1")
    run.kinds()                                   # ['activation', 'grad', ...]
    run.names("grad")                             # ['fc1.bias', 'fc1.weight', ...]
    run.steps("fc1.weight", kind="grad")          # [0, 10, 20, ...]
    g = run.load("fc1.weight", 10, kind="grad")   # np.ndarray, memory-mapped (.npy)
    w = run.series("fc1.weight", kind="grad")     # [n_steps, 128, 32]
    run.records                                   # the index, one dict per record
    st = run.stats("fc1.weight", kind="grad")     # {"step": [...], "min": [...], "nan": [...], ...}
    run.dumps                                     # the flight recorder's dumps (dumps.jsonl, run.json)
    run.index_frame(), run.stats_frame()          # pandas DataFrames (python3-pandas)
    run.series("hidden", kind="activation", lazy=True)  # a dask array, read when computed (python3-dask)
    run.to_xarray("grad", lazy=True)              # an xarray Dataset (python3-xarray)
    tensortap.diff("runs/cpp", "runs/py")         # two runs record by record (pandas DataFrame)
    tensortap.doctor("runs/exp1")                 # what is wrong with the run: the health rules (DataFrame)

tensortap.torch records a PyTorch (Python) loop into the same layout (the
Python twin), for comparisons with a C++ port.

A run written by several ranks (rank<r>/ directories) opens as one: pass
rank=r to look at one rank; series() without a rank stacks them all on a
leading rank axis.

A damaged index line (torn by a full disk, garbage, not a record) is skipped
with a RunWarning naming the file and line; an index line whose file lies
outside its run directory is refused with a RunError when it is read.

A Run opened on a run still going under a disk budget that gives its oldest
steps up (Budget::KeepLatest) is a snapshot: a record it lists whose step
the recorder gives up afterwards raises GivenUpError (a RunError) when it is
read, naming the step and run.json's marker; open the run again.

`kind` is a keyword argument of steps(), load(), series() and stats(); a
call that passes it by position still works, with a DeprecationWarning.
"""

# tensortap._engine, the C++ recorder for Python, is built into a build
# tree's python/tensortap/: found there when that folder is on sys.path.
__path__ = __import__("pkgutil").extend_path(__path__, __name__)

# NUMPY_DTYPES is public too, though not in __all__.
from ._base import KINDS, NUMPY_DTYPES, STATS_FIELDS, GivenUpError, RunError, RunWarning  # noqa: F401
from ._run import Run, open
from ._diff.compare import diff
from ._doctor.command import doctor
from ._version import __version__  # noqa: F401 - public

__all__ = ["open", "Run", "diff", "doctor", "KINDS", "STATS_FIELDS", "RunError", "GivenUpError", "RunWarning"]

# The public names say they are tensortap's (in tracebacks, repr, help and
# pickles), wherever they are defined.
for _public in (open, Run, diff, doctor, RunError, GivenUpError, RunWarning):
    _public.__module__ = __name__
del _public
