"""Small random-weight transformers models of each GGUF architecture, written to GGUF as
llama.cpp's convert_hf_to_gguf.py writes them, quantized by llama.cpp's own quantizer, and read
back into transformers over the dequantized weights (the reference for quantized files).

- `hf_model(case)`: a transformers model (float32, eager attention) from a small config of the
  case's architecture (CASES: llama, llama3 (rope scaling "llama3"), mistral, qwen2, qwen3,
  gemma2, gemma3, phi3), weights re-drawn with a seed so that activations are O(1) and greedy
  tokens are not near-ties.
- `write_gguf(model, path)`: convert_hf_to_gguf.py in miniature: tensor names from the gguf
  package's TensorNameMap (the converter's own), Llama's Wq / Wk permuted for llama.cpp's rope,
  Gemma's norm weights stored as 1 + w, Llama 3's rope frequency factors as rope_freqs.weight,
  the metadata keys each architecture's converter class writes; every tensor float32.
- `quantize(src, dst, ftype)`: llama.cpp's llama_model_quantize (the `cyllama` wheel, in this
  interpreter or in MLTENSOR_QUANTIZE_PYTHON); `llama_cpp_python()`: an interpreter with
  llama-cpp-python (MLTENSOR_LLAMA_CPP_PYTHON), for llama.cpp's tokenizer and Vulkan backend.
- `hf_from_gguf(model, path)`: the same transformers model with the GGUF file's tensors,
  dequantized by the gguf package (gguf.quants.dequantize), un-permuted and un-shifted.
- `cached_gguf(case, ftype, **sizes)`: the converted (and quantized) file, cached under
  mltensor's cache directory keyed on the case, sizes, seed and tool versions.
"""

import hashlib
import json
import os
import subprocess
import sys

import numpy as np

