"""Tensors on the wire, one format for the client and the service: ``tensors`` (torch tensors
in and out), over ``safetensors`` (binary) and ``json_tensors`` (KServe-v2 JSON, numpy only: the
service decodes it without importing torch)."""
