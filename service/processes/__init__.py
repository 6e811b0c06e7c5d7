"""Processes the service owns: planner processes for CPU work on untrusted input, and GPU
worker processes that own the CUDA context and run executions; both started by ``children``."""
