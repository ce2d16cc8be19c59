"""The ETA of a run in progress: the model from history and the live estimate it stores."""
