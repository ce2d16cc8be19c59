"""The Prefect-free flow engine: the stage book, the background service, the end of a run."""
