"""The builds an InferenceSession keeps per input sizes (specializations): static builds in an
LRU of `max_specializations`; with dynamic dimensions one build for every size up to the
capacities, rebuilt (compiling nothing new) when a feed outgrows one."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ..errors import DataError, InternalError, NotSupportedError
from .run import host_value

if TYPE_CHECKING:
    from ..dynamic.capacity import Capacities
    from .tensorsets import Specialization


class Specializations:
    """InferenceSession's specialization methods (a mixin)."""

    # attributes InferenceSession.__init__ sets (declared for the type checker)
    _caps: Capacities | None
    _spec: Specialization | None
    _static_reason: str | None
    _static_maxima: list[list[str | int]] | None

    def _key(self, feeds):
        """Cache key of a specialization: each input's shape, and the value of each input the
        graph must know at load."""
        key = []
        for a in self._input_args:
            v = feeds[a.name]
            if a.name in self._value_names:
                h = host_value(v, self._ctx)
                key.append((a.name, h.dtype.str, h.shape, h.tobytes()))
            else:
                key.append((a.name, tuple(v.shape)))
        return tuple(key)

    def _lookup(self, key):
        """A cached specialization (lock held), marked most recently used, or None."""
        spec = self._specs.get(key)
        if spec is not None:
            self._specs.move_to_end(key)
            self._stats["hits"] += 1
            self._spec = spec
        return spec

    def _specialize(self, feeds: dict[str, Any], build_only: bool = False, take: bool = False) -> Any:
        """Make the specialization for these feeds current: from the cache, else imported and
        built (evicting the least recently used one beyond max_specializations). take: also take
        a tensor set for a run, atomically with the lookup (returns (spec, set))."""
        if self._caps is not None and not build_only:
            return self._specialize_dynamic(feeds, take)
        key = self._key(feeds)
        with self._lock:
            spec = self._lookup(key)
            if spec is not None:
                return (spec, spec.take()) if take else spec
        with self.build_lock:  # another thread may be building this very key: wait for it
            key = self._key(feeds)
            with self._lock:
                spec = self._lookup(key)
                if spec is not None:
                    return (spec, spec.take()) if take else spec
            spec = self._import(feeds, build_only)
            if spec is None:
                return None
            key = self._key(feeds)  # the import may have found inputs whose values it needs
            with self._lock:
                if self._closed:
                    spec.destroy()
                    raise TypeError("[InferenceSession.run] the session was closed during the run")
                self._stats["builds"] += 1
                self._specs[key] = spec
                self._spec = spec
                self._evict_lru()
                return (spec, spec.take()) if take else spec

    def _specialize_dynamic(self, feeds, take):
        """_specialize with dynamic dimensions: one build for every size up to the capacities,
        redone (compiling nothing new) when a feed outgrows one; a static build per size if the
        model cannot be built with dynamic dimensions."""
        shapes = {a.name: tuple(feeds[a.name].shape) for a in self._input_args}
        sizes = self._caps.sizes(shapes)

        def fits(spec):
            return all(sizes.get(n, 0) <= m for n, m in spec.values.get("__maxes__", {}).items())

        def key():
            vals = tuple(k for k in self._key(feeds) if k[0] in self._value_names)
            return ("dynamic", self._caps.pattern(sizes), vals)

        def cached():
            with self._lock:
                k = key()
                spec = self._specs.get(k)
                if spec is not None and fits(spec):
                    self._lookup(k)
                    return (spec, spec.take()) if take else spec
            return None

        hit = cached()
        if hit is not None:
            return hit
        with self.build_lock:  # another thread may have built it meanwhile
            hit = cached()
            if hit is not None:
                return hit
            self._caps.grow(sizes)
            maxes, ones = self._caps.for_build(sizes)
            try:
                spec = self._import(feeds, False, dynamic=maxes, sizes=sizes, ones=ones)
            except (NotSupportedError, TypeError, DataError, InternalError) as e:
                # (a malformed model raises its DataError again in the static import below, a
                # bug of the dynamic path alone is noted in _static_reason)
                if self._require_dynamic:
                    raise
                # a dynamic dimension reaches an operator that needs a fixed size: one build per
                # size from now on (as without dynamic dimensions)
                self._static_reason = f"{type(e).__name__}: {e}"
                self._static_maxima = sorted([str(k), int(v)] for k, v in self._caps.user.items())
                self._caps = None
                self._save_note()  # a later process goes straight to per-size builds
                spec = None
            if spec is None:
                return self._specialize_static_locked(feeds, take)
            spec.values["__maxes__"] = maxes
            with self._lock:
                if self._closed:
                    spec.destroy()
                    raise TypeError("[InferenceSession.run] the session was closed during the run")
                self._stats["builds"] += 1
                old = self._specs.pop(key(), None)
                taken = spec.take() if take else None
                if old is not None:  # outgrown: the bigger build replaces it
                    if taken is not None:
                        # this run's feeds may be the old build's ml-tensor outputs (a decode
                        # loop feeding present back as past): the old build is destroyed when
                        # this run ends (_end_run), not before it reads them
                        old.users += 1
                        self._retiring[id(taken)] = old
                    self._drop(old)
                self._specs[key()] = spec
                self._spec = spec
                self._evict_lru()
                return (spec, taken) if take else spec

    def _specialize_static_locked(self, feeds, take):
        """The static path of _specialize, the build lock already held."""
        spec = self._import(feeds, False)
        k = self._key(feeds)
        with self._lock:
            self._stats["builds"] += 1
            self._specs[k] = spec
            self._spec = spec
            self._evict_lru()
            return (spec, spec.take()) if take else spec

    def _evict_lru(self):
        while len(self._specs) > self.max_specializations:
            _, old = self._specs.popitem(last=False)
            self._drop(old)
            self._stats["evictions"] += 1

    def _drop(self, spec: Specialization) -> None:
        """Evicted or closed (lock held): destroyed now, or by the last run in flight on it."""
        spec.dropped = True
        if spec.users == 0:
            spec.destroy()

    def _end_run(self, spec: Specialization, tset: Any, keep: bool) -> None:
        with self._lock:
            old = self._retiring.pop(id(tset), None)
            if spec.give_back(tset, keep):
                spec.destroy()
            elif spec.users == 0 and spec.retired:
                spec.destroy_retired()
            if old is not None:  # the build this run's rebuild replaced (_specialize_dynamic)
                old.users -= 1
                if old.dropped and old.users == 0:
                    old.destroy()
