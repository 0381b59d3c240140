"""The HTML pages, which only `python -m tensortap` imports: the frame they
share (frame: the skeleton, figures as data URLs, escaping), a run's page
(report, with its findings, dumps and ctl sections) and two runs' (diff)."""
