"""The decoder of every supported GGUF architecture written with MLGraphBuilder, over weights
from a GGUF file. What differs between architectures is described in mltensor/llm/arch (one file
each: llama, qwen2, qwen3, gemma2, gemma3, phi3); the parts are written here once.

One layer: h += [post_norm](Wo . attention(rope(q), rope(k), v)) with q, k, v = W . n [+ biases]
(three matrices, or one fused and sliced), [q, k RMS-normed per head], n = rms_norm(h);
h += [post_norm](W_down . (act(W_gate . n2) * (W_up . n2))) with act silu (SwiGLU) or tanh-GELU
(GeGLU), gate and up fused or not, n2 = rms_norm(h); the embeddings [times sqrt(hidden)]; then
the last position's rms_norm(h) times the output head (token_embd when the file has no
output.weight: tied), [soft-capped: c * tanh(x / c)].

- Quantized weights stay in their blocks on the GPU: Q4_0, Q4_1 and Q8_0 through `_matmul_nbits`
  (decoded inside the GEMV/GEMM kernels) and `_gather_nbits` (only the embedding rows gathered
  are decoded); the K-quants, Q5_0, Q5_1, IQ4_NL, IQ4_XS, BF16 and F16 likewise through
  `_matmul_blocks` / `_gather_blocks` (ops/blocks.py), which read the file's bytes.
- Rotary embeddings as llama.cpp applies them to GGUF weights: the first rope.dimension_count
  channels of each head, angle pos * scale * base^(-2i / dims) / factor_i (factor_i: Llama 3's
  rope_freqs.weight, else 1; base and scale per layer: Gemma 3's sliding layers have their own),
  on adjacent pairs (2i, 2i+1) for `llama` (its converter permutes Wq and Wk so that this equals
  Hugging Face's rotate-half) or on channels (i, i + dims/2) for the NEOX architectures.
- Grouped-query attention with the fused `_attention` kernel (query head h reads KV head
  h // (heads / kv_heads)), causal with the mask aligned bottom-right (a step with a cache of
  `past` positions sees keys 0 .. past + s), the architecture's scale, Gemma 2's soft-cap of the
  scores, and on sliding-window layers the window (keys before it masked and skipped; a model
  with such layers keeps them a ring of positions: LlamaSession).
- Three builds with dynamic dimensions serve a whole conversation: "prefill" (the first tokens,
  no cache: `seq` dynamic), "step" (one token after a cache of `past` positions: the decode
  step, its token count static so its projections take GEMV kernels) and "chunk" (`seq` new
  tokens after a cache of `past`, both dynamic: a later message of a chat). On CPU adapters the
  decode step's quantized projections use `_llm_gemv` (kernels.py: threads of two output rows,
  no barriers; SmolLM2's step on lavapipe 1.1 s with `_matmul_nbits`' GEMV, 0.15 s with it), on
  GPUs `_matmul_nbits`.
  The KV cache is one tensor per layer and K/V, [positions, kv_heads, head_dim] (position-major),
  allocated for max_context and written in place: each build's cache operands are
  `_kv_append(new rows, past)` (ops/kvcache.py), graph outputs of shape [past + seq, ...] whose
  kernel writes only rows [past, past + seq) of the session's tensors; the rows before are what
  earlier dispatches wrote there. The attention reads those operands in that layout
  (`_attention(..., layout="bshd")`), so no tensor is both an input and an output of a dispatch,
  nothing is copied, and a step moves only its new rows. `past` reaches the graph as the shape of
  a small int32 input the session resizes (never uploaded, never read). Nothing of the cache
  ever comes back to the host.
- Weights are graph constants; the context's constant store keys them by content, so the
  builds share one GPU copy (ctx.counters["constant_bytes"]).
"""

from __future__ import annotations

import math
import os
import threading
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import numpy as np

from .. import MLDynamicDimension, MLGraphBuilder
from . import kernels  # noqa: F401 - registers _llm_gemv
from ..runtime.wgsl import cpu_device
from .batch import LlamaBatch, rows_ring
from .gguf import GGUFFile, LlamaConfig, load_weight

if TYPE_CHECKING:
    import numpy.typing as npt

    from ..front.context import MLContext
    from ..front.tensor import MLTensor


