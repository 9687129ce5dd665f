"""A user's program, type-checked with mypy --strict by tests/test_types.py (never run): every
call here must be known to the checker with its parameter and return types (py.typed, the
annotations of the public API, mltensor/front/_builder_ops.pyi). Not a test module (no test_)."""

import numpy as np

import mltensor
from mltensor import MLGraph, MLGraphBuilder, MLOperand, MLTensor, ml
from mltensor.llm import LLM, Conversation, GGUFTokenizer
from mltensor.llm.engine import Engine, EngineClosed, QueueFull, Request


def build(ctx: mltensor.MLContext) -> MLGraph:
    b = MLGraphBuilder(ctx)
    x: MLOperand = b.input("x", data_type="float32", shape=[1, 3, 8, 8])
    w = b.constant(np.zeros((4, 3, 3, 3), np.float32))
    y = b.conv2d(x, w, padding=[1, 1, 1, 1], strides=[1, 1], label="conv")
    y = b.relu(y)
    m = b.matmul(a=b.reshape(y, [4, 64]), b=b.constant(np.zeros((64, 2), np.float32)))
    g = b.gemm(m, b.constant(np.zeros((2, 2), np.float32)), c=None, alpha=0.5)
    parts: list[MLOperand] = b.split(g, 2, axis=1)
    z = b.add(parts[0], parts[1])
    return b.build_sync({"y": y, "z": z})


def run() -> None:
    ctx = ml.create_context_sync(power_preference="high-performance")
    graph = build(ctx)
    tx: MLTensor = ctx.create_tensor_sync(data_type="float32", shape=[1, 3, 8, 8], writable=True)
    ty = ctx.create_tensor_sync(data_type="float32", shape=[1, 4, 8, 8], readable=True)
    tz = ctx.create_tensor_sync(data_type="float32", shape=[4, 1], readable=True)
    ctx.write_tensor(tx, np.ones((1, 3, 8, 8), np.float32))
    ctx.dispatch(graph, {"x": tx}, {"y": ty, "z": tz})
    out = ctx.read_tensor_sync(ty)
    assert out is not None
    ctx.destroy()


async def run_async() -> None:
    ctx = await ml.create_context_async()
    t = await ctx.create_tensor_async(data_type="float32", shape=[2], readable=True)
    arr = await ctx.read_tensor_async(t)
    assert arr is not None


def graph_queries(graph: MLGraph) -> None:
    shapes: dict[str, tuple[int, ...]] = graph.compute_shapes({"x": [1, 3, 8, 8]})
    kernels: list[str] = graph.kernels_run({"x": (1, 3, 8, 8)})
    report = graph.fusion_report()
    names: list[str] = graph.kernel_names
    memory: dict[str, int] = graph.memory
    dims: dict[str, int] = graph.dynamic_dimensions
    for _name, (data_type, shape) in graph.input_descriptors.items():
        assert isinstance(data_type, str) and len(shape) >= 0
    assert shapes and kernels and names and memory is not None and dims is not None and report is not None
    graph.destroy()


def dynamic(ctx: mltensor.MLContext) -> None:
    n = mltensor.MLDynamicDimension("n", 64)
    size: int = n.max_size
    b = MLGraphBuilder(ctx)
    x = b.input("x", data_type="float32", shape=[n, 4])
    rank: int = x.rank
    dt: str = x.data_type
    t = ctx.create_tensor_sync(data_type="float32", shape=[n, 4], writable=True)
    current: tuple[int, ...] = t.shape
    declared = t.max_shape
    flags: bool = t.readable or t.writable or t.constant or t.importable_to_webgpu or x.dynamic
    limits = ctx.op_support_limits()
    counters: dict[str, int] = ctx.counters
    features: set[str] = ctx.features
    gpu: bool = ctx.accelerated
    assert size and rank and dt and current and declared is not None and flags is not None
    assert limits and counters is not None and features is not None and gpu is not None
    t.destroy()


def interop(ctx: mltensor.MLContext) -> None:
    t = ctx.create_tensor_sync(data_type="float32", shape=[4], importable_to_webgpu=True)
    buf = mltensor.import_external_buffer_sync(ctx.device, t)
    assert buf.size >= 16
    buf.destroy()


async def interop_async(ctx: mltensor.MLContext) -> None:
    t = ctx.create_tensor_sync(data_type="float32", shape=[4], importable_to_webgpu=True)
    buf = await mltensor.import_external_buffer_async(ctx.device, t)
    buf.destroy()
    info = await ctx.lost
    assert info is not None


