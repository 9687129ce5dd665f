"""Runtime: WGSL kernels and pipelines, the per-context timeline, transfers and interop."""
