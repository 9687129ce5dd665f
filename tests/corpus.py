"""A corpus of real model exports: transformers, torchvision and timm models built from their
configurations with seeded random weights, exported by `torch.onnx.export` (the TorchScript
exporter, `dynamo=False`, and the dynamo exporter, `dynamo=True`), generated on first use and
cached under `<cache dir>/corpus/<key>/`, never in the repository. The key names the versions of
torch, torchvision, transformers, timm and onnxscript (the dynamo exporter's translator) and a
digest of this file, so a new release or a changed builder exports again.

`CASES` maps a name to a `Case`: its builder (`build(big)` -> `Export`, a module with its input
and output names and dynamic axes), its input maker (`inputs(rng, size, big)` -> numpy feeds) and
the two input sizes a test runs in one session (`sizes`, and `big_sizes` for the real-size
configuration). `export(name, exporter, big)` returns the .onnx path. tests/test_corpus.py checks
every case against onnxruntime; bench/ imports this module the way it imports tests' helpers
(`sys.path.insert(0, <repo>/tests)`; `import corpus`).

torch and transformers are imported at first use only: importing this module needs neither.
"""

import dataclasses
import hashlib
import importlib.metadata
import os
import subprocess
import sys
import tempfile

import numpy as np

from mltensor._xdg import cache_dir

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # models from configurations only: never the hub
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")

EXPORTERS = ("torchscript", "dynamo")
OPSET = 17  # the TorchScript exporter's; the dynamo exporter writes its own (18+)


@dataclasses.dataclass
class Export:
    """What torch.onnx.export takes: the module (eval mode), example inputs (torch tensors, in
    `input_names` order) and the dynamic axes of every input and output."""

    module: object
    args: tuple
    input_names: list
    output_names: list
    dynamic_axes: dict


@dataclasses.dataclass
class Case:
    name: str
    family: str  # transformers / torchvision / timm
    build: object  # build(big) -> Export
    inputs: object  # inputs(rng, size, big) -> {name: np.ndarray}
    sizes: tuple  # two sizes, run in one session
    big_sizes: tuple = None  # the real-size configuration's (None: no real-size case)
    layers: int = None  # transformer layers of the small configuration (launches per layer)
    export_size: object = None  # the size traced (default: a third size, neither of `sizes`)


CASES = {}


def case(name, family, sizes, big_sizes=None, layers=None, export_size=None):
    def deco(fn):
        build, inputs = fn()
        CASES[name] = Case(name, family, build, inputs, sizes, big_sizes, layers, export_size)
        return fn

    return deco


# -- the cache ------------------------------------------------------------------------------------


def versions():
    """The versions the exports depend on (None: not installed)."""
    out = {}
    for pkg in ("torch", "torchvision", "transformers", "timm", "onnxscript"):
        try:
            out[pkg] = importlib.metadata.version(pkg)
        except importlib.metadata.PackageNotFoundError:
            out[pkg] = None
    return out


with open(__file__, "rb") as _f:  # the builders this process runs (read once: the file may change)
    _DIGEST = hashlib.sha256(_f.read()).hexdigest()[:10]


def cache_key():
    """The versions of the exporting packages and a digest of this file, as a directory name."""
    v = versions()
    return "-".join(f"{k}{v[k]}" for k in sorted(v) if v[k]) + f"-{_DIGEST}"


def corpus_dir():
    return os.path.join(cache_dir(), "corpus", cache_key())


class ExportError(RuntimeError):
    """The exporter failed on this case (the message is its error's last line); remembered in the
    cache so later runs do not export again."""


def _paths(name, exporter, big):
    stem = os.path.join(corpus_dir(), f"{name}-{exporter}{'-big' if big else ''}")
    return stem + ".onnx", stem + ".error"


def export(name, exporter="torchscript", big=False):
    """The path of case `name` exported by `exporter` ("torchscript" or "dynamo"), at the small
    configuration or the real size (big=True): exported on first use, then read from the cache.
    Raises ExportError when the exporter fails (then and on every later call)."""
    prepare([(name, exporter, big)])
    path, err = _paths(name, exporter, big)
    if os.path.exists(path):
        return path
    with open(err) as f:
        raise ExportError(f.read())


