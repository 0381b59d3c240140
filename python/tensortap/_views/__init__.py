"""Views of a run: pandas, xarray and dask (frames, behind Run.index_frame(),
stats_frame(), to_xarray() and series(..., lazy=True)) and `tensortap
inspect`'s summary (summary)."""
