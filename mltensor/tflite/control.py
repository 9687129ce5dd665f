"""TFLite's resource variables and control flow: VAR_HANDLE, READ_VARIABLE, ASSIGN_VARIABLE,
CALL_ONCE, IF and WHILE, and the load-time folding of integer arithmetic that decides loops.

Resource variables (streaming models keep a ring buffer of past frames in them): each variable a
model reads before assigning it within a call becomes state, a graph input named
`STATE_PREFIX + <its shared name>` (the value before the call) and, when the call assigns it, a
graph output of the same name (the value after it). The session keeps the state in GPU tensors
between runs (mltensor/session/state.py): nothing goes to the host. CALL_ONCE's initialization
subgraph is evaluated at load; its constant assignments are the initial state
(`Importer.initial_state`). Within a call, a read after an assignment sees the assigned value,
as LiteRT's interpreter gives it.

IF: a condition known at load takes its branch. A computed one runs both branches and selects
each output (and each variable a branch assigns) with `where`, when the two give the same shapes;
when they differ, or a branch holds control flow only a run decides (a run-time WHILE), the
import ends at the IF (staging.py: an InferenceSession reads the condition back and imports the
branch taken as the next stage, which may itself end inside the branch).
WHILE: the condition is evaluated at load on the values known then (loop counters and trip
counts are constants; the integer arithmetic on them is folded by `fold`) and the body unrolled
into the graph, up to MAX_UNROLL iterations (the Keras 3 LSTM's loop over time steps, a
tf.while_loop with a fixed bound). A condition computed from run-time values ends the import
there (staging.py): an InferenceSession runs the loop on the GPU (staged.py, stages/loop.py);
tflite.import_model, one graph, refuses it. So does a loop known at load to run more than
MAX_UNROLL iterations.
"""

from dataclasses import dataclass, field

import numpy as np

from ..errors import DataError, NotSupportedError
from . import quantized, staging
from .common import op_error, opt
from .reader import TENSOR_TYPES

STATE_PREFIX = "state:"
MAX_UNROLL = 256
# operators whose RESOURCE tensors (variable handles) are understood
RESOURCE_OPS = ("VAR_HANDLE", "READ_VARIABLE", "ASSIGN_VARIABLE", "IF", "WHILE", "CALL_ONCE")


@dataclass(frozen=True)
class Handle:
    """A resource variable's handle, as a VAR_HANDLE output or a subgraph argument."""

    key: tuple  # (container, shared_name)


@dataclass
class Variable:
    key: tuple
    name: str
    initial: np.ndarray = None  # the state's storage form (float32 real values for int8 ones)
    value: object = None  # during the import: the current value (operand or numpy), None: unread
    state_in: object = None  # the graph input holding the value before the call
    assigned: bool = False  # the main run assigns it (a state output)
    quant: object = field(default=None)  # (scale, zero point) of its tensors, or None


def _decode(v):
    return v.decode("utf-8", "replace") if isinstance(v, bytes) else (v or "")


def _variable(imp, op, i):
    key = imp.handles.get(i)
    if key is None:
        raise op_error(op, f"tensor {i} ('{imp.tensor(i).name}') is no variable handle (no VAR_HANDLE made it)")
    var = imp.root.variables.get(key)
    if var is None:
        container, shared = key
        var = Variable(key, f"{container}/{shared}" if container else shared)
        imp.root.variables[key] = var
    return var


def _check_quant(imp, op, var, i):
    t = imp.tensor(i)
    q = (tuple(t.scale.tolist()), tuple(t.zero_point.tolist())) if t.scale is not None else None
    if var.quant is None:
        var.quant = q if q is not None else False
    elif (var.quant or None) != q:
        raise op_error(
            op, f"variable '{var.name}' is read and assigned with different quantizations", NotSupportedError
        )


def _storage(imp, arr, t):
    """A constant value of tensor t in the form the state holds it."""
    arr = np.asarray(arr)
    if t.scale is not None and arr.dtype.kind in "iu":
        arr = quantized.dequantize_array(arr, t)
    if arr.dtype == np.bool_:
        arr = arr.astype(np.uint8)
    if arr.dtype == np.float64:
        arr = arr.astype(np.float32)
    if imp.float16 and arr.dtype == np.float32:
        arr = arr.astype(np.float16)
    return np.array(arr, order="C")


