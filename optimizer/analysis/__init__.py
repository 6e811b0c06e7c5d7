"""Analyses of a bound fusion: shapes and compact (allocation) shapes, axis maps, op classes,
host scalars, stream axes and the cost model."""