class LlamaWeights:
    """Every tensor the file's architecture needs (mltensor/llm/arch), read from a GGUF file and
    repacked (host memory). `layers[i]` maps GGUF names without the `blk.i.` prefix and the
    `.weight` suffix to Weights (biases keep their `.bias`).

    Parameters
    ----------
    source : GGUFFile, str or os.PathLike
        The opened file, or its path.

    Raises
    ------
    mltensor.DataError
        A malformed file, or a tensor missing or of the wrong shape.
    mltensor.NotSupportedError
        An unsupported architecture or tensor type.
    """

    def __init__(self, source: GGUFFile | str | os.PathLike[str]) -> None:
        f = source if isinstance(source, GGUFFile) else GGUFFile(source)
        self.file = f
        c = self.config = LlamaConfig(f)
        spec = c.spec
        H, hd = c.hidden, c.head_dim
        qd, kvd = c.n_heads * hd, c.n_kv_heads * hd
        self.token_embd = load_weight(f, "token_embd.weight", (c.vocab, H))
        self.output_norm = load_weight(f, "output_norm.weight", (H,))
        self.output = load_weight(f, "output.weight", (c.vocab, H)) if "output.weight" in f.tensors else None
        # Llama 3's rope scaling: frequency factors (the angle of channel pair i divided by factor i)
        half = c.rope_dims // 2
        self.rope_freqs = load_weight(f, "rope_freqs.weight", (half,)) if "rope_freqs.weight" in f.tensors else None
        self.layers: list[dict[str, Any]] = []
        for i in range(c.n_layers):
            p = f"blk.{i}."
            shapes: dict[str, tuple[int, ...]] = {"attn_norm": (H,)}  # (read in the order of the layer)
            if spec.fused_qkv:
                shapes["attn_qkv"] = (qd + 2 * kvd, H)
            else:
                shapes.update(attn_q=(qd, H), attn_k=(kvd, H), attn_v=(kvd, H))
            shapes.update(attn_output=(H, qd), ffn_norm=(H,))
            if spec.fused_gate_up:
                shapes["ffn_up"] = (2 * c.ffn, H)
            else:
                shapes.update(ffn_gate=(c.ffn, H), ffn_up=(c.ffn, H))
            shapes["ffn_down"] = (H, c.ffn)
            if spec.post_norms:
                shapes.update(post_attention_norm=(H,), post_ffw_norm=(H,))
            if spec.qk_norm:
                shapes.update(attn_q_norm=(hd,), attn_k_norm=(hd,))
            layer = {k: load_weight(f, f"{p}{k}.weight", s) for k, s in shapes.items()}
            for proj in ("attn_q", "attn_k", "attn_v", "attn_qkv"):
                if proj in shapes and (f"{p}{proj}.bias" in f.tensors or (spec.qkv_bias and proj != "attn_qkv")):
                    layer[proj + ".bias"] = load_weight(f, f"{p}{proj}.bias", shapes[proj][:1])
            self.layers.append(layer)

    def _all(self) -> Iterator[Any]:
        yield self.token_embd
        yield self.output_norm
        if self.output is not None:
            yield self.output
        if self.rope_freqs is not None:
            yield self.rope_freqs
        for layer in self.layers:
            yield from layer.values()

    @property
    def nbytes(self) -> int:
        """Bytes of the weights as they go to the GPU (packed blocks, scales, zero points)."""
        return sum(w.nbytes for w in self._all())

    def rope_tables(
        self, n_positions: int, base: float | None = None, scale: float = 1.0
    ) -> tuple[np.ndarray, np.ndarray]:
        """The rotary embedding's tables (angles computed in float64): channel pair i of position p
        turns by p * scale * base^(-2i / rope_dims) / factor_i (factors: rope_freqs, else 1).

        Parameters
        ----------
        n_positions : int
            Positions 0 .. n_positions - 1.
        base : float or None, default None
            The frequency base; None: the file's (``rope.freq_base``).
        scale : float, default 1.0
            Multiplies the positions.

        Returns
        -------
        cos, sin : numpy.ndarray
            float32 [n_positions, rope_dims / 2].
        """
        c = self.config
        base = c.rope_base if base is None else base
        half = c.rope_dims // 2
        inv = base ** (-np.arange(half, dtype=np.float64) * 2.0 / c.rope_dims)
        if self.rope_freqs is not None:
            inv = inv / self.rope_freqs.dense.astype(np.float64)  # type: ignore[union-attr]  # a float weight: dense
        ang = (np.arange(n_positions, dtype=np.float64) * scale)[:, None] * inv[None, :]
        return np.cos(ang).astype(np.float32), np.sin(ang).astype(np.float32)


