"""A stage's Dask performance report: its data read on the scheduler, its page, its windows."""
