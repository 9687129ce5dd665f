"""The TFLite importer's side of a cut: a WHILE whose condition is computed at run time, or an IF
on a run-time condition whose branches give different shapes, ends the import there when an
InferenceSession imports the model as stages (mltensor/stages/, as the ONNX importer's Loop and
data-dependent If: onnx/resume.py).

control.py calls `cut_loop` / `cut_if` at such an operator of the main subgraph; they raise Cut,
which tflite/staged.py catches at the top of the import: the stage graph ends there (its outputs
the values the rest of the subgraph reads, and the loop's initial values or the condition), the
step runs (the loop on the GPU timeline, stages/loop.py; or the condition read back), and the
import resumes at the same operator (`outcome`: the loop's final values, the condition's value)
with the values the earlier stage left as graph inputs.

A cut may also be inside a branch of an IF of the main subgraph (tf.while_loop inside tf.cond):
the IF is then cut first (its condition read back, as for branches of different shapes), and in
the stage that imports the branch taken the inner operator cuts as above; the snapshot then
resumes at the IF and, within its branch, at the inner operator (`Snapshot.inner`). Deeper
nesting, and a cut inside a WHILE body (run on the GPU as one graph, or unrolled), is refused.

Without stages (tflite.import_model: one graph) such operators are refused, naming the operator.
"""

import numpy as np

from ..errors import NotSupportedError
from .common import op_error


class Cut(BaseException):
    """An operator needs a value only a run can give. BaseException: no converter's `except`
    swallows it on its way to tflite/staged.py. kind "loop": `values` are the WHILE's values
    before its first run-time test, `cond` that test (an operand); kind "if": `cond` the IF's
    condition. drop: positions of the operator's inputs the resumed import does not read. imp:
    the import (root, or an IF branch's: `branch_of`) the operator is in."""

    def __init__(self, imp, op, kind, cond, values=(), drop=()):
        super().__init__(f"operator {op.index} ({op.display})")
        self.imp, self.op, self.kind, self.cond = imp, op, kind, cond
        self.values, self.drop = list(values), frozenset(drop)


class Snapshot:
    """The import at a cut, to resume from: the model, its options, the stage's number (`depth`),
    the operator to resume at (`index`), the constants known then (`consts`), the values the rest
    reads {tensor: (name in the run, data type, shape)} (`live`), and {operator index: outcome}
    of the cuts passed (`outcomes`; a loop's: (values, [Carried]), an IF's: (values, [])) with
    `plans` {operator index: [("carried", None) | ("const", array)]} of the loops' variables.
    A cut inside the branch of the IF at `index`: `inner` = (the operator's index in the branch,
    the branch's constants, its live values as `live`), and its outcome and plan keyed by
    (IF index, operator index) (`key_of`); else `inner` is None."""

    __slots__ = ("model", "free", "float16", "depth", "index", "consts", "live", "outcomes", "plans", "inner")

    def copy(self):
        s = Snapshot()
        for f in self.__slots__:
            setattr(s, f, getattr(self, f))
        s.outcomes, s.plans = dict(self.outcomes), dict(self.plans)
        return s

    def with_outcome(self, key, values, carried):
        """This snapshot with the outcome of the cut `key` (StageCut.key: (operator index, 0))."""
        s = self.copy()
        s.outcomes[key[0]] = (list(values), list(carried))
        return s


def key_of(imp, op):
    """The key of operator `op`'s outcome and plan in a Snapshot: its index, or (the IF's index,
    its index) inside a branch of that IF."""
    return op.index if imp.branch_of is None else (imp.branch_of.index, op.index)


# Importer.staged of the import of a WHILE body that stages/loop.py runs (tflite/staged.py)
IN_BODY = "inside a WHILE body run on the GPU"


def refusal(imp):
    """Why this import cannot cut here (one graph asked for, inside a subgraph or the
    initialization, resource variables in play), or None."""
    root = imp.root
    if root.staged is None:
        return "in one graph (tflite.import_model; an InferenceSession runs it as stages)"
    if root.staged is IN_BODY:
        return IN_BODY
    nested = imp.branch_of is not None and imp.parent is root  # a branch of a main IF (if_)
    if (imp is not root and not nested) or imp.mode != "main":
        return "inside a subgraph (a WHILE body, an IF branch nested deeper, the initialization)"
    if root.variables or root.handles:
        return "in a model with resource variables"
    return None


def condition(imp, c):
    """A run-time condition (any type, one value) as a uint8 scalar."""
    b = imp.b
    if c.data_type != "uint8":
        c = b.cast(b.not_equal(c, b.constant(np.zeros((), np.dtype(c.data_type)))), "uint8")
    return b.reshape(c, [])


def outcome(imp, op):
    """The outcome of this operator's cut when the import resumes at it, else None."""
    st = imp.root.staged
    if not isinstance(st, Snapshot):
        return None
    if imp is imp.root:
        return st.outcomes.get(op.index) if st.index == op.index else None
    if imp.branch_of is None or imp.branch_of.index != st.index or st.inner is None or st.inner[0] != op.index:
        return None
    return st.outcomes.get(key_of(imp, op))


def cut_loop(imp, op, values, cond, why):
    """End the stage at WHILE `op`: its loop runs on the GPU from `values`, `cond` the first test.
    why: what the refusal says where no stage can end here."""
    reason = refusal(imp)
    if reason is not None:
        raise op_error(op, f"{why}: not supported {reason}", NotSupportedError)
    raise Cut(imp, op, "loop", cond, values, drop=range(len(op.inputs)))


def cut_if(imp, op, cond, why):
    """End the stage at IF `op`: its condition is read back and the import resumes with the branch
    it takes."""
    reason = refusal(imp)
    if reason is not None:
        raise op_error(op, f"{why}: not supported {reason}", NotSupportedError)
    raise Cut(imp, op, "if", cond, drop=(0,))


def bind(imp):
    """A resumed stage (Importer.run, after the model's inputs): the constants known at the cut,
    the values the earlier stage left as inputs named as the run holds them, the operators from
    the one that was cut."""
    st = imp.staged
    if st.index is None:
        return
    imp.consts = dict(st.consts)
    for i, (name, data_type, shape) in st.live.items():
        imp.values[i] = imp.b.input(name, data_type=data_type, shape=list(shape))
    imp.start = st.index


def bind_branch(child, op):
    """The branch `child` of the IF `op` (Importer.run_subgraph): when the stage resumes inside it,
    its constants, its values the earlier stage left as inputs, its operators from the one cut."""
    st = child.root.staged
    if not isinstance(st, Snapshot) or st.index != op.index or st.inner is None:
        return
    index, consts, live = st.inner
    child.consts.update(consts)
    for i, (name, data_type, shape) in live.items():
        child.values[i] = child.b.input(name, data_type=data_type, shape=list(shape))
    child.start = index


def loop_outputs(imp, op, got):
    """A WHILE's outputs on the resumed import: its invariant constants, and its final values as
    the loop left them (inputs of this stage)."""
    _, carried = got
    rest = iter(carried)
    outs = []
    for kind, v in imp.root.staged.plans[key_of(imp, op)]:
        if kind == "const":
            outs.append(v)
        else:
            c = next(rest)
            outs.append(imp.b.input(c.avail, data_type=c.data_type, shape=list(c.shape)))
    return outs
