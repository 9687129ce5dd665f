"""InferenceSession: an onnxruntime-style runner for ONNX and TFLite models on an MLContext.

    sess = mltensor.InferenceSession("model.onnx", free_dimensions={"batch": 1})
    y, = sess.run(None, {"x": array})                               # numpy in, numpy out
    t, = sess.run(None, {"x": tensor}, output_location="ml-tensor")  # MLTensors in and out

Runs are cheap by construction:
- the session keeps one MLTensor per input and per output, created at the first run (for the
  shapes fixed at creation) and reused: a run allocates nothing;
- the same tensors are bound every run, so the graph's cached bind groups are reused;
- each numpy feed is uploaded once (write_tensor straight from the array); an MLTensor feed is
  bound as is (no copy);
- all outputs are read in parallel: every read is started before any is waited on, so one submit
  serves them all, and each result is one copy from the mapped staging memory.

output_location="ml-tensor" returns the session's own output tensors (IOBinding semantics): they
stay valid until `close()`, and the NEXT RUN FROM THE SAME THREAD OVERWRITES THEM (runs from other
threads never touch them). Read or copy them before running again if you need to keep them. They
may be fed to another session on the same context (no copy), or back into this session (a decode
loop): that run writes the output into a second tensor kept for the purpose, so the two alternate
(still no allocation after the first such run).
Outputs ONNX folds to constants at load are returned from the host (numpy), or as a tensor written
once (ml-tensor).

Threads: `run` and `run_async` may be called concurrently on one session, as in onnxruntime. Each
run takes a tensor set (input and output tensors) no other run in flight uses: a thread keeps
reusing its own (so a single thread allocates nothing after its first run), concurrent runs get
one each from a small pool. Results are exactly what sequential runs give. Builds of new sizes
are made one at a time per session, while runs at sizes already built go on.

Shape-polymorphic (ONNX): a run accepts any input sizes the model allows (symbolic or unknown
dimensions not pinned by `free_dimensions`). Those dimensions are dynamic dimensions
(mltensor/dynamic/): one build serves every size, kernels read the sizes at dispatch, and the
session's tensors are resizable, sized for a maximum per dimension (`max_dimensions={"past":
4096}`, else grown by doubling from the first size: dynamic/capacity.py). A decode loop feeding
each step's `present_*` outputs back as `past_*` (output_location="ml-tensor") thus moves no
cache bytes between host and GPU and allocates nothing per step. An input fed with a zero-sized
dimension (an empty cache) gets its own build, as do the values of inputs that must be known at
load (a shape fed as an input). Where a model's graph needs a size fixed at build (an operator
without dynamic kernels), or the adapter lacks the `immediates` feature, or `dynamic=False`, each
new combination of input sizes is imported and built once instead (its reason in
`stats["static_reason"]`). Either way builds are specializations, each with its own graph and
tensors; the session keeps the `max_specializations` most recently used ones (LRU, default 8) and
destroys the rest, their ml-tensor outputs included. `session.specializations` says how many are
cached; `session.stats` counts builds, cache hits and evictions.

The package, one concept a module (InferenceSession is their union):
  inference.py        InferenceSession (the onnxruntime surface), default_context
  loading.py          loading: an ONNX model described from its proto or the graph cache's note,
                      a TFLite model; NodeArg
  specializations.py  the builds kept per input sizes: LRU of static builds, dynamic builds
                      rebuilt when a feed outgrows them
  tensorsets.py       a specialization and the tensor sets its runs take (one per thread)
  importing.py        a specialization imported from the model, retried on NeedsValue
  stagetree.py        the stage host of a staged model (stages/host.py): later stages and loop
                      bodies built, readbacks counted
  run.py              the run path: feeds checked, uploaded and bound, outputs dispatched and read
  state.py            a stateful TFLite model's variables, kept on the GPU between runs
                      (`reset_state()`), and the rule for runs on several threads
  lazy.py             the modules a session imports on first use only (onnx, TFLite, stages)
"""

from .inference import InferenceSession, default_context
from .loading import NodeArg

__all__ = ["InferenceSession", "NodeArg", "default_context"]
