"""nvFuser's fusion caches, backed by fusecut's own: definitions, their plans and their programs.

- ``FusionCache`` (nvFuser's legacy frontend): one per process. Every completed definition is
  looked up by its *structure* (ops, attributes, input declarations and constants; not the names
  it happens to use); a new structure gets the next id, and ``num_fusions()`` counts them. The
  entry holds the definition's handle on the process's engine (``fusecut.engine``: plans per
  input metadata, compiled programs per argument signature), so a definition written twice (a
  repro printed and run again, a helper that rebuilds the same fusion) plans and compiles once.
  ``reset()`` forgets everything (the engine's plans and programs too), ids restart at 0.
  ``serialize``/``deserialize`` write and read the definitions (wire JSON): after a round trip
  the same definitions have the same ids; plans and kernels are rebuilt on first use (fusecut's
  kernel cache on disk keeps the compiled code).
- ``LRUCache`` (nvfuser_direct): ``cache_compile(fusion)`` returns the cached executor of that
  fusion's structure (a ``CompiledFusion``), holding at most ``max_fusions`` (least recently used
  evicted). ``LruFusionCache`` is the decorator form over a function that builds definitions.
"""

from __future__ import annotations

import atexit
import hashlib
import json
import threading
import warnings
from collections import OrderedDict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fusecut import environment
from fusecut.engine import FusionHandle, default_engine
from fusecut.optimizer.errors import DefinitionError
from fusecut.optimizer.ir.fusion import Fusion
from fusecut.optimizer.ir.wire import canonical_json, fusion_from_json, fusion_to_json

DEFAULT_MAX_FUSIONS = 16384


def structural_key(fusion: Fusion) -> str:
    """SHA-256 of the fusion's structure: the wire JSON with every value renamed to the position
    of its first appearance, and constants replaced by their dtype and value. Two definitions
    built by different code (or printed and parsed back) that compute the same thing the same way
    share a key."""
    data = fusion_to_json(fusion)
    constants = {s["id"]: ["const", s["dtype"], s["value"]] for s in data["scalars"]
                 if s["value"] is not None}
    index: dict[str, int] = {}

    def name(n: str) -> Any:
        if n in constants:
            return constants[n]
        return index.setdefault(n, len(index))

    def attr(v: Any) -> Any:
        if isinstance(v, dict) and set(v) == {"scalar"}:
            return {"scalar": name(v["scalar"])}
        if isinstance(v, list):
            return [attr(x) for x in v]
        return v

    declared = {t["id"]: t for t in data["tensors"]} | {s["id"]: s for s in data["scalars"]}
    inputs = [{**declared[n], "id": name(n)} for n in data["inputs"]]
    ops = [[op["name"], [name(n) for n in op["inputs"]],
            {k: attr(v) for k, v in sorted(op["attrs"].items())},
            [name(n) for n in op["outputs"]]] for op in data["ops"]]
    key = {"inputs": inputs, "ops": ops, "outputs": [name(n) for n in data["outputs"]],
           "aliases": sorted([name(k), name(v)] for k, v in data["aliases"].items()),
           "stream": [[name(a["tensor"]), a["axis"]] for a in data["stream_parallel"]]}
    return hashlib.sha256(canonical_json(key).encode()).hexdigest()


@dataclass
class CacheEntry:
    """One cached definition: its id, the fusion, and its handle on the process's engine (its
    plans and programs; made on first use)."""

    id: int
    fusion: Fusion
    _handle: Any = field(default=None, repr=False)

    @property
    def handle(self) -> FusionHandle:
        if self._handle is None:
            self._handle = default_engine().fusion(self.fusion)
        return self._handle


