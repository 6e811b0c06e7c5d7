"""The Plan: segments, boundary tensors, bytes, sub-fusions, index maps and the host program;
built from a segmentation, restored from JSON, rendered as tables and pictures."""