# case -> (GGUF architecture, transformers config class, model class, config overrides)
CASES = {
    "llama": ("llama", "LlamaConfig", "LlamaForCausalLM", {}),
    "llama3": (
        "llama",
        "LlamaConfig",
        "LlamaForCausalLM",
        {
            "rope_parameters": {
                "rope_type": "llama3",
                "rope_theta": 500000.0,
                "factor": 8.0,
                "low_freq_factor": 1.0,
                "high_freq_factor": 4.0,
                "original_max_position_embeddings": 64,
            }
        },
    ),
    "mistral": ("llama", "MistralConfig", "MistralForCausalLM", {"sliding_window": None}),
    "qwen2": ("qwen2", "Qwen2Config", "Qwen2ForCausalLM", {"tie_word_embeddings": True}),
    "qwen3": ("qwen3", "Qwen3Config", "Qwen3ForCausalLM", {"head_dim": 32}),  # (key_length 32, not 64 / 4)
    "gemma2": (
        "gemma2",
        "Gemma2Config",
        "Gemma2ForCausalLM",
        {"sliding_window": 8, "attn_logit_softcapping": 4.0, "final_logit_softcapping": 12.0},
    ),
    "gemma3": (
        "gemma3",
        "Gemma3TextConfig",
        "Gemma3ForCausalLM",
        {
            "sliding_window": 8,
            "head_dim": 32,
            "layers": 6,  # five sliding-window layers, then a global one (llama.cpp's pattern of 6)
            "rope_parameters": {
                "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
                "full_attention": {"rope_type": "linear", "rope_theta": 1000000.0, "factor": 8.0},
            },
        },
    ),
    "phi3": (
        "phi3",
        "Phi3Config",
        "Phi3ForCausalLM",
        {"rope_parameters": {"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.5}},
    ),
}
VERSION = 1  # of this converter: part of the cache key


def import_models():
    """Import transformers' model classes of every case now, with triton kept out. Call it at a
    test module's import: transformers' modeling code imports torchvision.ops, which asks torch
    whether triton is installed by importing it, and importing triton in a process that has
    loaded wgpu's Vulkan driver (lavapipe, LLVM) crashes it (SIGSEGV). Nothing here needs triton
    (torch on the CPU): an import of it raises ImportError in this process."""
    import transformers

    if "triton" not in sys.modules:
        sys.modules["triton"] = None  # (import triton: ImportError)
    for _, cfg_name, cls_name, _ in CASES.values():
        getattr(transformers, cfg_name), getattr(transformers, cls_name)


def hf_model(case, *, hidden=64, heads=4, kv_heads=2, head_dim=16, ffn=96, vocab=256, layers=2, seed=0):
    import torch
    import transformers

    arch, cfg_name, cls_name, extra = CASES[case]
    extra = dict(extra)
    layers = extra.pop("layers", layers)
    head_dim = extra.pop("head_dim", head_dim)
    kw = dict(
        vocab_size=vocab,
        hidden_size=hidden,
        intermediate_size=ffn,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=kv_heads,
        max_position_embeddings=256,
        rms_norm_eps=1e-6 if arch.startswith("gemma") else 1e-5,
        bos_token_id=1,
        eos_token_id=2,
        pad_token_id=0,
    )
    if arch != "phi3":
        kw["head_dim"] = head_dim
    if arch.startswith("gemma"):
        kw["query_pre_attn_scalar"] = head_dim  # llama.cpp scales by 1/sqrt(head size)
        kw["hidden_activation"] = "gelu_pytorch_tanh"
    kw.update(extra)
    cfg = getattr(transformers, cfg_name)(**kw)
    model = getattr(transformers, cls_name)._from_config(cfg, attn_implementation="eager", torch_dtype=torch.float32)
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):  # Gemma's norms multiply by 1 + w: w near 0 there
                base = 0.0 if arch.startswith("gemma") else 1.0
                p.copy_(base + 0.1 * torch.randn(p.shape, generator=g))
            elif name.endswith(".bias"):
                p.copy_(0.5 * torch.randn(p.shape, generator=g))
            elif "embed_tokens" in name:
                p.copy_(torch.randn(p.shape, generator=g) * (1.0 / hidden**0.5 if arch.startswith("gemma") else 1.0))
            else:
                p.copy_(torch.randn(p.shape, generator=g) * (1.5 / p.shape[1] ** 0.5))
    model.eval()
    return model


def _permute(w, n_head, n_head_kv):
    """convert_hf_to_gguf.py LlamaModel.permute: Hugging Face's rotate-half rows of each head
    reordered so that llama.cpp's adjacent-pair rope computes the same."""
    if n_head_kv is not None and n_head != n_head_kv:
        n_head = n_head_kv
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def _unpermute(w, n_head, n_head_kv):
    if n_head_kv is not None and n_head != n_head_kv:
        n_head = n_head_kv
    return w.reshape(n_head, w.shape[0] // n_head // 2, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def _arch(model):
    for case, (arch, cfg_name, _, _) in CASES.items():
        if type(model.config).__name__ == cfg_name:
            return arch
    raise KeyError(type(model.config).__name__)


def _rope(cfg, layer_type="full_attention"):
    """The rope parameters of a layer type (Gemma 3 has one set a type, the others one)."""
    rp = cfg.rope_parameters
    return rp.get(layer_type, rp)


def _llama3_factors(cfg, dim):
    """convert_hf_to_gguf.py LlamaModel.generate_extra_tensors: Llama 3's rope frequency factors."""
    import math

    rp = _rope(cfg)
    base = rp["rope_theta"]
    freqs = 1.0 / (base ** (np.arange(0, dim, 2, dtype=np.float32) / dim))
    factor, lo, hi = rp.get("factor", 8.0), rp.get("low_freq_factor", 1.0), rp.get("high_freq_factor", 4.0)
    old = rp.get("original_max_position_embeddings", 8192)
    lo_wl, hi_wl = old / lo, old / hi
    out = []
    for f in freqs:
        wl = 2 * math.pi / f
        if wl < hi_wl:
            out.append(1.0)
        elif wl > lo_wl:
            out.append(factor)
        else:
            smooth = (old / wl - lo) / (hi - lo)
            out.append(1 / ((1 - smooth) / factor + smooth))
    return np.array(out, np.float32)


def _tensor_map(model):
    import gguf

    arch = _arch(model)
    return arch, gguf.get_tensor_name_map(gguf.MODEL_ARCH[arch.upper()], model.config.num_hidden_layers)


def write_gguf(model, path):
    """The float32 GGUF file llama.cpp's converter writes for `model` (module doc)."""
    import gguf

    cfg = model.config
    arch, tmap = _tensor_map(model)
    H, nh, nkv = cfg.hidden_size, cfg.num_attention_heads, cfg.num_key_value_heads
    hd = getattr(cfg, "head_dim", None) or H // nh
    w = gguf.GGUFWriter(path, arch)
    w.add_context_length(cfg.max_position_embeddings)
    w.add_embedding_length(H)
    w.add_block_count(cfg.num_hidden_layers)
    w.add_feed_forward_length(cfg.intermediate_size)
    w.add_head_count(nh)
    w.add_head_count_kv(nkv)
    w.add_layer_norm_rms_eps(cfg.rms_norm_eps)
    w.add_vocab_size(cfg.vocab_size)
    w.add_file_type(gguf.LlamaFileType.ALL_F32)
    rp = _rope(cfg)
    w.add_rope_freq_base(rp["rope_theta"])
    if arch == "phi3":
        w.add_rope_dimension_count(int(rp.get("partial_rotary_factor", 1.0) * H) // nh)
    elif arch == "llama":
        w.add_rope_dimension_count(hd)
    if hd != H // nh or arch in ("qwen3", "gemma2", "gemma3"):
        w.add_key_length(hd)
        w.add_value_length(hd)
    if arch == "gemma2":
        w.add_attn_logit_softcapping(cfg.attn_logit_softcapping)
        w.add_final_logit_softcapping(cfg.final_logit_softcapping)
        w.add_sliding_window(cfg.sliding_window)
    if arch == "gemma3":
        w.add_sliding_window(cfg.sliding_window)
        full = _rope(cfg, "full_attention")
        if full.get("rope_type") == "linear":
            w.add_rope_scaling_type(gguf.RopeScalingType.LINEAR)
            w.add_rope_scaling_factor(full["factor"])
    tied = getattr(cfg, "tie_word_embeddings", False)
    for name, t in model.state_dict().items():
        if name == "lm_head.weight" and tied:
            continue
        new = tmap.get_name(name, try_suffixes=(".weight", ".bias"))
        if new is None:
            raise KeyError(f"no GGUF name for {name}")
        a = t.detach().cpu().numpy().astype(np.float32)
        if arch == "llama" and name.endswith("q_proj.weight"):
            a = _permute(a, nh, nh)
        elif arch == "llama" and name.endswith("k_proj.weight"):
            a = _permute(a, nh, nkv)
        if arch.startswith("gemma") and name.endswith("norm.weight"):
            a = a + 1.0
        w.add_tensor(new, np.ascontiguousarray(a))
    if arch == "llama" and _rope(cfg).get("rope_type") == "llama3":
        w.add_tensor("rope_freqs.weight", _llama3_factors(cfg, hd))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def hf_from_gguf(model, path):
    """`model` (changed in place and returned) with the tensors of GGUF file `path`, dequantized
    by the gguf package: transformers over exactly the weights a quantized file holds."""
    import gguf
    import torch
    from gguf.quants import dequantize

    cfg = model.config
    arch, tmap = _tensor_map(model)
    nh, nkv = cfg.num_attention_heads, cfg.num_key_value_heads
    names = {}
    for name in model.state_dict():
        new = tmap.get_name(name, try_suffixes=(".weight", ".bias"))
        names.setdefault(new, []).append(name)
    sd = {}
    for t in gguf.GGUFReader(path).tensors:
        if t.name == "rope_freqs.weight":
            continue
        a = dequantize(t.data, t.tensor_type).astype(np.float32)
        a = a.reshape([int(x) for x in reversed(t.shape.tolist())])
        for name in names[t.name]:
            b = a
            if arch == "llama" and name.endswith("q_proj.weight"):
                b = _unpermute(a, nh, nh)
            elif arch == "llama" and name.endswith("k_proj.weight"):
                b = _unpermute(a, nh, nkv)
            if arch.startswith("gemma") and name.endswith("norm.weight"):
                b = a - 1.0
            sd[name] = torch.from_numpy(np.ascontiguousarray(b))
    if "lm_head.weight" in model.state_dict() and "lm_head.weight" not in sd:
        sd["lm_head.weight"] = sd["model.embed_tokens.weight"]
    missing = set(model.state_dict()) - set(sd)
    assert not missing, missing
    model.load_state_dict(sd)
    return model


# llama_ftype values (llama.h)
FTYPES = {"Q8_0": 7, "Q4_K_M": 15, "Q5_K_M": 17, "Q6_K": 18}
QUANTIZE = (
    "import sys, cyllama.llama.llama_cpp as L\n"
    "p = L.LlamaModelQuantizeParams()\n"
    "p.ftype = int(sys.argv[3])\n"
    "p.nthread = 1\n"
    "L.model_quantize(sys.argv[1], sys.argv[2], p)\n"
)


def quantizer_python():
    """An interpreter with `cyllama` (llama.cpp's llama_model_quantize): this one, or
    MLTENSOR_QUANTIZE_PYTHON; None when neither has it."""
    try:
        import cyllama.llama.llama_cpp  # noqa: F401

        return sys.executable
    except ImportError:
        return os.environ.get("MLTENSOR_QUANTIZE_PYTHON") or None


def llama_cpp_python():
    """An interpreter with llama-cpp-python (llama.cpp itself: its tokenizer, its Vulkan backend
    when built with GGML_VULKAN): MLTENSOR_LLAMA_CPP_PYTHON, else this one when it has
    `llama_cpp`; None when neither (building it: bench/results/llama-cpp-vulkan.md)."""
    import importlib.util

    if os.environ.get("MLTENSOR_LLAMA_CPP_PYTHON"):
        return os.environ["MLTENSOR_LLAMA_CPP_PYTHON"]
    return sys.executable if importlib.util.find_spec("llama_cpp") else None


def quantize(src, dst, ftype, python):
    subprocess.run([python, "-c", QUANTIZE, src, dst, str(FTYPES[ftype])], check=True, capture_output=True)
    return dst


def _versions(python):
    """The versions a generated file depends on: transformers, gguf, this converter, and the
    quantizer's cyllama when `python` is given."""
    from importlib.metadata import version

    import transformers

    v = {"transformers": transformers.__version__, "gguf": version("gguf"), "converter": VERSION}
    if python:
        out = subprocess.run(
            [python, "-c", "from importlib.metadata import version; print(version('cyllama'))"],
            capture_output=True,
            text=True,
            check=True,
        )
        v["cyllama"] = out.stdout.strip()
    return v


def _tag(*parts):
    return hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()[:16]


def cached_gguf(case, ftype="F32", python=None, **sizes):
    """(path, transformers model) of `case` written to GGUF and, unless F32, quantized to
    `ftype` by llama.cpp (`python`: quantizer_python()); files cached under mltensor's cache
    directory (test-gguf/), keyed on the case, sizes and the tool versions."""
    from mltensor._xdg import cache_dir

    model = hf_model(case, **sizes)
    d = os.path.join(cache_dir(), "test-gguf")
    os.makedirs(d, exist_ok=True)
    tag = _tag(case, repr(CASES[case]), sorted(sizes.items()), _versions(None))
    f32 = os.path.join(d, f"{case}-{tag}-F32.gguf")
    if not os.path.exists(f32):
        write_gguf(model, f32 + f".{os.getpid()}.tmp")
        os.replace(f32 + f".{os.getpid()}.tmp", f32)
    if ftype == "F32":
        return f32, model
    out = os.path.join(d, f"{case}-{tag}-{ftype}-{_tag(_versions(python))}.gguf")
    if not os.path.exists(out):
        quantize(f32, out + f".{os.getpid()}.tmp", ftype, python)
        os.replace(out + f".{os.getpid()}.tmp", out)
    return out, model
