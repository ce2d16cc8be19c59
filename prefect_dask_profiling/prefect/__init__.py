"""The Prefect integration: the only part of the package that imports Prefect."""
