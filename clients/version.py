"""fusecut's version: a leaf every layer may import (the optimizer's plan JSON, the service's
cache key, the CLI, repro headers) without an arrow back up to the SDK."""

__version__ = "0.1.0"
