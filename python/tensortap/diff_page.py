"""Moved: the diff's page (`tensortap diff --html`) lives in tensortap._pages.diff, private. This stub keeps
`import tensortap.diff_page` working for one release, with a DeprecationWarning."""

import sys

from ._compat import moved_module

sys.modules[__name__] = moved_module(__name__, "tensortap._pages.diff")
