"""The bottleneck classifier: signals with their sources, and the rules that read them.

One classifier, two callers: ``dask-profiling bench`` and every stage of a profiled run.
"""
