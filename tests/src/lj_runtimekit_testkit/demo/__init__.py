"""``make demo``: the whole suite end to end on the local control plane."""