class _Graph:
    """One MLGraph of the model and the names of its cache outputs."""

    def __init__(self, graph: Any, cache_names: list[str]) -> None:
        self.graph, self.cache_names = graph, cache_names


class _Builder:
    """Writes the Llama graph into one MLGraphBuilder (constants made once per array)."""

    def __init__(
        self, ctx: MLContext, weights: LlamaWeights, max_context: int, gemv: bool = False, rows: bool = False
    ) -> None:
        self.b: Any = MLGraphBuilder(ctx)  # its internal operators (_matmul_nbits ...) too
        self.gemv = gemv
        # the serving step's (build_rows): 4/8-bit projections through `_llm_gemv` with its rows
        # tile chosen at dispatch, on every adapter: sums that do not depend on the step's rows
        self.rows = rows
        self.w = weights
        self.c = weights.config
        self.max_context = max_context
        self._consts: dict[int, tuple[Any, Any]] = {}

    def const(self, arr: Any) -> Any:
        key = id(arr)
        if key not in self._consts:
            self._consts[key] = (arr, self.b.constant(np.ascontiguousarray(arr)))
        return self._consts[key][1]

    def linear(self, x: Any, w: Any) -> Any:
        """x [..., K] times w [N, K] transposed -> [..., N]."""
        b = self.b
        if w.blocks is not None:
            q = w.blocks
            return b._matmul_blocks(x, self.const(q.words), kind=q.kind, K=q.cols, N=q.rows, rows_gemv=self.rows)
        if w.q is not None and self.rows:
            q = w.q
            zp = None if q.zero_points is None else self.const(q.zero_points)
            return b._llm_gemv(
                x,
                self.const(q.packed),
                self.const(q.scales16),
                K=q.cols,
                N=q.rows,
                bits=q.bits,
                zero_points=zp,
                rows_tile=0,
            )
        if w.q is not None and self.gemv and tuple(x.shape[:-1]) == (1,):
            q = w.q
            zp = None if q.zero_points is None else self.const(q.zero_points)
            return b._llm_gemv(
                x, self.const(q.packed), self.const(q.scales16), K=q.cols, N=q.rows, bits=q.bits, zero_points=zp
            )
        if w.q is not None:
            q = w.q
            zp = None if q.zero_points is None else self.const(q.zero_points)
            return b._matmul_nbits(
                x,
                self.const(q.packed),
                self.const(q.scales16),
                K=q.cols,
                N=q.rows,
                bits=q.bits,
                block_size=q.block_size,
                zero_points=zp,
                zp_mode="none" if zp is None else "float",
            )
        if self.rows and w.dense.ndim == 2 and w.dense.dtype == np.float32 and w.dense.shape[1] % 32 == 0:
            # float32 as 32-value "blocks" for the same GEMV: sums that do not depend on the rows
            rows, cols = w.dense.shape
            return b._matmul_blocks(x, self.const(_f32_words(w)), kind="F32", K=cols, N=rows, rows_gemv=True)
        wt = self.const(_transposed(w))
        if wt.data_type != "float32":
            wt = b.cast(wt, "float32")
        return b.matmul(x, wt)

    def embed(self, ids: Any) -> Any:
        b, w = self.b, self.w.token_embd
        if w.blocks is not None:
            blocks = w.blocks
            return b._gather_blocks(self.const(blocks.words), ids, kind=blocks.kind, V=blocks.rows, H=blocks.cols)
        if w.q is not None:
            q = w.q
            zp = None if q.zero_points is None else self.const(q.zero_points)
            return b._gather_nbits(
                self.const(q.packed),
                ids,
                self.const(q.scales),
                V=q.rows,
                H=q.cols,
                bits=q.bits,
                block_size=q.block_size,
                zero_points=zp,
                zp_mode="none" if zp is None else "float",
            )
        table = self.const(w.dense)
        x = b.gather(table, ids, axis=0)
        return x if x.data_type == "float32" else b.cast(x, "float32")

    def norm(self, x: Any, w: Any) -> Any:
        b = self.b
        ms = b.reduce_mean(b.mul(x, x), axes=[len(x.shape) - 1], keep_dimensions=True)
        inv = b.reciprocal(b.sqrt(b.add(ms, b.constant(np.array(self.c.eps, np.float32)))))
        g = self.const(w.dense)
        if g.data_type != "float32":
            g = b.cast(g, "float32")
        return b.mul(b.mul(x, inv), g)

    def rope(self, x: Any, cos: Any, sin: Any) -> Any:
        """x [seq, heads, head_dim]: the first rope_dims channels rotated by cos/sin [seq, 1,
        rope_dims/2]: adjacent pairs (llama.cpp's LLAMA_ROPE_TYPE_NORM) or channel i with
        i + rope_dims/2 (NEOX, Hugging Face's rotate-half)."""
        b, c = self.b, self.c
        seq, nh, hd = x.shape
        rot, half = c.rope_dims, c.rope_dims // 2
        if c.spec.rope == "neox":
            x1 = b.slice(x, [0, 0, 0], [seq, nh, half])
            x2 = b.slice(x, [0, 0, half], [seq, nh, half])
            parts = [b.sub(b.mul(x1, cos), b.mul(x2, sin)), b.add(b.mul(x2, cos), b.mul(x1, sin))]
            if rot < hd:
                parts.append(b.slice(x, [0, 0, rot], [seq, nh, hd - rot]))
            return b.concat(parts, 2)
        xr = b.slice(x, [0, 0, 0], [seq, nh, rot]) if rot < hd else x
        pairs = b.reshape(xr, [seq, nh, half, 2])
        xe = b.reshape(b.slice(pairs, [0, 0, 0, 0], [seq, nh, half, 1]), [seq, nh, half])
        xo = b.reshape(b.slice(pairs, [0, 0, 0, 1], [seq, nh, half, 1]), [seq, nh, half])
        ye = b.sub(b.mul(xe, cos), b.mul(xo, sin))
        yo = b.add(b.mul(xo, cos), b.mul(xe, sin))
        y = b.reshape(
            b.concat([b.reshape(ye, [seq, nh, half, 1]), b.reshape(yo, [seq, nh, half, 1])], 3), [seq, nh, rot]
        )
        if rot < hd:
            y = b.concat([y, b.slice(x, [0, 0, rot], [seq, nh, hd - rot])], 2)
        return y

    def dense(self, x: Any, lw: Any, name: Any) -> Any:
        """x times blk weight `name` [+ its bias]."""
        y = self.linear(x, lw[name])
        bias = lw.get(name + ".bias")
        return y if bias is None else self.b.add(y, self.const(bias.dense))

    def qkv(self, n: Any, lw: Any) -> Any:
        """The q, k and v projections: three matrices, or one fused (sliced after the matmul)."""
        b, c = self.b, self.c
        if "attn_qkv" not in lw:
            return (self.dense(n, lw, x) for x in ("attn_q", "attn_k", "attn_v"))
        y = self.dense(n, lw, "attn_qkv")
        seq, qd, kvd = n.shape[0], c.n_heads * c.head_dim, c.n_kv_heads * c.head_dim
        return (b.slice(y, [0, off], [seq, size]) for off, size in ((0, qd), (qd, kvd), (qd + kvd, kvd)))

    def ffn(self, n: Any, lw: Any) -> Any:
        """W_down (act(W_gate n) * W_up n): SwiGLU or GeGLU, gate and up fused or not."""
        b, c = self.b, self.c
        if "ffn_gate" in lw:
            g, u = self.linear(n, lw["ffn_gate"]), self.linear(n, lw["ffn_up"])
        else:  # one matrix: the gate's rows, then the up rows
            y, seq = self.linear(n, lw["ffn_up"]), n.shape[0]
            g, u = b.slice(y, [0, 0], [seq, c.ffn]), b.slice(y, [0, c.ffn], [seq, c.ffn])
        if c.spec.activation == "gelu":  # the tanh approximation (gelu_pytorch_tanh, ggml_gelu)
            k = b.constant(np.array(math.sqrt(2.0 / math.pi), np.float32))
            inner = b.mul(k, b.add(g, b.mul(b.constant(np.array(0.044715, np.float32)), b.mul(b.mul(g, g), g))))
            half = b.mul(b.constant(np.array(0.5, np.float32)), g)
            act = b.mul(half, b.add(b.constant(np.array(1.0, np.float32)), b.tanh(inner)))
        else:
            act = b.mul(g, b.sigmoid(g))
        return self.linear(b.mul(act, u), lw["ffn_down"])

    def softcap(self, x: Any, cap: Any) -> Any:
        b = self.b
        return b.mul(
            b.tanh(b.mul(x, b.constant(np.array(1.0 / cap, np.float32)))), b.constant(np.array(cap, np.float32))
        )

    def build(self, with_past: bool, max_seq: int) -> _Graph:
        """max_seq: the most tokens a dispatch takes (1: a static size, the decode step)."""
        b, c = self.b, self.c
        ids = b.input("ids", data_type="int32", shape=[1 if max_seq == 1 else MLDynamicDimension("seq", max_seq)])
        seq = ids.shape[0]
        if with_past:
            # the cache length: only this input's shape is read (LlamaSession sets it, no upload)
            past = b.input("past", data_type="int32", shape=[MLDynamicDimension("past", self.max_context - 1)]).shape[0]
        else:
            past = 0
        pos = b._range(ids, past, 1, seq, "int32")

        def attend(i: Any, q: Any, k: Any, v: Any) -> Any:
            # the new rows written in place after the `past` ones: the results are the session's
            # cache tensors [past + seq, kv_heads, head_dim] (graph outputs), read by the attention
            k, v = b._kv_append([k, v], past)
            att = b._attention(
                q, k, v, scale=c.attn_scale, causal=True, layout="bshd", softcap=c.attn_softcap, window=c.windows[i]
            )
            return att, k, v

        outputs: dict[str, Any] = {}
        h = self.decoder(ids, pos, attend, outputs)
        return self.head(b.slice(h, [seq - 1, 0], [1, c.hidden]), outputs)

    def decoder(self, ids: Any, pos: Any, attend: Any, outputs: dict[str, Any]) -> Any:
        """The embeddings and every layer of tokens `ids` at positions `pos` ([seq] each): returns h
        [seq, hidden]. attend(layer, q, k, v) ([seq, heads, head_dim] each, after the rotary
        embedding) writes k and v to the layer's cache and returns (attention [seq, heads,
        head_dim], k cache, v cache), the caches then graph outputs."""
        b, c, w = self.b, self.c, self.w
        spec = c.spec
        nh, nkv, hd = c.n_heads, c.n_kv_heads, c.head_dim
        seq, half = ids.shape[0], c.rope_dims // 2
        ropes = {}  # (base, scale) -> cos, sin [seq, 1, half]: one pair per distinct layer rope
        for key in dict.fromkeys(c.layer_ropes):
            cos_t, sin_t = w.rope_tables(self.max_context, *key)
            ropes[key] = tuple(b.reshape(b.gather(b.constant(t), pos, axis=0), [seq, 1, half]) for t in (cos_t, sin_t))
        h = self.embed(ids)  # [seq, hidden]
        if spec.embed_scale:
            h = b.mul(h, b.constant(np.array(math.sqrt(c.hidden), np.float32)))
        for i, lw in enumerate(w.layers):
            n = self.norm(h, lw["attn_norm"])
            q, k, v = self.qkv(n, lw)
            q, k, v = b.reshape(q, [seq, nh, hd]), b.reshape(k, [seq, nkv, hd]), b.reshape(v, [seq, nkv, hd])
            if spec.qk_norm:
                q, k = self.norm(q, lw["attn_q_norm"]), self.norm(k, lw["attn_k_norm"])
            cos, sin = ropes[c.layer_ropes[i]]
            att, outputs[f"cache_k{i}"], outputs[f"cache_v{i}"] = attend(
                i, self.rope(q, cos, sin), self.rope(k, cos, sin), v
            )
            o = self.linear(b.reshape(att, [seq, nh * hd]), lw["attn_output"])
            if spec.post_norms:
                o = self.norm(o, lw["post_attention_norm"])
            h = b.add(h, o)
            f = self.ffn(self.norm(h, lw["ffn_norm"]), lw)
            if spec.post_norms:
                f = self.norm(f, lw["post_ffw_norm"])
            h = b.add(h, f)
        return h

    def head(self, h: Any, outputs: dict[str, Any]) -> _Graph:
        """The logits of rows h ([rows, hidden]) in outputs["logits"]; builds the graph."""
        b, c, w = self.b, self.c, self.w
        logits = self.linear(self.norm(h, w.output_norm), w.output if w.output is not None else w.token_embd)
        if c.final_softcap:
            logits = self.softcap(logits, c.final_softcap)
        outputs["logits"] = logits
        graph = b.build_sync(outputs)
        return _Graph(graph, [f"cache_{kv}{i}" for i in range(c.n_layers) for kv in "kv"])

    def build_rows(self, max_rows: int, slots: int) -> _Graph:
        """The serving engine's step (LlamaBatch): `rows` tokens of up to `slots` sequences, row r
        at position pos[r] of its sequence, its keys and values written to cache row dst[r] of
        caches [slots * max_context, kv_heads, head_dim] shared by the sequences
        (`_kv_scatter`, `_attention_rows`: ops/kvrows.py); the logits of the rows `last` names."""
        b, c = self.b, self.c
        rows = MLDynamicDimension("rows", max_rows)
        ids = b.input("ids", data_type="int32", shape=[rows])
        pos = b.input("pos", data_type="int32", shape=[rows])
        dst = b.input("dst", data_type="int32", shape=[rows])
        last = b.input("last", data_type="int32", shape=[MLDynamicDimension("seqs", slots)])
        ring = rows_ring(c, self.max_context, max_rows)
        # sliding-window layers keep a ring of `ring` positions a slot (their rows: ring_dst)
        ring_dst = b.input("ring_dst", data_type="int32", shape=[rows]) if ring else None

        def attend(i: Any, q: Any, k: Any, v: Any) -> Any:
            in_ring = bool(ring and c.windows[i])
            at = ring_dst if in_ring else dst
            k, v = b._kv_scatter([k, v], at, rows=slots * (ring if in_ring else self.max_context))
            att = b._attention_rows(
                q,
                k,
                v,
                at,
                pos,
                scale=c.attn_scale,
                softcap=c.attn_softcap or 0.0,
                window=c.windows[i],
                max_len=self.max_context,
                ring=ring if in_ring else 0,
            )
            return att, k, v

        outputs: dict[str, Any] = {}
        h = self.decoder(ids, pos, attend, outputs)
        return self.head(b.gather(h, last, axis=0), outputs)


