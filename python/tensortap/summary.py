"""Moved: `tensortap inspect`'s summary lives in tensortap._views.summary, private. This stub keeps
`import tensortap.summary` working for one release, with a DeprecationWarning."""

import sys

from ._compat import moved_module

sys.modules[__name__] = moved_module(__name__, "tensortap._views.summary")
