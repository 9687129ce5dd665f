"""A specialization imported from the ONNX model (or loaded from the graph cache): graph inputs
that must be known at load take their value from the feeds, and the import is retried when it
finds one more such input (NeedsValue)."""

import numpy as np

from . import cache as graph_cache
from . import lazy
from .run import host_value
from .tensorsets import Specialization


class Importing:
    """InferenceSession's import of a specialization (a mixin)."""

    def _import(self, feeds, build_only, dynamic=None, sizes=None, ones=None):
        """Import the ONNX model for the feeds' shapes; graph inputs that must be known at load
        (shapes, axes, pads given as inputs) take their value from `feeds` and the graph is
        specialized to it. None when such a value is needed but `build_only` (no values yet).
        dynamic: {dimension name: maximum} of the dynamic dimensions of this build (the inputs
        having one are declared with it instead of the feed's size; an input fed with one of
        them empty keeps the feed's shape, an empty constant); ones: those fixed to 1 in it."""
        while True:
            values = {} if build_only else {n: np.array(host_value(feeds[n], self._ctx)) for n in self._value_names}
            shapes = {n: tuple(v.shape) for n, v in feeds.items() if n not in self._value_names}
            if dynamic is not None:
                caps = self._caps
                shapes = {
                    n: s
                    for n, s in shapes.items()
                    if n not in caps.axes or any(sizes.get(d) == 0 for _, d in caps.axes[n])
                }
            key = None
            if self._cache_id is not None:  # built by an earlier process: loaded, not imported
                key = graph_cache.spec_key(self, shapes, values, dynamic, ones)
                hit = graph_cache.load_spec(self, key)
                if hit is not None:
                    self._stats["loaded"] += 1
                    return Specialization(hit[0], hit[1], hit[2], values)
            importer = lazy.importer()
            im = importer.Importer(
                self._model,
                self._ctx,
                free_dimensions=self._free,
                input_shapes=shapes,
                weights=self._weights,
                input_values=values,
                dynamic=dynamic,
                ones=ones,
            )
            try:
                with importer.model_errors(self._name, im):
                    imp = im.run()
                break
            except importer.NeedsValue as e:
                if e.input_name in self._value_names:
                    raise
                self._value_names.add(e.input_name)
                self._save_note()
                if build_only:
                    return None  # known at the first run
        if self._weights is not None:
            self._weights.release()  # uploaded: the mapped pages leave this process's memory
        if imp.cut is not None:  # data-dependent shapes: the first of a tree of stages (not cached)
            return Specialization(None, imp.inputs, [], values, stage=lazy.stages().Stage(imp))
        if key is not None:
            graph_cache.save_spec(self, key, imp.graph, imp.inputs, imp.outputs, values)
        return Specialization(imp.graph, imp.inputs, imp.outputs, values)
