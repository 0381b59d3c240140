"""tensortap's version, the one place it is written: the Python package
(pyproject.toml reads it), the C++ library (CMakeLists.txt reads it) and so
run.json's "tensortap_version" all take it from here."""

__version__ = "0.2.0"