def to_operand(imp, v):
    """A value (operand or numpy constant) as an operand."""
    if not isinstance(v, np.ndarray):
        return v
    arr = v.astype(np.uint8) if v.dtype == np.bool_ else v
    if arr.dtype == np.float64:
        arr = arr.astype(np.float32)
    if imp.float16 and arr.dtype == np.float32:
        arr = arr.astype(np.float16)
    return imp.b.constant(np.array(arr, order="C"))


def _current(imp, op, var):
    """The variable's value now: what this call assigned, else the state before the call."""
    if var.value is not None:
        return var.value
    if imp.mode == "init":
        if var.initial is None:
            raise op_error(op, f"the initialization subgraph reads variable '{var.name}' before assigning it",
                           NotSupportedError)  # fmt: skip
        return var.initial
    if var.initial is None:
        raise op_error(op, f"reads variable '{var.name}', which no CALL_ONCE initialization and nothing earlier "
                           f"in the call assigns")  # fmt: skip
    if var.state_in is not None:  # (read before, in the other branch of an IF)
        var.value = var.state_in
        return var.value
    arr = var.initial
    dt = "float16" if arr.dtype == np.float16 else str(arr.dtype)
    var.state_in = imp.b.input(STATE_PREFIX + var.name, data_type=dt, shape=list(arr.shape))
    var.value = var.state_in
    return var.value


def variable_tensor(imp, op, i):
    """The Variable standing for variable tensor i (an LSTM's state) when the importer carries
    those between calls (`carry_variable_tensors`), else None. Its initial value is zeros, as
    LiteRT's after reset_all_variables()."""
    t = imp.tensor(i)
    if not (t.is_variable and imp.root.carry_variable_tensors and imp.mode == "main" and i not in imp.values):
        return None
    key = ("variable tensor", f"{imp.model.index}/{i}")
    var = imp.root.variables.get(key)
    if var is None:
        name = t.name or f"tensor_{i}" + (f"_subgraph_{imp.model.index}" if imp.model.index else "")
        dt = TENSOR_TYPES.get(t.type, (None, None))[1]
        if dt is None or t.scale is not None:
            raise op_error(op, f"variable tensor {i} ('{t.name}') has type {t.type_name}; float state is supported",
                           NotSupportedError)  # fmt: skip
        var = Variable(key, name, initial=_storage(imp, np.zeros(t.shape, dt), t), quant=False)
        imp.root.variables[key] = var
    return var


def read_state(imp, op, var):
    """The value of a variable tensor's state before this operator."""
    return _current(imp, op, var)


def write_state(var, v):
    """The operator leaves `v` in the variable tensor."""
    var.value = v
    var.assigned = True


def var_handle(imp, op):
    return Handle((_decode(opt(op, "Container", b"")), _decode(opt(op, "SharedName", b""))))


def read_variable(imp, op):
    var = _variable(imp, op, op.inputs[0])
    _check_quant(imp, op, var, op.outputs[0])
    return _current(imp, op, var)


def assign_variable(imp, op):
    var = _variable(imp, op, op.inputs[0])
    i = op.inputs[1]
    _check_quant(imp, op, var, i)
    t = imp.tensor(i)
    is_const = i in imp.consts and i not in imp.values
    if imp.mode == "init":
        if not is_const:
            raise op_error(op, f"the initialization subgraph computes variable '{var.name}' at run time; constant "
                               f"initial values are supported", NotSupportedError)  # fmt: skip
        var.initial = _storage(imp, imp.consts[i], t)
        return None
    v = _storage(imp, imp.consts[i], t) if is_const else imp.operand(op, i)
    if var.initial is not None and tuple(int(d) for d in v.shape) != var.initial.shape:
        raise op_error(op, f"assigns variable '{var.name}' a value of shape {list(v.shape)}; it holds "
                           f"{list(var.initial.shape)}", NotSupportedError)  # fmt: skip
    var.value = v
    var.assigned = True
    return None


def call_once(imp, op):
    index = int(opt(op, "InitSubgraphIndex", -1))
    if index in imp.root.initialized:
        return None
    imp.root.initialized.add(index)
    imp.run_subgraph(op, index, [], mode="init")
    return None


def _select(imp, op, c, t, e, what):
    if isinstance(t, Handle) or isinstance(e, Handle):
        if t == e:
            return t
        raise op_error(op, f"{what}: the branches give different variables", NotSupportedError)
    if isinstance(t, np.ndarray) and isinstance(e, np.ndarray) and t.dtype == e.dtype and np.array_equal(t, e):
        return t
    why = _differ(t, e)
    if why is not None:
        raise op_error(op, f"{what}: {why}", NotSupportedError)
    return imp.b.where(c, to_operand(imp, t), to_operand(imp, e))


