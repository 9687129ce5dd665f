"""The compiler's fusions, one file each (compiler/plan.py sets their order). Each module's
docstring names the ops emitter that writes its kernel and the shader hook it relies on."""