class FusionCache:
    """nvFuser's ``FusionCache``: the process's cache of definitions (see the module doc)."""

    _singleton: FusionCache | None = None
    _lock = threading.Lock()

    def __init__(self, max_fusions: int = DEFAULT_MAX_FUSIONS):
        if max_fusions < 1:
            raise DefinitionError(f"FusionCache max_fusions must be at least 1, got "
                                  f"{max_fusions}")
        self.max_fusions = max_fusions
        self._entries: OrderedDict[str, CacheEntry] = OrderedDict()
        self._by_id: dict[int, CacheEntry] = {}
        self._next_id = 0
        self.lookups = 0
        self.hits = 0

    # ---- nvFuser's API ------------------------------------------------------------------------

    @classmethod
    def get(cls, max_fusions: int = DEFAULT_MAX_FUSIONS, selected_device: int | None = None,
            load_from_default_workspace: bool = True) -> FusionCache:
        """The process's cache (made on first use; ``max_fusions`` applies then). With
        ``load_from_default_workspace``, a workspace saved at exit by
        ``enable_automatic_serialization`` is loaded into a new cache."""
        with cls._lock:
            if cls._singleton is None:
                cls._singleton = FusionCache(max_fusions)
                path = default_workspace()
                if load_from_default_workspace and path.is_file():
                    try:
                        cls._singleton.deserialize(str(path))
                    except (OSError, ValueError, DefinitionError) as e:
                        # a stale, foreign or damaged workspace: start empty, as nvFuser does,
                        # and say so once (never fail every FusionDefinition until it is gone)
                        warnings.warn(f"fusecut: the fusion cache workspace {path} was not "
                                      f"loaded ({e}); starting with an empty cache",
                                      RuntimeWarning, stacklevel=2)
            return cls._singleton

    @classmethod
    def reset(cls) -> None:
        """Forget every cached definition, plan and program; ids start again at 0."""
        with cls._lock:
            cls._singleton = None
        default_engine().clear()

    def num_fusions(self) -> int:
        return len(self._entries)

    def serialize(self, filename: str) -> None:
        """Write the cached definitions (wire JSON, in id order) to ``filename``."""
        data = {"format": "fusecut-fusion-cache", "version": 1,
                "fusions": [fusion_to_json(e.fusion) for e in sorted(
                    self._entries.values(), key=lambda e: e.id)]}
        Path(filename).write_text(json.dumps(data))

    def deserialize(self, filename: str) -> None:
        """Add the definitions ``serialize`` wrote; each gets an id as if defined again."""
        data = json.loads(Path(filename).read_text())
        if not isinstance(data, dict) or data.get("format") != "fusecut-fusion-cache":
            raise ValueError(f"{filename} is not a fusecut fusion cache")
        items = data.get("fusions")
        if not isinstance(items, list):
            raise ValueError(f"{filename}: 'fusions' must be a list of definitions, got "
                             f"{type(items).__name__}")
        try:  # every definition read before any is added: a damaged file adds none
            fusions = [fusion_from_json(item) for item in items]
        except (KeyError, TypeError, AttributeError) as e:
            raise ValueError(f"{filename}: a definition in 'fusions' is malformed ({e!r})") \
                from None
        for fusion in fusions:
            self.register(fusion)

    def stats(self) -> str:
        rate = 100 * self.hits // self.lookups if self.lookups else 0
        return (f"Max Fusions Allowed: {self.max_fusions}\n"
                f"Total Fusions in Cache: {len(self._entries)}\n"
                f"Cache Lookups: {self.lookups}\nCache Hits: {self.hits}\nHit Rate: {rate}%\n")

    def __repr__(self) -> str:
        lines = [f"fusecut FusionCache: {len(self._entries)} fusion(s)"]
        for e in sorted(self._entries.values(), key=lambda e: e.id):
            lines.append(f"  id {e.id}: {len(e.fusion.ops)} ops, {len(e.fusion.inputs)} inputs, "
                         f"{len(e.fusion.outputs)} outputs")
        return "\n".join(lines)

    # ---- fusecut's side -----------------------------------------------------------------------

    def register(self, fusion: Fusion) -> CacheEntry:
        """The entry of this fusion's structure, made (with the next id) if new."""
        key = structural_key(fusion)
        with self._lock:
            self.lookups += 1
            entry = self._entries.get(key)
            if entry is not None:
                self.hits += 1
                self._entries.move_to_end(key)
                return entry
            if len(self._entries) >= self.max_fusions:
                _, old = self._entries.popitem(last=False)
                self._by_id.pop(old.id, None)
            entry = CacheEntry(self._next_id, fusion)
            self._next_id += 1
            self._entries[key] = entry
            self._by_id[entry.id] = entry
            return entry

    def entry(self, fusion_id: int) -> CacheEntry | None:
        return self._by_id.get(fusion_id)


