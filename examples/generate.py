"""Greedy text generation with a causal decoder ONNX model, every step on the GPU.

    python examples/generate.py                       # a tiny GPT-2-shaped model (seeded weights)
    python examples/generate.py --model gpt2.onnx     # a decoder exported with past key values
    python examples/generate.py --tokens 64 --check   # also decode with onnxruntime and compare

The loop is the one an onnxruntime user writes (feed input_ids and past_key_values.*, get logits
and present.*, feed present back as past), with output_location="ml-tensor":

- the session's dimensions are dynamic (batch, sequence, past_sequence): one build serves every
  step, plus one for the first step, whose cache is empty;
- each step's present.* tensors are fed back as the next step's past_key_values.* as they are: the
  KV cache never leaves the GPU and nothing is allocated per step (the session alternates two
  resizable tensors per cache entry, sized for max_dimensions);
- the next token is chosen on the GPU (arg_max over the last position's logits, a small graph
  with its own dynamic dimension) and that tensor is the next step's input_ids: nothing goes up,
  and only the token id (8 bytes) comes down, to be printed.

ctx.counters proves it: the summary prints bytes uploaded and downloaded and tensors created per
decode step (all 0 but the 8 bytes of the token).
"""

import argparse
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import mltensor  # noqa: E402
from mltensor import MLDynamicDimension, ml  # noqa: E402
from mltensor.models_synthetic import past_names, tiny_gpt2  # noqa: E402


def next_token_graph(ctx, vocab, max_sequence):
    """logits [1, sequence, vocab] -> the arg_max of the last position, as int64 [1, 1]."""
    b = mltensor.MLGraphBuilder(ctx)
    logits = b.input("logits", data_type="float32", shape=[1, MLDynamicDimension("sequence", max_sequence), vocab])
    seq = logits.shape[1]
    last = b.slice(logits, [0, seq - 1, 0], [1, 1, vocab])
    ids = b.arg_max(b.reshape(last, [1, vocab]), 1, keep_dimensions=True, output_data_type="int64")
    return b.build_sync({"ids": ids})


def generate(sess, prompt, n_tokens, *, on_token=None):
    """Greedy decoding: returns (tokens, per-step counters, seconds per decode step)."""
    ctx = sess.context
    names = [i.name for i in sess.get_inputs()]
    pairs = past_names(names)
    out_names = [o.name for o in sess.get_outputs()]
    past_shape = {i.name: i.shape for i in sess.get_inputs()}
    vocab = sess.get_outputs()[0].shape[-1]
    pick = next_token_graph(ctx, vocab, max(len(prompt), 1))
    ids_out = ctx.create_tensor_sync(data_type="int64", shape=[1, 1], readable=True)
    # first step: the prompt, an empty cache (numpy feeds)
    feeds = {"input_ids": np.asarray([prompt], np.int64)}
    for p, _ in pairs:
        _, h, _, d = past_shape[p]
        feeds[p] = np.zeros((1, h, 0, d), np.float32)
    tokens, steps, t_decode = [], [], []
    for step in range(n_tokens):
        before = ctx.counters
        t0 = time.perf_counter()
        outs = dict(zip(out_names, sess.run(None, feeds, output_location="ml-tensor")))
        ctx.dispatch(pick, {"logits": outs["logits"]}, {"ids": ids_out})
        token = int(ctx.read_tensor_sync(ids_out)[0, 0])
        if step:
            t_decode.append(time.perf_counter() - t0)
        after = ctx.counters
        steps.append({k: after[k] - before[k] for k in ("bytes_uploaded", "bytes_downloaded", "tensors_alive")})
        tokens.append(token)
        if on_token:
            on_token(token)
        # next step: the chosen id and the cache, all as GPU tensors
        feeds = {"input_ids": ids_out, **{p: outs[q] for p, q in pairs}}
    return tokens, steps, t_decode


def reference(model, prompt, n_tokens):
    """The same greedy loop with onnxruntime (CPU): tokens and seconds per decode step."""
    import onnxruntime as ort

    s = ort.InferenceSession(model, providers=["CPUExecutionProvider"])
    names = [o.name for o in s.get_outputs()]
    pairs = past_names([i.name for i in s.get_inputs()])
    shapes = {i.name: i.shape for i in s.get_inputs()}
    feeds = {"input_ids": np.asarray([prompt], np.int64)}
    for p, _ in pairs:
        feeds[p] = np.zeros((1, shapes[p][1], 0, shapes[p][3]), np.float32)
    tokens, times = [], []
    for step in range(n_tokens):
        t0 = time.perf_counter()
        res = dict(zip(names, s.run(None, feeds)))
        token = int(res["logits"][0, -1].argmax())
        if step:
            times.append(time.perf_counter() - t0)
        tokens.append(token)
        feeds = {"input_ids": np.array([[token]], np.int64), **{p: res[q] for p, q in pairs}}
    return tokens, times


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", help="a decoder ONNX file exported with past key values (default: tiny_gpt2)")
    ap.add_argument("--tokens", type=int, default=32, help="tokens to generate")
    ap.add_argument("--prompt", default="1,2,3,4", help="comma-separated prompt token ids")
    ap.add_argument(
        "--max-past",
        type=int,
        default=None,
        help="max_dimensions['past_sequence']: the longest cache (default: the tiny model's "
        "position table, 256; without it the session grows its buffers by doubling)",
    )
    ap.add_argument("--check", action="store_true", help="decode with onnxruntime too and compare")
    args = ap.parse_args(argv)
    model = open(args.model, "rb").read() if args.model else tiny_gpt2()
    prompt = [int(t) for t in args.prompt.split(",")]
    max_past = args.max_past or (None if args.model else 256)
    ctx = ml.create_context_sync()
    sess = mltensor.InferenceSession(model, ctx, max_dimensions={"past_sequence": max_past} if max_past else None)
    print(f"adapter: {ctx.device.adapter.info['device']}; prompt {prompt}")
    print("tokens:", end=" ", flush=True)
    tokens, steps, t_decode = generate(sess, prompt, args.tokens, on_token=lambda t: print(t, end=" ", flush=True))
    print()
    # steady state: step 1 builds for a non-empty cache, step 2 makes the second set of cache
    # tensors the loop alternates with; from step 3 on nothing is allocated
    decode = steps[3:]
    up = max(s["bytes_uploaded"] for s in decode) if decode else 0
    down = max(s["bytes_downloaded"] for s in decode) if decode else 0
    new = max(s["tensors_alive"] for s in decode) if decode else 0
    st = sess.stats
    print(f"builds: {st['builds']} (dynamic dimensions: {sess.dynamic_dimensions or st['static_reason']})")
    print(
        f"per decode step: {up} bytes uploaded, {down} bytes downloaded, {new} tensors created; "
        f"{np.median(t_decode) * 1e3:.2f} ms ({1 / np.median(t_decode):.1f} tokens/s)"
    )
    if args.check:
        ref, t_ref = reference(model, prompt, args.tokens)
        same = ref == tokens
        print(
            f"onnxruntime CPU: {'same tokens' if same else 'DIFFERENT tokens: ' + str(ref)}; "
            f"{np.median(t_ref) * 1e3:.2f} ms a step ({1 / np.median(t_ref):.1f} tokens/s)"
        )
        return 0 if same else 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
