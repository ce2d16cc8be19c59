"""Fault-injection suite: the integration never changes a flow's result, loses a summary,
hangs or leaks a credential, whatever goes wrong around it."""