def prepare(keys):
    """Export every (name, exporter, big) of `keys` not in the cache yet, all in one child
    process: torch stays out of the caller's process (importing torch._dynamo's triton after
    lavapipe has loaded its LLVM crashes the process), and one import of torch serves them all."""
    missing = []
    for name, exporter, big in keys:
        if name not in CASES:
            raise KeyError(f"no corpus case {name!r}; cases: {', '.join(CASES)}")
        if exporter not in EXPORTERS:
            raise ValueError(f"exporter must be one of {EXPORTERS}, got {exporter!r}")
        if not any(os.path.exists(p) for p in _paths(name, exporter, big)):
            missing.append(f"{name}:{exporter}:{int(big)}")
    if not missing:
        return
    r = subprocess.run([sys.executable, os.path.abspath(__file__), *missing], capture_output=True, text=True)
    if r.returncode != 0:
        raise RuntimeError(f"the corpus export process failed ({r.returncode}):\n{r.stderr[-4000:]}")


def _export_here(name, exporter, big):
    """Export one case in this process (the child process prepare() starts)."""
    path, err = _paths(name, exporter, big)
    if os.path.exists(path) or os.path.exists(err):
        return
    os.makedirs(os.path.dirname(path), exist_ok=True)
    import torch

    torch.manual_seed(0)
    e = CASES[name].build(big)
    with torch.no_grad():  # zero-initialized weights (torchvision's ViT head) would make outputs vacuous
        for p in e.module.parameters():
            if p.ndim >= 2 and not p.any():
                p.normal_(0.0, 0.02)
    fd, tmp = tempfile.mkstemp(suffix=".onnx", dir=os.path.dirname(path))
    os.close(fd)
    try:
        _torch_export(torch, e, tmp, exporter)
    except Exception as ex:  # the exporter's failure is a finding: remember it
        os.unlink(tmp)
        with open(err + ".tmp", "w") as f:
            f.write(_one_line(ex))
        os.replace(err + ".tmp", err)
        return
    os.replace(tmp, path)


def _one_line(ex):
    """The innermost cause's type and first line: what the exporter actually objected to."""
    outer = type(ex).__name__
    while ex.__cause__ is not None:
        ex = ex.__cause__
    lines = [s.strip() for s in str(ex).splitlines() if s.strip()]
    inner = f"{type(ex).__name__}: {lines[0] if lines else ''}"
    return (inner if outer == type(ex).__name__ else f"{outer} <- {inner}")[:400]


def _torch_export(torch, e, path, exporter):
    import warnings

    # not under torch.no_grad(): nn.MultiheadAttention would take its fused fast path
    # (aten::_native_multi_head_attention), which the TorchScript exporter cannot write
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        if exporter == "torchscript":
            torch.onnx.export(
                e.module,
                e.args,
                path,
                input_names=e.input_names,
                output_names=e.output_names,
                dynamic_axes=e.dynamic_axes,
                opset_version=OPSET,
                dynamo=False,
            )
        else:
            dims = {}
            shapes = tuple(
                {ax: dims.setdefault(n, torch.export.Dim(n)) for ax, n in e.dynamic_axes.get(name, {}).items()} or None
                for name in e.input_names
            )
            prog = torch.onnx.export(
                e.module,
                e.args,
                input_names=e.input_names,
                output_names=e.output_names,
                dynamic_shapes=(shapes,),  # forward(*args): one tuple for the varargs
                dynamo=True,
                verbose=False,
                report=False,
            )
            prog.save(path, external_data=False)


def feeds(name, size, big=False, seed=0):
    """The numpy inputs of case `name` at `size` (seeded)."""
    return CASES[name].inputs(np.random.default_rng(seed), size, big)


def rel_error(got, want):
    """max|got - want| / max|want| over the whole output (0 for an all-zero reference compared
    exactly); NaN or inf where the reference has none counts as inf."""
    got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
    if not np.array_equal(np.isfinite(got), np.isfinite(want)):
        return float("inf")
    fin = np.isfinite(want)
    diff = float(np.max(np.abs(got[fin] - want[fin]), initial=0.0))
    scale = float(np.max(np.abs(want[fin]), initial=0.0))
    return diff / scale if scale else (0.0 if diff == 0 else float("inf"))


