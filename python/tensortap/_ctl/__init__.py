"""`tensortap ctl`: commands to a running recorder (client) and their
answers' log (log)."""
