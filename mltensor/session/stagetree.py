"""The session as the stage host of a staged model (stages/host.py StageHost): it builds the
later stages of a specialization's stage tree and the bodies of executed loops (the importer is
its to run), and counts the readbacks. stages/ reaches the session only through these."""

from ..errors import NotSupportedError
from . import lazy
from .run import read_all


class StageTree:
    """InferenceSession's StageHost methods (a mixin); `context` and `build_lock` are the
    session's own."""

    def next_stage(self, spec, stage, key, cut, values, carried):
        """The stage after `stage` for its step's outcome: cached, else imported from the cut's
        snapshot and built (one build at a time, as for specializations)."""

        def cached():
            with self._lock:
                child = stage.children.get(key)
                if child is not None:
                    stage.children.move_to_end(key)
                    self._stats["stage_hits"] += 1
                return child

        child = cached()
        if child is not None:
            return child
        with self.build_lock:
            child = cached()
            if child is not None:
                return child
            snap = cut.snapshot.with_outcome(cut.key, values, carried)
            if self._kind == "tflite":  # (tflite/staged.py)
                imported = lazy.tflite().resume_stage(snap, self._ctx, self._stage_build())
                return self._adopt(spec, stage, key, lazy.stages().Stage(imported))
            importer = lazy.importer()
            im = importer.Importer(
                self._model,
                self._ctx,
                free_dimensions=self._free,
                weights=self._weights,
                input_values=spec.values,
                resume=snap,
            )
            try:
                with importer.model_errors(self._name, im):
                    imp = im.run()
            except importer.NeedsValue as e:
                raise NotSupportedError(f"{e} (here after a data-dependent shape: not supported)") from None
            if self._weights is not None:
                self._weights.release()
            return self._adopt(spec, stage, key, lazy.stages().Stage(imp))

    def _adopt(self, spec, stage, key, child):
        """Keep a new stage among `stage`'s children (the oldest evicted past max_specializations)."""
        with self._lock:
            if self._closed or spec.dropped:
                child.destroy()
                raise TypeError("[InferenceSession.run] the session was closed during the run")
            stage.children[key] = child
            self._stats["stage_builds"] += 1
            while len(stage.children) > self.max_specializations:
                _, old = stage.children.popitem(last=False)
                spec.retired.append(old)  # destroyed once no run is in flight on spec
                self._stats["evictions"] += 1
        return child

    def import_body(self, model, input_shapes):
        """Import a Loop or Scan body wrapped as its own model (stages/loop.py, which holds the
        build lock)."""
        importer = lazy.importer()
        im = importer.Importer(model, self._ctx, input_shapes=input_shapes)
        im.cut_refusal = "inside a Loop or Scan body run on the GPU"
        im.values_bindable = False  # its inputs change every iteration
        with importer.model_errors(self._name, im, self._model, self._weights):
            return im.run(const_outputs_as_ops=True)

    def storage_array(self, a):
        """A host constant in the dtype of the WebNN operand that carries its ONNX type."""
        return lazy.importer().storage_array(a)

    def read_all(self, values):
        """Read every MLTensor in `values` (numpy values pass through) in one submit."""
        return read_all(self._ctx, values, "InferenceSession.run")

    def count_read(self, nbytes):
        with self._lock:
            self._stats["readbacks"] += 1
            self._stats["readback_bytes"] += int(nbytes)
