"""What a night costs: the rates of a cluster (stdlib only) and their allocation to stages."""