def _transposed(w: Any) -> Any:
    return np.ascontiguousarray(w.dense.T)


def _f32_words(w: Any) -> Any:
    return np.ascontiguousarray(w.dense, dtype=np.float32).reshape(-1).view(np.uint32)


class LlamaModel:
    """A Llama model from a GGUF file on an MLContext: two graphs (prompt, step) built on first
    use. `max_context` bounds the positions of a conversation (cache tensors are sized for it).
    `max_step` bounds the tokens of one step after the first prompt (longer feeds are split).

    Parameters
    ----------
    source : LlamaWeights, GGUFFile, str or os.PathLike
        The weights, or the file to read them from.
    ctx : MLContext
        The context to build on.
    max_context : int, default 1024
        The positions of a conversation, at least 2 (capped by the file's context length).
    max_step : int, default 64
        The most tokens one dispatch after the first prompt takes.
    gemv : bool, default True
        On CPU adapters, decode steps use `_llm_gemv`; False: `_matmul_nbits` everywhere (for
        comparisons).

    Raises
    ------
    TypeError
        `max_context` or `max_step` out of range.
    """

    def __init__(
        self,
        source: LlamaWeights | GGUFFile | str | os.PathLike[str],
        ctx: MLContext,
        *,
        max_context: int = 1024,
        max_step: int = 64,
        gemv: bool = True,
    ) -> None:
        self.weights = source if isinstance(source, LlamaWeights) else LlamaWeights(source)
        self.config = self.weights.config
        if isinstance(max_context, bool) or not isinstance(max_context, int) or max_context < 2:
            raise TypeError(f"[LlamaModel] max_context must be an integer >= 2, got {max_context!r}")
        if isinstance(max_step, bool) or not isinstance(max_step, int) or max_step < 1:
            raise TypeError(f"[LlamaModel] max_step must be a positive integer, got {max_step!r}")
        self.max_context = min(max_context, self.config.context_length)
        self.max_step = min(max_step, self.max_context - 1)
        self.ctx = ctx
        self.gemv = bool(gemv)  # False: `_matmul_nbits` on every adapter (for comparisons)
        self._lock = threading.Lock()  # builds once, whichever thread asks first
        self._graphs: dict[Any, _Graph] = {}

    def graph(self, which: str) -> _Graph:
        """One of the conversation's graphs, built on first use.

        Parameters
        ----------
        which : str
            "prefill" (the first prompt), "step" (one token) or "chunk" (up to `max_step` tokens
            after the first prompt).

        Returns
        -------
        _Graph
            The MLGraph (``.graph``) and the names of its cache outputs.

        Raises
        ------
        ValueError
            Another name.
        """
        with self._lock:
            if which not in self._graphs:
                cpu = cpu_device(self.ctx.device)
                bld = _Builder(self.ctx, self.weights, self.max_context, gemv=cpu and self.gemv)
                if which == "prefill":
                    self._graphs[which] = bld.build(False, self.max_context)
                elif which == "step":
                    self._graphs[which] = bld.build(True, 1)
                elif which == "chunk":
                    self._graphs[which] = bld.build(True, max(self.max_step, 2))
                else:
                    raise ValueError(f"unknown graph {which!r}")
            return self._graphs[which]

    def session(self) -> LlamaSession:
        """A new conversation's KV cache.

        Returns
        -------
        LlamaSession
            Empty (length 0).
        """
        return LlamaSession(self)

    def rows_graph(self, slots: int, rows: int) -> _Graph:
        """The serving step's graph, built on first use.

        Parameters
        ----------
        slots : int
            How many sequences.
        rows : int
            The most tokens of one step.

        Returns
        -------
        _Graph
            The MLGraph (``.graph``) and the names of its cache outputs.
        """
        key = ("rows", slots, rows)
        with self._lock:
            if key not in self._graphs:
                bld = _Builder(self.ctx, self.weights, self.max_context, rows=True)
                self._graphs[key] = bld.build_rows(rows, slots)
            return self._graphs[key]


