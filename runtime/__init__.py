"""Plans run on real tensors: NVRTC compilation and the kernel cache, compiled programs and the
native launcher, stream-lowered host programs, and the torch reference interpreter (the oracle,
and the CPU path)."""