def session(ctx: mltensor.MLContext) -> None:
    path: str = mltensor.models.fetch_onnx("silero_vad", progress=False)
    sess = mltensor.InferenceSession(
        path, ctx, free_dimensions={"batch": 1}, max_dimensions={"n": 64}, dynamic=None, max_specializations=4
    )
    for arg in sess.get_inputs() + sess.get_outputs():
        name: str = arg.name
        kind: str = arg.type
        assert name and kind and (arg.shape is None or len(arg.shape) >= 0)
    providers: list[str] = sess.get_providers()
    feeds = {"x": np.zeros((1, 512), np.float32)}
    outs: list[np.ndarray] = sess.run(None, feeds)
    tensors: list[MLTensor] = sess.run(["y"], feeds, output_location="ml-tensor")
    n: int = sess.specializations
    stats = sess.stats
    graph: MLGraph | None = sess.graph
    same: mltensor.MLContext = sess.context
    assert providers and outs and tensors and n >= 0 and stats and same is ctx and graph is not None
    sess.close()
    tfl = mltensor.InferenceSession(mltensor.models.fetch("selfie_segmentation"), float16=True, cache=False)
    if tfl.stateful:
        tfl.reset_state()
    tfl.close()


async def session_async(sess: mltensor.InferenceSession) -> None:
    outs: list[np.ndarray] = await sess.run_async(None, {"x": np.zeros((1, 4), np.float32)})
    assert outs


def importers(ctx: mltensor.MLContext) -> None:
    graph, inputs, outputs = mltensor.onnx.import_model("model.onnx", ctx, free_dimensions={"batch": 1})
    ops: list[str] = mltensor.onnx.supported_ops()
    state: dict[str, np.ndarray] = {}
    g2, i2, o2 = mltensor.tflite.import_model(b"...", ctx, float16=False, initial_state=state)
    names: list[str] = mltensor.tflite.supported_operators()
    ok: bool = mltensor.tflite.is_tflite(b"12345678")
    cache: str = mltensor.models.cache_dir()
    gguf: str = mltensor.models.fetch_gguf("smollm2-135m-instruct")
    for name, data_type, shape in inputs + outputs + i2 + o2:
        assert name and data_type and len(shape) >= 0
    assert graph and g2 and ops and names and ok is not None and cache and gguf


def llm() -> None:
    model = LLM("smollm2-135m-instruct", max_context=512)
    seconds: float = model.build(temperature=0)
    text: str = model.generate("Once", max_tokens=8, temperature=0, stop=["."], seed=1)
    ids: list[int] = model.generate("Once", max_tokens=8, return_ids=True)
    for piece in model.generate([1, 2, 3], stream=True, top_k=40, top_p=0.9, repeat_penalty=1.1):
        assert isinstance(piece, str)
    for token in model.generate("Once", stream=True, return_ids=True):
        assert token >= 0
    reply: str = model.chat([{"role": "user", "content": "Hi"}], max_tokens=4)
    stream = model.chat([{"role": "user", "content": "Hi"}], stream=True)
    stream.close()
    conv: Conversation = model.conversation(system="Be terse.", max_tokens=16, temperature=0)
    answer: str = conv.say("2 + 2?")
    for piece in conv.say("And times 3?", stream=True, max_tokens=8):
        assert piece
    history: list[dict[str, str]] = conv.messages
    conv.reset()
    tok: GGUFTokenizer = model.tokenizer
    encoded: list[int] = tok.encode("hi", add_bos=False, add_eos=None) + tok.encode_chat("hi")
    decoded: str = tok.decode(encoded, skip_special=True) + model.detokenize(model.tokenize("hi", add_bos=True))
    prompt: str = model.apply_chat_template([{"role": "user", "content": "Hi"}], add_generation_prompt=True)
    stats = model.stats | conv.stats
    with Engine(model, slots=2, max_queue=4, prefill_chunk=16) as engine:
        try:
            req: Request = engine.submit(model.tokenize("Once"), max_tokens=4, temperature=0, stop="\n")
        except QueueFull as e:
            wait: float = e.retry_after
            assert wait > 0
            return
        except EngineClosed:
            return
        out = "".join(req)
        finished: bool = req.wait(timeout=1.0) and req.done
        req.cancel()
        metrics: dict[str, int] = engine.metrics()
        engine.shutdown(cancel=True, timeout=5.0)
    assert seconds >= 0 and text and ids and reply and answer and history is not None and decoded and prompt
    assert stats is not None and out is not None and finished is not None and metrics


async def llm_async(req: Request) -> None:
    async for piece in req:
        assert piece


def llm_blocks(ctx: mltensor.MLContext) -> None:
    from mltensor.llm import GGUFFile, LlamaConfig, LlamaModel, LlamaWeights, Sampler, repack

    f = GGUFFile("model.gguf")
    arch: str = f.require("general.architecture")
    config = LlamaConfig(f)
    weights = LlamaWeights(f)
    cos, sin = weights.rope_tables(16, scale=1.0)
    model = LlamaModel(weights, ctx, max_context=256, max_step=16, gemv=True)
    session = model.session()
    logits: MLTensor = session.feed(np.array([1, 2, 3], np.int32))
    cache: dict[str, MLTensor] = session.cache_tensors
    session.reset()
    sampler = Sampler(ctx, 32000, temperature=0.7, top_k=40, top_p=0.9, seed=1, repeat_penalty=1.1)
    sampler.reseed(None)
    token: int = sampler.read()
    q = repack("Q8_0", np.zeros(34, np.uint8), 1, 32)
    dense: np.ndarray = q.dequantize()
    size: int = q.nbytes + weights.nbytes
    assert arch and config and cos.size == sin.size and logits and cache and token >= 0 and dense.size and size
