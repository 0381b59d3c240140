"""Moved: the run's page (`tensortap report`) lives in tensortap._pages.report, private. This stub keeps
`import tensortap.report` working for one release, with a DeprecationWarning."""

import sys

from ._compat import moved_module

sys.modules[__name__] = moved_module(__name__, "tensortap._pages.report")
