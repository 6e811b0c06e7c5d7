"""Segmenters: greedy (the nvFuser-style baseline), CP-SAT (the optimiser) and min-cut
refinement, all over one segment graph and returning the same groups."""
