"""`tensortap diff` and tensortap.diff: two runs aligned record by record
(align), their values compared (values, dtype, dropout), judged against floor
runs (floor), said as text (text) or JSON lines (jsonout); compare holds the
comparison and its rules. Private: tensortap.diff is the way in."""