def check(name, exporter="torchscript", big=False, context=None):
    """Run case `name` in one mltensor InferenceSession at both its sizes and onnxruntime CPU on
    the same feeds. Returns {"path", "sizes": [{"size", "error", "launches"}], "layers"}: the
    largest rel_error over the outputs at each size and the kernel launches one run makes (the
    context's counter around a second run at that size, after the build). Shapes and dtypes are
    asserted equal; the caller judges the error."""
    import onnxruntime as ort

    from mltensor import InferenceSession

    c = CASES[name]
    path = export(name, exporter, big)
    ref = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
    sess = InferenceSession(path, context)
    ctx = sess.context
    out = {"path": path, "layers": None if big else c.layers, "sizes": []}
    try:
        for size in c.big_sizes if big else c.sizes:
            f = feeds(name, size, big)
            want = ref.run(None, f)
            got = sess.run(None, f)
            before = ctx.counters["kernel_launches"]
            sess.run(None, f)
            launches = ctx.counters["kernel_launches"] - before
            assert len(got) == len(want), f"{name}: {len(got)} outputs, onnxruntime gives {len(want)}"
            err = 0.0
            for o, g, w in zip(ref.get_outputs(), got, want):
                assert np.any(w), f"{name} {o.name} at {size}: onnxruntime's output is all zeros (a vacuous check)"
                assert g.shape == w.shape, f"{name} {o.name} at {size}: shape {g.shape}, onnxruntime {w.shape}"
                assert g.dtype == w.dtype, f"{name} {o.name} at {size}: dtype {g.dtype}, onnxruntime {w.dtype}"
                err = max(err, rel_error(g, w))
            out["sizes"].append({"size": size, "error": err, "launches": launches})
    finally:
        sess.close()
    return out


