"""AB training and its peers as one object any loop uses (Algorithm 1), with its parts."""
