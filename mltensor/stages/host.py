"""StageHost: what stages/ needs of the session that runs a staged model (InferenceSession
implements it; stages/ never imports the session).

plan.run and loop.execute take the host as their first argument. Through it they reach the
context, the one-build-at-a-time lock, the builds of later stages and of loop bodies (the host
owns the importer: stages/ imports neither the session nor the ONNX importer), and the readback
statistics.
"""

from typing import Protocol


class StageHost(Protocol):
    @property
    def context(self):
        """The MLContext the stages run on."""

    @property
    def build_lock(self):
        """Held while anything is built: one build at a time per session (runs at built sizes go
        on)."""

    def next_stage(self, spec, stage, key, cut, values, carried):
        """The plan.Stage after `stage` for its step's outcome (`key`; `values` read back,
        `carried` the values crossing the cut): cached, else imported from the cut's snapshot
        and built. spec: the session's specialization whose stage tree it is."""

    def import_body(self, model, input_shapes):
        """Import a Loop or Scan body wrapped as its own model (loop.py, the build lock held): the
        importer's result (graph, inputs, outputs)."""

    def storage_array(self, a):
        """A host constant in the dtype of the WebNN operand that carries its ONNX type (bool ->
        uint8, double -> float32), as the importer stores it."""

    def read_all(self, values):
        """Read every MLTensor in `values` back (numpy values pass through) in one submit."""

    def count_read(self, nbytes):
        """Count a readback of `nbytes` in the session's stats (readbacks, readback_bytes)."""