class LlamaSession:
    """One conversation's KV cache on the GPU. `feed(ids)` runs the tokens (a host array of int32
    ids, or an int32 MLTensor of shape [n] already on the GPU, e.g. a sampler's output) and
    returns the logits MLTensor [1, vocab] of the last one. Not for concurrent use from several
    threads (calls are serialized by a lock). Made by `LlamaModel.session()`.

    Parameters
    ----------
    model : LlamaModel
        The model; the cache is sized for its `max_context`.
    """

    def __init__(self, model: LlamaModel) -> None:
        self.model = model
        self.ctx = model.ctx
        c = model.config
        self.length = 0
        self._lock = threading.Lock()
        ctx = self.ctx
        # A model with sliding-window layers (Gemma 2, Gemma 3) runs its tokens through the serving
        # step of one slot (LlamaBatch, build_rows): a sliding layer's cache is a ring of window +
        # max_step - 1 positions (rows_ring), the others every position; the first prompt too goes
        # in steps of max_step, so that no step overwrites keys another row of it reads.
        self._rows: LlamaBatch | None = None
        if rows_ring(c, model.max_context, model.max_step):
            self._rows = LlamaBatch(model, 1, model.max_step)
            self._cache = self._rows._cache
        else:
            # one cache tensor per layer and K/V, position-major, sized for the context and
            # written in place: each dispatch appends its rows after the first `length` ones
            shape = [MLDynamicDimension("positions", model.max_context), c.n_kv_heads, c.head_dim]
            self._cache = {
                f"cache_{kv}{i}": ctx.create_tensor_sync(data_type="float32", shape=shape)
                for i in range(c.n_layers)
                for kv in "kv"
            }
        # the cache length as a shape (the step and chunk graphs' "past" input; never read)
        self._past = ctx.create_tensor_sync(data_type="int32", shape=[MLDynamicDimension("past", model.max_context)])
        self._ids = ctx.create_tensor_sync(
            data_type="int32", shape=[MLDynamicDimension("seq", model.max_context)], writable=True
        )
        self.logits = ctx.create_tensor_sync(data_type="float32", shape=[1, c.vocab], readable=True)

    @property
    def cache_tensors(self) -> dict[str, MLTensor]:
        """{name: MLTensor} of the KV cache (cache_k{layer}, cache_v{layer}), [length, kv_heads,
        head_dim] after a feed: the rows of the positions fed so far (a model with sliding-window
        layers: [max_context or, for a sliding layer, its ring of positions, kv_heads, head_dim],
        position p in row p, or p mod the ring)."""
        return dict(self._cache)

    def keep(self, n: int) -> int:
        """Forget the positions from `n` on, keeping the first n where the cache still holds what
        the next position reads: returns n, or 0 where a sliding layer's ring has already written
        over keys position n reads (the caller then feeds its tokens from the start).

        Parameters
        ----------
        n : int
            Positions to keep, at most `length`.

        Returns
        -------
        int
            The positions kept.
        """
        with self._lock:
            n = min(int(n), self.length)
            if self._rows is not None:
                n = self._rows.reusable(self.length, n)
            self.length = n
            return n

    def reset(self) -> None:
        """Forget the positions fed (the next feed is a first prompt; the cache is overwritten)."""
        with self._lock:
            self.length = 0

    def feed(self, ids: npt.ArrayLike | MLTensor) -> MLTensor:
        """Run the next tokens through the model (a long host array is split into steps).

        Parameters
        ----------
        ids : array_like of int or MLTensor
            A non-empty 1-D host array of token ids, or an int32 MLTensor [n] already on the GPU
            (a sampler's output), at most one dispatch's tokens.

        Returns
        -------
        MLTensor
            ``self.logits``: float32 [1, vocab], the last token's logits.

        Raises
        ------
        TypeError
            Ids of the wrong type or rank, or empty.
        ValueError
            An id outside the vocabulary, more tokens than the context has room for, or an
            MLTensor of more ids than one dispatch takes.
        """
        with self._lock:
            if hasattr(ids, "data_type"):  # an MLTensor already on the GPU
                t: Any = ids
                n = int(np.prod(t.shape)) if t.shape else 1
                if t.data_type != "int32" or len(t.shape) != 1 or n < 1:
                    raise TypeError(
                        f"[LlamaSession.feed] a tensor of ids must be non-empty int32 of rank 1, got "
                        f"{t.data_type} {list(t.shape)}"
                    )
                limit = self.model.max_context if self.length == 0 else self.model.max_step
                if n > limit:
                    raise ValueError(
                        f"[LlamaSession.feed] a tensor of {n} ids exceeds the {limit} tokens one "
                        "dispatch takes here (pass a host array: it is split)"
                    )
                chunks = [ids]
            else:
                arr = np.asarray(ids)
                if arr.ndim != 1 or arr.size == 0 or not np.issubdtype(arr.dtype, np.integer):
                    raise TypeError(
                        f"[LlamaSession.feed] ids must be a non-empty 1-D integer array, got "
                        f"{arr.dtype} {list(arr.shape)}"
                    )
                vocab = self.model.config.vocab
                if arr.min() < 0 or arr.max() >= vocab:
                    raise ValueError(
                        f"[LlamaSession.feed] token ids must lie in [0, {vocab}), got "
                        f"{int(arr.min())}..{int(arr.max())}"
                    )
                n = arr.size
                chunks = None
            if self._rows is not None and chunks is not None and n > self.model.max_step:
                raise ValueError(
                    f"[LlamaSession.feed] a tensor of {n} ids exceeds the {self.model.max_step} tokens one "
                    "dispatch takes here (pass a host array: it is split)"
                )
            if self.length + n > self.model.max_context:
                raise ValueError(
                    f"[LlamaSession.feed] {self.length} + {n} tokens exceed the context of "
                    f"{self.model.max_context} positions"
                )
            if chunks is None:
                arr = arr.astype(np.int32)
                # the first tokens in one prefill dispatch (they fit: checked above), later ones in
                # dispatches of at most max_step
                whole = self.length == 0 and self._rows is None
                chunks = [arr] if whole else _split(arr, self.model.max_step)
            for ch in chunks:
                self._run(ch)
            return self.logits

    def _run(self, chunk: Any) -> None:
        ctx = self.ctx
        if self._rows is not None:
            self._rows.session_step(self.length, chunk, self.logits)
            self.length += int(chunk.shape[0])
            return
        if isinstance(chunk, np.ndarray):
            ctx.write_tensor(self._ids, chunk)
            ids, n = self._ids, chunk.size
        else:
            ids, n = chunk, int(chunk.shape[0])
        outs = {"logits": self.logits, **self._cache}
        if self.length == 0:
            g = self.model.graph("prefill")
            ins = {"ids": ids}
        else:
            g = self.model.graph("step" if n == 1 else "chunk")
            # the shape a write_tensor of `length` values would give it, without the upload
            with ctx._lock:
                ctx._check_tensor(self._past, "LlamaSession.feed")
                self._past._fit((self.length,), "LlamaSession.feed", "the cache length")
            ins = {"ids": ids, "past": self._past}
        ctx.dispatch(g.graph, ins, outs)
        self.length += n


def _split(arr: Any, size: int) -> list[Any]:
    return [arr[i : i + size] for i in range(0, arr.size, size)]