def _wrap(fn, model):
    """An nn.Module whose forward(*tensors) is fn(model, *tensors): positional inputs in the
    exported order, plain tensors (tuples) out."""
    import torch

    class Wrapper(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.m = model

        def forward(self, *args):
            return fn(self.m, *args)

    return Wrapper().eval()


def _torch_args(c, big, names):
    import torch

    size = c.export_size or _third(c.big_sizes if big else c.sizes)
    f = c.inputs(np.random.default_rng(1), size, big)
    return tuple(torch.from_numpy(f[n]) for n in names)


def _third(sizes):
    """A traced size neither test size uses: past the larger on every axis the two differ on."""
    a, b = sizes
    if isinstance(a, int):
        return max(a, b) + 1
    return tuple(max(x, y) + (0 if x == y else 16 if max(x, y) >= 16 else 1) for x, y in zip(a, b))


def _axes(spec):
    """{"input_ids": "batch seq"} -> {"input_ids": {0: "batch", 1: "seq"}} ("_" skips an axis)."""
    return {k: {i: n for i, n in enumerate(v.split()) if n != "_"} for k, v in spec.items()}


# -- inputs ---------------------------------------------------------------------------------------


def _tokens(rng, b, s, vocab, mask=True):
    ids = rng.integers(3, vocab, (b, s)).astype(np.int64)
    if not mask:
        return {"input_ids": ids}
    am = np.ones((b, s), np.int64)
    am[0, max(1, s - 2) :] = 0  # right padding on the first row: no query sees no key
    return {"input_ids": ids, "attention_mask": am}


def _image(rng, b, c, h, w=None):
    return {"pixel_values": rng.standard_normal((b, c, h, w or h)).astype(np.float32)}


# -- transformers ---------------------------------------------------------------------------------


def _hf_encoder(model_cls, cfg_small, cfg_big, out=("last_hidden_state",), mask=True):
    def build(big):
        m = model_cls(cfg_big() if big else cfg_small()).eval()
        names = ["input_ids", "attention_mask"] if mask else ["input_ids"]

        def fwd(m, *a):
            r = m(**dict(zip(names, a)))
            return tuple(getattr(r, o) for o in out)

        axes = _axes({n: "batch seq" for n in names} | {o: "batch seq" for o in out if o == "last_hidden_state"})
        axes |= _axes({o: "batch" for o in out if o != "last_hidden_state"})
        return Export(_wrap(fwd, m), None, names, list(out), axes)

    return build


def _with_args(build, case_name):
    """Fill Export.args from the case's own input maker at the traced size."""

    def b(big):
        e = build(big)
        e.args = _torch_args(CASES[case_name], big, e.input_names)
        return e

    return b


def _text_case(name, cls_name, small, big, out=("last_hidden_state",), layers=2, mask=True, vocab=128, big_vocab=None):
    @case(name, "transformers", sizes=((1, 5), (2, 11)), big_sizes=((1, 16), (2, 64)), layers=layers)
    def _():
        def build(big_):
            import transformers

            cls = getattr(transformers, cls_name)
            return _hf_encoder(cls, small, big, out, mask)(big_)

        def inputs(rng, size, big_):
            return _tokens(rng, *size, big_vocab if big_ and big_vocab else vocab, mask)

        return _with_args(build, name), inputs


def _cfg(cls_name, **kw):
    def make():
        import transformers

        return getattr(transformers, cls_name)(**kw)

    return make


SMALL_BERT = dict(
    vocab_size=128,
    hidden_size=32,
    num_hidden_layers=2,
    num_attention_heads=4,
    intermediate_size=64,
    max_position_embeddings=128,
)
_text_case("bert", "BertModel", _cfg("BertConfig", **SMALL_BERT), _cfg("BertConfig"), big_vocab=30522)
_text_case(
    "roberta",
    "RobertaModel",
    _cfg("RobertaConfig", **SMALL_BERT | {"max_position_embeddings": 130}),
    _cfg("RobertaConfig"),
    big_vocab=50265,
)
_text_case(
    "distilbert",
    "DistilBertModel",
    _cfg("DistilBertConfig", vocab_size=128, dim=32, n_layers=2, n_heads=4, hidden_dim=64, max_position_embeddings=128),
    _cfg("DistilBertConfig"),
    big_vocab=30522,
)
_text_case(
    "t5_encoder",
    "T5EncoderModel",
    _cfg(
        "T5Config",
        vocab_size=128,
        d_model=32,
        d_kv=8,
        d_ff=64,
        num_layers=2,
        num_heads=4,
        relative_attention_num_buckets=8,
        relative_attention_max_distance=16,
    ),
    _cfg("T5Config"),  # t5-small
    big_vocab=32128,
)
_text_case(
    "clip_text",
    "CLIPTextModel",
    _cfg(
        "CLIPTextConfig",
        vocab_size=128,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        max_position_embeddings=77,
    ),
    _cfg("CLIPTextConfig"),
    out=("last_hidden_state", "pooler_output"),
    big_vocab=49408,
)

# decoder-only language models: logits of a prefill (no cache), and GPT-2 / Llama decode steps
# with past key values in and present key values out
SMALL_LM = dict(
    vocab_size=128,
    hidden_size=32,
    intermediate_size=64,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=128,
)
# name -> (model class, small configuration, its (vocab, layers, key/value heads, head size)): the
# input makers read the tuple, never the configuration (transformers stays out of this process)
LMS = {
    "gpt2": (
        "GPT2LMHeadModel",
        _cfg("GPT2Config", vocab_size=128, n_embd=32, n_layer=2, n_head=4, n_positions=128),
        (128, 2, 4, 8),
    ),
    "llama": ("LlamaForCausalLM", _cfg("LlamaConfig", **SMALL_LM), (128, 2, 2, 8)),
    "qwen2": ("Qwen2ForCausalLM", _cfg("Qwen2Config", **SMALL_LM), (128, 2, 2, 8)),
    "phi3": ("Phi3ForCausalLM", _cfg("Phi3Config", **SMALL_LM | {"pad_token_id": 0}), (128, 2, 2, 8)),
    "mistral": ("MistralForCausalLM", _cfg("MistralConfig", **SMALL_LM | {"sliding_window": None}), (128, 2, 2, 8)),
}
BIG_LMS = {
    "gpt2": (_cfg("GPT2Config"), (50257, 12, 12, 64)),  # GPT-2 small, 124M
    # SmolLM2-135M's shape (a Llama): hidden 576, 30 layers, 9 heads, 3 key/value heads
    "llama": (
        _cfg(
            "LlamaConfig",
            vocab_size=49152,
            hidden_size=576,
            intermediate_size=1536,
            num_hidden_layers=30,
            num_attention_heads=9,
            num_key_value_heads=3,
            max_position_embeddings=2048,
            tie_word_embeddings=True,
        ),
        (49152, 30, 3, 64),
    ),
}


def _lm_case(name, past):
    cls_name, small, small_shape = LMS[name]
    big, big_shape = BIG_LMS.get(name, (None, None))
    key = f"{name}_past" if past else name

    def cfg(big_):
        return (big if big_ else small)()

    def build(big_):
        import transformers

        c = cfg(big_)
        m = getattr(transformers, cls_name)(c).eval()
        if not past:
            names = ["input_ids", "attention_mask"]
            e = Export(
                _wrap(lambda m, i, a: (m(input_ids=i, attention_mask=a, use_cache=False).logits,), m),
                None,
                names,
                ["logits"],
                _axes({"input_ids": "batch seq", "attention_mask": "batch seq", "logits": "batch seq"}),
            )
        else:
            n = c.num_hidden_layers
            kv = [f"past_key_values.{i}.{w}" for i in range(n) for w in ("key", "value")]
            present = [f"present.{i}.{w}" for i in range(n) for w in ("key", "value")]
            names = ["input_ids", "attention_mask", *kv]

            def fwd(m, ids, am, *pkv):
                cache = transformers.DynamicCache([(pkv[2 * i], pkv[2 * i + 1]) for i in range(n)])
                r = m(input_ids=ids, attention_mask=am, past_key_values=cache, use_cache=True)
                outs = [r.logits]
                for layer in r.past_key_values.layers:
                    outs += [layer.keys, layer.values]
                return tuple(outs)

            axes = {"input_ids": "batch seq", "attention_mask": "batch total", "logits": "batch seq"}
            axes |= {k: "batch _ past _" for k in kv} | {p: "batch _ total _" for p in present}
            e = Export(_wrap(fwd, m), None, names, ["logits", *present], _axes(axes))
        e.args = _torch_args(CASES[key], big_, e.input_names)
        return e

    def inputs(rng, size, big_):
        vocab, layers, heads, hd = big_shape if big_ else small_shape
        if not past:
            return _tokens(rng, *size, vocab)
        b, p, s = size
        f = _tokens(rng, b, s, vocab, mask=False)
        f["attention_mask"] = np.ones((b, p + s), np.int64)
        for i in range(layers):
            for w in ("key", "value"):
                f[f"past_key_values.{i}.{w}"] = rng.standard_normal((b, heads, p, hd)).astype(np.float32)
        return f

    sizes = ((1, 4, 1), (2, 9, 1)) if past else ((1, 5), (2, 11))
    big_sizes = ((1, 16, 1), (1, 100, 1)) if past else ((1, 16), (1, 100))
    CASES[key] = Case(key, "transformers", build, inputs, sizes, big_sizes if big else None, small_shape[1])


for _n in LMS:
    _lm_case(_n, past=False)
for _n in ("gpt2", "llama"):
    _lm_case(_n, past=True)


@case("t5_decoder", "transformers", sizes=((1, 3, 5), (2, 6, 9)), big_sizes=((1, 8, 32), (2, 16, 64)), layers=2)
def _():
    small = _cfg(
        "T5Config",
        vocab_size=128,
        d_model=32,
        d_kv=8,
        d_ff=64,
        num_layers=2,
        num_heads=4,
        relative_attention_num_buckets=8,
        relative_attention_max_distance=16,
    )

    def build(big):
        import transformers

        c = transformers.T5Config() if big else small()
        m = transformers.T5ForConditionalGeneration(c).eval()

        def fwd(m, ids, enc, enc_mask):
            h = m.decoder(input_ids=ids, encoder_hidden_states=enc, encoder_attention_mask=enc_mask).last_hidden_state
            return (m.lm_head(h),)

        names = ["decoder_input_ids", "encoder_hidden_states", "encoder_attention_mask"]
        axes = _axes(
            {
                "decoder_input_ids": "batch seq",
                "encoder_hidden_states": "batch enc _",
                "encoder_attention_mask": "batch enc",
                "logits": "batch seq",
            }
        )
        e = Export(_wrap(fwd, m), None, names, ["logits"], axes)
        e.args = _torch_args(CASES["t5_decoder"], big, names)
        return e

    def inputs(rng, size, big):
        b, s, t = size
        d, vocab = (512, 32128) if big else (32, 128)
        am = np.ones((b, t), np.int64)
        am[0, t - 2 :] = 0
        return {
            "decoder_input_ids": rng.integers(0, vocab, (b, s)).astype(np.int64),
            "encoder_hidden_states": rng.standard_normal((b, t, d)).astype(np.float32),
            "encoder_attention_mask": am,
        }

    return build, inputs


WHISPER_SMALL = dict(
    vocab_size=128,
    num_mel_bins=16,
    d_model=32,
    encoder_layers=2,
    decoder_layers=2,
    encoder_attention_heads=4,
    decoder_attention_heads=4,
    encoder_ffn_dim=64,
    decoder_ffn_dim=64,
    max_source_positions=16,
    max_target_positions=64,
    pad_token_id=0,
    bos_token_id=1,
    eos_token_id=2,
    decoder_start_token_id=1,
)


# whisper-tiny's shape: 4+4 layers of 384, 80 mel bins, 1500 source positions
WHISPER_BIG = dict(vocab_size=51865, num_mel_bins=80, d_model=384, max_source_positions=1500)


def _whisper_cfg(big):
    import transformers

    return transformers.WhisperConfig(**(WHISPER_BIG if big else WHISPER_SMALL))


@case("whisper_encoder", "transformers", sizes=(1, 2), big_sizes=(1, 2), layers=2)
def _():
    def build(big):
        import transformers

        m = transformers.WhisperModel(_whisper_cfg(big)).eval()
        names = ["input_features"]
        axes = _axes({"input_features": "batch", "last_hidden_state": "batch"})
        e = Export(_wrap(lambda m, x: (m.encoder(x).last_hidden_state,), m), None, names, ["last_hidden_state"], axes)
        e.args = _torch_args(CASES["whisper_encoder"], big, names)
        return e

    def inputs(rng, b, big):
        c = WHISPER_BIG if big else WHISPER_SMALL  # the encoder takes exactly 2 * max_source_positions frames
        return {
            "input_features": rng.standard_normal((b, c["num_mel_bins"], 2 * c["max_source_positions"])).astype(
                np.float32
            )
        }

    return build, inputs


@case(
    "whisper_decoder", "transformers", sizes=((1, 3, 8), (2, 6, 16)), big_sizes=((1, 4, 1500), (2, 9, 1500)), layers=2
)
def _():
    def build(big):
        import transformers

        m = transformers.WhisperForConditionalGeneration(_whisper_cfg(big)).eval()

        def fwd(m, ids, enc):
            h = m.model.decoder(input_ids=ids, encoder_hidden_states=enc).last_hidden_state
            return (m.proj_out(h),)

        names = ["decoder_input_ids", "encoder_hidden_states"]
        axes = _axes({"decoder_input_ids": "batch seq", "encoder_hidden_states": "batch enc _", "logits": "batch seq"})
        e = Export(_wrap(fwd, m), None, names, ["logits"], axes)
        e.args = _torch_args(CASES["whisper_decoder"], big, names)
        return e

    def inputs(rng, size, big):
        c = WHISPER_BIG if big else WHISPER_SMALL
        b, s, t = size
        return {
            "decoder_input_ids": rng.integers(0, c["vocab_size"], (b, s)).astype(np.int64),
            "encoder_hidden_states": rng.standard_normal((b, t, c["d_model"])).astype(np.float32),
        }

    return build, inputs


def _vision_case(name, cls_name, small, big, out=("last_hidden_state",), image=32, big_image=224):
    @case(name, "transformers", sizes=(1, 2), big_sizes=(1, 2), layers=2)
    def _():
        def build(big_):
            import transformers

            m = getattr(transformers, cls_name)((big if big_ else small)()).eval()
            axes = _axes({"pixel_values": "batch"} | {o: "batch" for o in out})

            def fwd(m, x):
                r = m(pixel_values=x)
                return tuple(getattr(r, o) for o in out)

            e = Export(_wrap(fwd, m), None, ["pixel_values"], list(out), axes)
            e.args = _torch_args(CASES[name], big_, e.input_names)
            return e

        def inputs(rng, b, big_):
            return _image(rng, b, 3, big_image if big_ else image)

        return build, inputs


SMALL_VIT = dict(
    hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64, image_size=32, patch_size=8
)
_vision_case(
    "vit", "ViTModel", _cfg("ViTConfig", **SMALL_VIT), _cfg("ViTConfig"), out=("last_hidden_state", "pooler_output")
)
_vision_case(
    "clip_vision",
    "CLIPVisionModel",
    _cfg("CLIPVisionConfig", **SMALL_VIT),
    _cfg("CLIPVisionConfig", patch_size=16),
    out=("last_hidden_state", "pooler_output"),
)


@case("wav2vec2", "transformers", sizes=((1, 400), (2, 720)), big_sizes=((1, 16000), (2, 24000)), layers=2)
def _():
    def build(big):
        import transformers

        if big:
            c = transformers.Wav2Vec2Config()  # wav2vec2-base
        else:
            c = transformers.Wav2Vec2Config(
                vocab_size=32,
                hidden_size=32,
                num_hidden_layers=2,
                num_attention_heads=4,
                intermediate_size=64,
                conv_dim=(16, 16, 16),
                conv_stride=(5, 2, 2),
                conv_kernel=(10, 3, 3),
                num_conv_pos_embeddings=16,
                num_conv_pos_embedding_groups=4,
            )
        m = transformers.Wav2Vec2Model(c).eval()
        axes = _axes({"input_values": "batch samples", "last_hidden_state": "batch frames"})
        e = Export(
            _wrap(lambda m, x: (m(input_values=x).last_hidden_state,), m),
            None,
            ["input_values"],
            ["last_hidden_state"],
            axes,
        )
        e.args = _torch_args(CASES["wav2vec2"], big, e.input_names)
        return e

    def inputs(rng, size, big):
        b, t = size
        return {"input_values": rng.standard_normal((b, t)).astype(np.float32)}

    return build, inputs


# -- torchvision and timm -------------------------------------------------------------------------


def _image_case(name, family, make, sizes, big_sizes=None, out="logits", video=False, side=32):
    """make(big) -> nn.Module taking NCHW (NCTHW for video) float32; sizes are (batch, side) or, for
    a model of one input size (`side`, 224 at real size), (batch,) pairs; video: (batch, frames, side)."""

    @case(name, family, sizes=sizes, big_sizes=big_sizes)
    def _():
        def build(big):
            m = make(big).eval()
            size = sizes[0] if not big else big_sizes[0]
            if video:
                axes = {"video": {0: "batch", 2: "frames"}, out: {0: "batch"}}
            elif len(size) == 2:
                axes = {"pixel_values": {0: "batch", 2: "height", 3: "width"}, out: {0: "batch"}}
            else:
                axes = {"pixel_values": {0: "batch"}, out: {0: "batch"}}
            if out == "out":  # segmentation: the logits map is the input's size
                axes[out] = {0: "batch", 2: "height", 3: "width"}
            inp = "video" if video else "pixel_values"

            def fwd(m, x):
                r = m(x)
                return (r["out"] if isinstance(r, dict) else r,)

            e = Export(_wrap(fwd, m), None, [inp], [out], axes)
            e.args = _torch_args(CASES[name], big, e.input_names)
            return e

        def inputs(rng, size, big):
            if video:
                b, t, s = size
                return {"video": rng.standard_normal((b, 3, t, s, s)).astype(np.float32)}
            if len(size) == 2:
                return _image(rng, size[0], 3, size[1])
            return _image(rng, size[0], 3, 224 if big else side)

        return build, inputs


def _tv(fn_name, **kw):
    def make(big=False):
        import torchvision.models.segmentation
        import torchvision.models.video

        mod = torchvision.models
        if "lraspp" in fn_name:
            mod = torchvision.models.segmentation
        elif not hasattr(mod, fn_name):  # (r3d_18: in torchvision.models.video only)
            mod = torchvision.models.video
        return getattr(mod, fn_name)(weights=None, **kw)

    return make


def _tv_small(small, big_name, **big_kw):
    def make(big):
        return _tv(big_name, **big_kw)(big) if big else small()

    return make


def _tv_vit():
    from torchvision.models.vision_transformer import VisionTransformer

    return VisionTransformer(
        image_size=32, patch_size=8, num_layers=2, num_heads=2, hidden_dim=32, mlp_dim=64, num_classes=10
    )


def _tv_swin():
    from torchvision.models.swin_transformer import SwinTransformer

    return SwinTransformer(
        patch_size=[4, 4],
        embed_dim=16,
        depths=[2, 2],
        num_heads=[2, 4],
        window_size=[4, 4],
        stochastic_depth_prob=0.0,
        num_classes=10,
    )


def _tv_maxvit():
    from torchvision.models.maxvit import MaxVit

    return MaxVit(
        input_size=(32, 32),
        stem_channels=8,
        partition_size=2,
        block_channels=[16, 32],
        block_layers=[1, 1],
        head_dim=8,
        stochastic_depth_prob=0.0,
        num_classes=10,
    )


def _tv_convnext():
    from torchvision.models.convnext import CNBlockConfig, ConvNeXt

    return ConvNeXt([CNBlockConfig(16, 32, 2), CNBlockConfig(32, None, 2)], stochastic_depth_prob=0.0, num_classes=10)


def _tv_efficientnet():
    from torchvision.models.efficientnet import EfficientNet, MBConvConfig

    setting = [
        MBConvConfig(1, 3, 1, 8, 8, 1),
        MBConvConfig(6, 3, 2, 8, 16, 2),
        MBConvConfig(6, 5, 2, 16, 24, 1),
    ]
    return EfficientNet(setting, dropout=0.0, num_classes=10)


def _tv_regnet():
    from torchvision.models.regnet import BlockParams, RegNet

    p = BlockParams.from_init_params(depth=4, w_0=16, w_a=8.0, w_m=2.0, group_width=8, se_ratio=0.25)
    return RegNet(p, stem_width=8, num_classes=10)


def _tv_video():
    from torchvision.models.video.resnet import BasicBlock, BasicStem, Conv3DSimple, VideoResNet

    return VideoResNet(BasicBlock, [Conv3DSimple] * 4, [1, 1, 1, 1], BasicStem, num_classes=10)


IMG = ((1, 32), (2, 48))  # (batch, side): two image sizes in one session
BIG_IMG = ((1, 224), (2, 256))
FIXED = ((1,), (2,))  # models of one image size: two batch sizes
_image_case("tv_vit", "torchvision", _tv_small(_tv_vit, "vit_b_16"), FIXED, FIXED)
_image_case("tv_swin", "torchvision", _tv_small(_tv_swin, "swin_t"), IMG, BIG_IMG)
_image_case("tv_maxvit", "torchvision", _tv_small(_tv_maxvit, "maxvit_t"), FIXED, FIXED)
_image_case("tv_convnext", "torchvision", _tv_small(_tv_convnext, "convnext_tiny"), IMG, BIG_IMG)
_image_case("tv_efficientnet", "torchvision", _tv_small(_tv_efficientnet, "efficientnet_b0"), IMG, BIG_IMG)
_image_case("tv_mobilenet_v3", "torchvision", _tv_small(_tv("mobilenet_v3_small"), "mobilenet_v3_large"), IMG, BIG_IMG)
_image_case("tv_regnet", "torchvision", _tv_small(_tv_regnet, "regnet_y_400mf"), IMG, BIG_IMG)
_image_case(
    "tv_lraspp",
    "torchvision",
    _tv("lraspp_mobilenet_v3_large", weights_backbone=None, num_classes=3),
    ((1, 64), (2, 96)),
    BIG_IMG,
    out="out",
)
_image_case(
    "tv_r3d",
    "torchvision",
    _tv_small(_tv_video, "r3d_18"),
    ((1, 4, 32), (2, 8, 32)),
    ((1, 8, 112), (1, 16, 112)),
    video=True,
)


def _timm(name, small_kw, big_kw=None):
    def make(big):
        import timm

        kw = (big_kw or {}) if big else small_kw
        return timm.create_model(name, pretrained=False, num_classes=10, **kw)

    return make


_image_case("timm_resnet10t", "timm", _timm("resnet10t", {}), IMG, BIG_IMG)
_image_case("timm_convnext_atto", "timm", _timm("convnext_atto", {}), IMG, BIG_IMG)
# MobileViT's unfold reshapes by the traced size (its export is not dynamic in height and width)
_image_case("timm_mobilevit_xxs", "timm", _timm("mobilevit_xxs", {}), FIXED, FIXED, side=64)
_image_case(
    "timm_vit",
    "timm",
    _timm(
        "vit_tiny_patch16_224",
        {"img_size": 32, "patch_size": 8, "embed_dim": 32, "depth": 2, "num_heads": 2},
    ),
    FIXED,
    FIXED,
)
_image_case("timm_efficientvit", "timm", _timm("efficientvit_b0", {}), ((1, 64), (2, 96)), BIG_IMG)


if __name__ == "__main__":  # the export process: python corpus.py name:exporter:big ...
    for _key in sys.argv[1:]:
        _name, _exporter, _big = _key.split(":")
        _export_here(_name, _exporter, bool(int(_big)))