def _differ(t, e):
    """Why two branch values cannot be selected by a run-time condition, or None."""
    if isinstance(t, Handle) or isinstance(e, Handle):
        return None
    td, ed = _type(t), _type(e)
    if tuple(t.shape) != tuple(e.shape) or td != ed:
        return (f"the branches give {td} {list(t.shape)} and {ed} {list(e.shape)}; a condition computed "
                f"at run time needs the same shapes")  # fmt: skip
    return None


def _type(v):
    if isinstance(v, np.ndarray):
        return "uint8" if v.dtype == np.bool_ else "float32" if v.dtype == np.float64 else str(v.dtype)
    return v.data_type


def if_(imp, op):
    then_i, else_i = int(opt(op, "ThenSubgraphIndex", -1)), int(opt(op, "ElseSubgraphIndex", -1))
    c_i = op.inputs[0]
    args = [imp.arg(op, i) for i in op.inputs[1:]]
    branch = imp is imp.root  # a stage may end inside its branches (staging.py)
    got = staging.outcome(imp, op)  # a resumed stage: the condition as the run read it back
    if got is not None:
        taken = then_i if int(np.asarray(got[0][0]).reshape(-1)[0]) else else_i
        return imp.run_subgraph(op, taken, args, branch=branch)
    if c_i in imp.consts and c_i not in imp.values:
        cond = np.asarray(imp.consts[c_i]).reshape(-1)
        if cond.size != 1:
            raise op_error(op, f"the condition has {cond.size} values, not one")
        return imp.run_subgraph(op, then_i if bool(cond[0]) else else_i, args, branch=branch)
    if imp.mode == "init":
        raise op_error(op, "a condition computed at run time in the initialization subgraph", NotSupportedError)
    c = imp.operand(op, c_i)
    if int(np.prod(c.shape)) != 1:
        raise op_error(op, f"the condition has shape {list(c.shape)}, not a single value")
    c = staging.condition(imp, c)
    variables = imp.root.variables
    before = {k: v.value for k, v in variables.items()}
    assigned = {k: v.assigned for k, v in variables.items()}
    try:
        outs_t = imp.run_subgraph(op, then_i, args, branch=branch)
        after_t = {k: (v.value, v.assigned) for k, v in variables.items()}
        for k, v in variables.items():
            v.value, v.assigned = before.get(k), assigned.get(k, False)
        outs_e = imp.run_subgraph(op, else_i, args, branch=branch)
    except staging.Cut as inner:
        if inner.imp is imp:
            raise
        # a branch needs a run to go on (a run-time WHILE in it): the condition is read back first,
        # then the stage importing the branch taken ends inside it
        staging.cut_if(imp, op, c, f"a branch's {inner.op.display}")
    if len(outs_t) != len(outs_e):
        raise op_error(op, f"the branches give {len(outs_t)} and {len(outs_e)} outputs")
    for k, (t, e) in enumerate(zip(outs_t, outs_e)):
        why = _differ(t, e)
        if why is not None:  # the shapes known only at run time: the stage ends at the condition
            staging.cut_if(imp, op, c, f"output {k}: {why}")
    for k, var in variables.items():
        vt, at = after_t.get(k, (None, False))
        ve = var.value
        if vt is ve:
            var.assigned = var.assigned or at
            continue
        vt = _current(imp, op, var) if vt is None else vt  # the branch that left it alone: the state
        ve = _current(imp, op, var) if ve is None else ve
        var.value = _select(imp, op, c, vt, ve, f"variable '{var.name}'")
        var.assigned = True
    return [_select(imp, op, c, t, e, f"output {k}") for k, (t, e) in enumerate(zip(outs_t, outs_e))]


