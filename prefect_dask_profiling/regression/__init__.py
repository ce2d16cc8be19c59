"""Judging a run against its history: the rule, the baseline, the verdicts and the trend."""
