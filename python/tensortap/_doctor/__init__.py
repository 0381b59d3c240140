"""`tensortap doctor` and tensortap.doctor: the health rules (rules), the
statistics rows they read (rows), the layer groups (groups) and the tap
points (taps). Private: tensortap.doctor is the way in."""
