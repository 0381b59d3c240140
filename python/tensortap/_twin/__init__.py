"""The Python twin's parts behind tensortap.torch (the public module, whose
docstring says what the twin records): `settings` watch()'s arguments
checked, `recorder` the hooks and the Recorder, `perturb` the rounding-noise
reference."""
