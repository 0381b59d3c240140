"""What the NumPy-only core borrows from other packages, imported only when a
function that needs one is called: pandas, xarray, dask, matplotlib, tqdm."""

import importlib
import sys


def need(module, package, what):
    """Imports `module` for `what`, or raises an ImportError that names the
    Debian package that provides it."""
    try:
        return importlib.import_module(module)
    except ImportError as e:
        raise ImportError(f"{what} needs {module.split('.')[0]}, which this Python ({sys.executable}) cannot "
                          f"import ({e}): install Debian's {package} (apt install {package})") from None


class _Counter:
    """The fallback progress bar: a counter on one terminal line."""

    def __init__(self, iterable, total, desc):
        self.iterable, self.total, self.desc = iterable, total, desc

    def __iter__(self):
        every = max(1, (self.total or 0) // 200)
        i = 0
        for i, item in enumerate(self.iterable, 1):
            if i % every == 0:
                sys.stderr.write(f"\r{self.desc}: {i}/{self.total if self.total is not None else '?'}")
                sys.stderr.flush()
            yield item
        sys.stderr.write("\r" + " " * (len(self.desc) + 24) + "\r")
        sys.stderr.flush()


def progress(iterable, total=None, desc="", minimum=100):
    """`iterable`, with a progress bar on stderr when stderr is a terminal and
    there are at least `minimum` items: tqdm's (python3-tqdm) if it is there."""
    if total is None and hasattr(iterable, "__len__"):
        total = len(iterable)
    if (total is not None and total < minimum) or not sys.stderr.isatty():
        return iterable
    try:
        from tqdm import tqdm
    except ImportError:
        return _Counter(iterable, total, desc)
    return tqdm(iterable, total=total, desc=desc, file=sys.stderr, leave=False, unit="rec")
