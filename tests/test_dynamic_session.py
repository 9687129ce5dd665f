"""InferenceSession with dynamic dimensions (issue 24): one build for every size, and a decode
loop that keeps its KV cache on the GPU, checked step by step against onnxruntime.

The decoder is `mltensor.models_synthetic.tiny_gpt2`: shaped like a GPT-2 exported from
transformers with past key values (Shape/Gather/Range position ids, a causal mask sliced from a
constant buffer, heads split by Reshape to a computed shape, Concat of the cache, tanh GELU),
seeded weights."""

import os
import sys

import numpy as np
import onnxruntime as ort
import pytest

import mltensor
from mltensor.models_synthetic import past_names, tiny_gpt2

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "examples"))
import generate  # noqa: E402  (examples/generate.py: the decode loop users copy)

L, H, D, V = 2, 4, 16, 512


@pytest.fixture(scope="module")
def model():
    return tiny_gpt2(layers=L, heads=H, head_size=D, vocab=V)


@pytest.fixture(scope="module")
def ort_sess(model):
    return ort.InferenceSession(model, providers=["CPUExecutionProvider"])


def _feeds(ids, past=None, batch=1):
    f = {"input_ids": np.asarray(ids, np.int64)}
    for i in range(L):
        for k in ("key", "value"):
            f[f"past_key_values.{i}.{k}"] = (
                past[f"present.{i}.{k}"] if past is not None else np.zeros((batch, H, 0, D), np.float32)
            )
    return f


def test_prefill_at_many_sizes_is_one_build(ctx, model, ort_sess, rng):
    """Batch and sequence vary on every run; the cache is empty: one build serves them all, and
    one more per pattern of sizes 1 (fixed to 1 in that build: dynamic/capacity.py)."""
    sess = mltensor.InferenceSession(model, ctx)
    names = [o.name for o in sess.get_outputs()]

    def check(batch, seq):
        f = _feeds(rng.integers(0, V, (batch, seq)), batch=batch)
        got = dict(zip(names, sess.run(None, f)))
        want = dict(zip(names, ort_sess.run(None, f)))
        for n in names:
            assert got[n].shape == want[n].shape, n
            np.testing.assert_allclose(got[n], want[n], rtol=1e-4, atol=1e-4, err_msg=n)

    for batch, seq in [(2, 7), (3, 16), (2, 33), (4, 2), (3, 3)]:
        check(batch, seq)
    st = sess.stats
    assert st["dynamic"] and st["builds"] == 1, st
    assert sess.dynamic_dimensions["sequence"] >= 33
    for batch, seq in [(1, 4), (1, 9), (2, 1), (5, 1), (1, 1)]:  # batch 1; sequence 1; both
        check(batch, seq)
    assert sess.stats["builds"] == 4


def test_decode_loop_numpy_matches_onnxruntime(ctx, model, ort_sess):
    """40 greedy steps feeding present.* back as past_key_values.* (numpy in and out, as an
    onnxruntime user writes it): same tokens, logits within 1e-4, two builds (the empty-cache
    first step and every later one)."""
    sess = mltensor.InferenceSession(model, ctx, max_dimensions={"past_sequence": 64})
    names = [o.name for o in sess.get_outputs()]
    f_ours = f_ref = _feeds([[1, 2, 3, 4]])
    toks_ours, toks_ref = [], []
    for step in range(40):
        ours = dict(zip(names, sess.run(None, f_ours)))
        ref = dict(zip(names, ort_sess.run(None, f_ref)))
        np.testing.assert_allclose(ours["logits"], ref["logits"], rtol=1e-4, atol=1e-4, err_msg=f"step {step}")
        toks_ours.append(int(ours["logits"][0, -1].argmax()))
        toks_ref.append(int(ref["logits"][0, -1].argmax()))
        f_ours = _feeds([[toks_ours[-1]]], ours)
        f_ref = _feeds([[toks_ref[-1]]], ref)
    assert toks_ours == toks_ref
    assert sess.stats["builds"] == 2, sess.stats


def test_decode_loop_on_the_gpu(ctx, model, ort_sess):
    """examples/generate.py: ml-tensor outputs fed back, the next token chosen on the GPU. Per
    decode step nothing is uploaded, 8 bytes (the token) come down, nothing is allocated, and
    the tokens are onnxruntime's."""
    sess = mltensor.InferenceSession(model, ctx, max_dimensions={"past_sequence": 128})
    tokens, steps, _ = generate.generate(sess, [5, 6, 7], 36)
    ref, _ = generate.reference(model, [5, 6, 7], 36)
    assert tokens == ref
    for s in steps[3:]:  # steady state: step 1 builds for a non-empty cache, step 2 makes the
        # second set of cache tensors the loop alternates with
        assert s == {"bytes_uploaded": 0, "bytes_downloaded": 8, "tensors_alive": 0}, steps
    assert sess.stats["builds"] == 2


