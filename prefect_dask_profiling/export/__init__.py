"""Views of the store for other tools: a fleet-wide Parquet dataset and Prometheus metrics.

Layer: after ``store`` and ``regression``, before ``prefect``; nothing here imports Prefect.
"""