def default_workspace() -> Path:
    """Where ``enable_automatic_serialization`` saves the cache at exit
    ($FUSECUT_FUSION_CACHE, else the per-user cache directory)."""
    return environment.path("FUSECUT_FUSION_CACHE")


def _save_default_workspace() -> None:
    cache = FusionCache._singleton
    if cache is None:
        return
    path = default_workspace()
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        cache.serialize(str(path))
    except OSError:
        pass  # at exit there is no one to tell; the next process starts with an empty cache


def enable_automatic_serialization() -> None:
    """Save the FusionCache's definitions at exit; the next process's ``FusionCache.get()``
    loads them (nvFuser's default workspace)."""
    atexit.register(_save_default_workspace)


def disable_automatic_serialization() -> None:
    atexit.unregister(_save_default_workspace)


class CompiledFusion:
    """nvFuser's FusionExecutorCache, as ``LRUCache.cache_compile`` returns it: the cached
    definition's plans and programs."""

    def __init__(self, entry: CacheEntry):
        self._entry = entry

    def fusion(self) -> Fusion:
        return self._entry.fusion

    def execute(self, inputs: list[Any], **options: Any) -> list[Any]:
        return self._entry.handle.execute(list(inputs), **options)

    def is_compiled(self, inputs: list[Any]) -> bool:
        """Whether a plan for arguments like ``inputs`` exists (and, on a GPU, its program)."""
        return self._entry.handle.cached_plan(list(inputs)) is not None


class LRUCache:
    """nvfuser_direct's ``LRUCache``: compiled fusions by structure, least recently used first
    out once ``max_fusions`` are held."""

    def __init__(self, max_fusions: int = DEFAULT_MAX_FUSIONS):
        self._cache = FusionCache(max_fusions)
        self._compiled = 0

    def cache_compile(self, fusion: Fusion) -> CompiledFusion:
        if not isinstance(fusion, Fusion):
            raise DefinitionError(f"cache_compile expects a FusionDefinition's fusion, got "
                                  f"{type(fusion).__name__}")
        before = self._cache.num_fusions()
        entry = self._cache.register(fusion)
        if self._cache.num_fusions() > before:
            self._compiled += 1
        return CompiledFusion(entry)

    def num_fusions(self) -> int:
        return self._cache.num_fusions()

    def stats(self) -> str:
        c = self._cache
        if not c.num_fusions():
            return f"Max Fusions Allowed: {c.max_fusions}\nThe fusion cache is empty.\n"
        rate = 100 * c.hits // c.lookups if c.lookups else 0
        return (f"Max Fusions Allowed: {c.max_fusions}\n"
                f"Total Fusions in Cache: {c.num_fusions()}\n"
                f"Total Unique Fusions Compiled: {self._compiled}\n"
                f"Cache Lookups: {c.lookups}\nCache Hits: {c.hits}\nHit Rate: {rate}%\n")


class LruFusionCache:
    """nvfuser_direct's decorator: the definitions a function builds get their executor from one
    LRUCache (``fd.fec``), so equal definitions compile once."""

    def __init__(self, max_fusions: int = DEFAULT_MAX_FUSIONS):
        self.cache = LRUCache(max_fusions)

    def __call__(self, create_fusion_definition):
        import functools

        @functools.wraps(create_fusion_definition)
        def wrapper(*args: Any, **kwargs: Any):
            fd = create_fusion_definition(*args, **kwargs)
            if getattr(fd, "fec", None) is None:
                fd.fec = self.cache.cache_compile(fd.fusion)
            return fd

        wrapper.stats = self.cache.stats
        wrapper.num_fusions = self.cache.num_fusions
        return wrapper