def test_decode_loop_on_the_gpu_outgrows_its_capacity(ctx, model, ort_sess):
    """examples/generate.py without max_dimensions: the cache crosses the first capacity (64)
    while each step feeds the last step's ml-tensor outputs; the rebuild keeps the build it
    replaces (whose outputs this step reads) until the step ends."""
    sess = mltensor.InferenceSession(model, ctx)
    tokens, _, _ = generate.generate(sess, list(range(5, 65)), 8)
    ref, _ = generate.reference(model, list(range(5, 65)), 8)
    assert tokens == ref
    assert sess.dynamic_dimensions["past_sequence"] == 128


def test_capacity_grows_by_doubling(ctx, model, ort_sess):
    """Without max_dimensions a dimension's buffers start at the first size (rounded up to a
    power of two, at least 64) and double when outgrown: O(log n) builds for n steps."""
    sess = mltensor.InferenceSession(model, ctx)
    names = [o.name for o in sess.get_outputs()]
    f = _feeds([list(range(60))])
    for step in range(12):  # past grows 60 -> 71: crosses 64 once
        out = dict(zip(names, sess.run(None, f)))
        f = _feeds([[int(out["logits"][0, -1].argmax())]], out)
    ref = dict(zip(names, ort_sess.run(None, f)))
    np.testing.assert_allclose(sess.run(None, f)[0], ref["logits"], rtol=1e-4, atol=1e-4)
    assert sess.dynamic_dimensions["past_sequence"] == 128
    assert sess.stats["builds"] == 3  # empty cache; past <= 64; past <= 128


def test_dynamic_and_static_builds_agree(ctx, model, rng):
    dyn = mltensor.InferenceSession(model, ctx)
    static = mltensor.InferenceSession(model, ctx, dynamic=False)
    past = {
        f"present.{i}.{k}": rng.standard_normal((2, H, 5, D)).astype(np.float32)
        for i in range(L)
        for k in ("key", "value")
    }
    f = _feeds(rng.integers(0, V, (2, 3)), past)
    for a, b in zip(dyn.run(None, f), static.run(None, f)):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5)
    assert dyn.stats["dynamic"] and not static.stats["dynamic"]


def test_bad_sizes_raise_type_errors(ctx, model, rng):
    sess = mltensor.InferenceSession(model, ctx, max_dimensions={"past_sequence": 8})
    past = {f"present.{i}.{k}": np.zeros((1, H, 9, D), np.float32) for i in range(L) for k in ("key", "value")}
    with pytest.raises(TypeError, match=r"'past_sequence' is 9, above max_dimensions\['past_sequence'\] = 8"):
        sess.run(None, _feeds([[1]], past))
    past = {f"present.{i}.{k}": np.zeros((2, H, 3, D), np.float32) for i in range(L) for k in ("key", "value")}
    with pytest.raises(TypeError, match="dimension 'batch'"):
        sess.run(None, _feeds([[1]], past))  # batch 1 in input_ids, 2 in the cache
    with pytest.raises(TypeError, match="max_dimensions names"):
        mltensor.InferenceSession(model, ctx, max_dimensions={"nope": 3})
    # the session still works
    past = {f"present.{i}.{k}": np.zeros((1, H, 3, D), np.float32) for i in range(L) for k in ("key", "value")}
    assert sess.run(None, _feeds([[1]], past))[0].shape == (1, 1, V)


def test_past_names():
    assert past_names(["input_ids", "past_key_values.0.key"]) == [("past_key_values.0.key", "present.0.key")]


def test_decode_loop_with_attention_mask(ctx, rng):
    """An attention_mask input of its own dimension ("past_sequence + sequence") unifies with the
    scores' past + sequence when broadcast: one dynamic build, checked at each dispatch; masked
    positions (a padded prompt) match onnxruntime."""
    model = tiny_gpt2(layers=L, heads=H, head_size=D, vocab=V, attention_mask=True)
    ref_sess = ort.InferenceSession(model, providers=["CPUExecutionProvider"])
    sess = mltensor.InferenceSession(model, ctx, max_dimensions={"past_sequence": 64})
    names = [o.name for o in sess.get_outputs()]
    mask = np.array([[0, 1, 1, 1, 1], [1, 1, 1, 1, 1]], np.int64)  # the first prompt left-padded
    f_ours = f_ref = dict(_feeds(rng.integers(0, V, (2, 5)), batch=2), attention_mask=mask)
    for step in range(10):
        ours = dict(zip(names, sess.run(None, f_ours)))
        ref = dict(zip(names, ref_sess.run(None, f_ref)))
        np.testing.assert_allclose(ours["logits"], ref["logits"], rtol=1e-4, atol=1e-4, err_msg=f"step {step}")
        nxt = ref["logits"][:, -1].argmax(-1).reshape(2, 1)
        mask = np.concatenate([mask, np.ones((2, 1), np.int64)], 1)
        f_ours = dict(_feeds(nxt, ours), attention_mask=mask)
        f_ref = dict(_feeds(nxt, ref), attention_mask=mask)
    assert sess.stats["dynamic"] and sess.stats["builds"] == 2, sess.stats
    with pytest.raises(TypeError, match="must be equal"):  # a mask one position short
        sess.run(None, dict(f_ours, attention_mask=mask[:, 1:]))
