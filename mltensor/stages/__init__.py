"""Data-dependent shapes and executed loops: a model run as a chain of graphs ("stages").

WebNN graphs have static shapes. Some ONNX values decide a shape only at run time: the number of
NonZero elements, the boxes NonMaxSuppression keeps, a Reshape target or TopK's k computed from
the input's values, the iterations of a Loop whose exit condition is computed on the GPU. The
importer cuts the model at such a value:

  stage k   the graph up to the cut, its outputs the values the rest of the model still needs
            (they stay on the GPU as MLTensors) and the few values that decide the shape;
  step      read back only those values (a count, a k, a shape: bytes, never the data), or run
            a Loop on the GPU (its body built once as its own graph, loop.py);
  stage k+1 the rest, imported again from the node that was cut, its inputs the tensors stage
            k left, built once per distinct outcome of the step and cached.

cut.py    Carried: a value crossing a cut (the importer's side of a cut, where a handler asks
          for a value, the snapshot and the resumed import, is mltensor/onnx/resume.py)
plan.py   the session's side: the tree of stages of one specialization, a run along it
loop.py   Loop and Scan executed on the timeline: carried values in MLTensors, the exit
          condition read back once per batch of iterations
pool.py   the pools of tensor sets the stages and executed loops take a run's tensors from
host.py   StageHost, what plan.py and loop.py need of the session running them (they import
          neither the session nor the ONNX importer: the session builds for them)

The TFLite importer cuts likewise at a WHILE whose condition, or an IF whose output shapes, only a
run gives (tflite/staging.py, tflite/staged.py: its loop body built by the TFLite importer).

Not in a Loop/Scan body or in dynamic-dimension builds: those raise NotSupportedError (the
session then builds per size).
"""