def while_(imp, op):
    cond_i, body_i = int(opt(op, "CondSubgraphIndex", -1)), int(opt(op, "BodySubgraphIndex", -1))
    got = staging.outcome(imp, op)  # a resumed stage: the loop ran on the GPU (tflite/staged.py)
    if got is not None:
        return staging.loop_outputs(imp, op, got)
    vals = first = [imp.arg(op, i) for i in op.inputs]
    for n in range(MAX_UNROLL + 1):
        c = imp.run_subgraph(op, cond_i, vals)
        if len(c) != 1:
            raise op_error(op, f"the condition subgraph gives {len(c)} outputs, not one")
        if not isinstance(c[0], np.ndarray):  # the loop runs on the GPU, its own stage (tflite/staged.py)
            staging.cut_loop(imp, op, vals, c[0], "the loop's condition is computed at run time (loops whose trip "
                             f"count is known at load are unrolled, at most {MAX_UNROLL} iterations)")  # fmt: skip
        if not bool(np.asarray(c[0]).reshape(-1)[0]):
            return vals
        if n == MAX_UNROLL:  # too long to unroll: run on the GPU from the start (the unrolled part unused)
            staging.cut_loop(imp, op, first, np.array(True), f"the loop runs more than {MAX_UNROLL} iterations "
                             f"(loops are unrolled into the graph up to {MAX_UNROLL})")  # fmt: skip
        vals = imp.run_subgraph(op, body_i, vals)
        if len(vals) != len(op.inputs):
            raise op_error(op, f"the body gives {len(vals)} values for {len(op.inputs)} loop variables")
    return vals


# -- integer arithmetic on constants, folded at load ---------------------------------------------

_FOLD = {
    "ADD": np.add,
    "SUB": np.subtract,
    "MUL": np.multiply,
    "MAXIMUM": np.maximum,
    "MINIMUM": np.minimum,
    "FLOOR_DIV": np.floor_divide,
    "FLOOR_MOD": np.mod,
    "LESS": np.less,
    "LESS_EQUAL": np.less_equal,
    "GREATER": np.greater,
    "GREATER_EQUAL": np.greater_equal,
    "EQUAL": np.equal,
    "NOT_EQUAL": np.not_equal,
    "LOGICAL_AND": np.logical_and,
    "LOGICAL_OR": np.logical_or,
    "LOGICAL_NOT": np.logical_not,
}


def fold(imp, op):
    """An integer or bool elementwise operator on constants, computed at load (loop counters and
    trip counts; LiteRT's integer arithmetic wraps as numpy's does); None when it does not apply."""
    fn = _FOLD.get(op.name)
    if fn is None or len(op.outputs) != 1 or not op.inputs:
        return None
    if any(i < 0 or i not in imp.consts or i in imp.values or imp.tensor(i).scale is not None for i in op.inputs):
        return None
    arrs = [np.asarray(imp.consts[i]) for i in op.inputs]
    if any(a.dtype.kind not in "iub" for a in arrs) or opt(op, "FusedActivationFunction", 0):
        return None
    if op.name in ("FLOOR_DIV", "FLOOR_MOD") and not np.all(arrs[1]):
        return None  # (division by zero: the operator's own converter says what it does)
    out = TENSOR_TYPES.get(imp.tensor(op.outputs[0]).type, (None, None))[1]
    if out is None:
        return None
    with np.errstate(all="ignore"):
        return np.array(fn(*arrs), dtype=out, order="C")  # (ascontiguousarray makes scalars 1-d)


def state_edges(imp, names, outputs, out_desc):
    """The state inputs and outputs of the main graph, after the model's own (see the module's
    docstring); fills imp.initial_state {state name: initial value}."""
    imp.initial_state = {}
    model_names = {n for n, _, _ in names} | set(outputs)
    for var in sorted(imp.variables.values(), key=lambda v: v.name):
        if var.state_in is None:
            continue  # never read before assigned: nothing is carried to the next call
        name = STATE_PREFIX + var.name
        if name in model_names:
            raise NotSupportedError(f"[tflite] a model input or output is named '{name}', as variable state is")
        imp.initial_state[name] = var.initial
        names.append((name, var.state_in.data_type, tuple(var.initial.shape)))
        if not var.assigned or var.value is var.state_in:
            continue  # read only: the state never changes
        v = to_operand(imp, var.value)
        if v.data_type != var.state_in.data_type:
            raise DataError(f"[tflite] variable '{var.name}' holds {var.state_in.data_type} values; the model assigns "
                            f"it {v.data_type} ones")  # fmt: skip
        if v._kind in ("input", "constant"):
            v = imp.b.identity(v)
        outputs[name] = v
        out_desc.append((name, v.data_type, tuple(v.shape)))


CONVERTERS = {
    "VAR_HANDLE": var_handle,
    "READ_VARIABLE": read_variable,
    "ASSIGN_VARIABLE": assign_variable,
    "CALL_ONCE": call_once,
    "IF": if_,
    "WHILE": while_,
}
