"""Moved: Run.index_frame(), stats_frame(), to_xarray() and series(..., lazy=True) lives in tensortap._views.frames, private. This stub keeps
`import tensortap.frames` working for one release, with a DeprecationWarning."""

import sys

from ._compat import moved_module

sys.modules[__name__] = moved_module(__name__, "tensortap._views.frames")
