"""Sentence embeddings for POST /v1/embeddings: an ONNX encoder (a sentence-transformers model's
export: inputs input_ids, attention_mask and maybe token_type_ids; output the token embeddings,
[batch, sequence, hidden]) run by mltensor's InferenceSession, then pooled and normalised as the
model's sentence-transformers configuration says: its `modules.json` and the Pooling module's
`config.json` (both formats: `pooling_mode_cls_token: true`, ... and `pooling_mode: "cls"`), found
next to the model or in its parent folder as Hugging Face repositories lay them out. Without them:
mean pooling over the attention mask and L2 normalisation (sentence-transformers' default).

A request's inputs run as one batch (padded to the longest, at most `max_length` tokens each; the
pooling ignores the padding). The tokenizer is the `tokenizer.json` next to the model or in its
parent folder (the `tokenizers` package), with its own special tokens ([CLS] ... [SEP]); token ids
given by the client are taken as they are. A module after the pooling other than Normalize (a
Dense projection) is refused by name: its vectors would differ from sentence-transformers'.
"""

import json
import os

import numpy as np

from ..errors import NotSupportedError
from ..session.inference import InferenceSession

#: sentence-transformers' pooling modes, in the order its Pooling module concatenates them
POOLING = ("cls", "max", "mean", "mean_sqrt_len_tokens", "weightedmean", "lasttoken")
# the keys of its older configuration format
_OLD_KEYS = {
    "pooling_mode_cls_token": "cls",
    "pooling_mode_max_tokens": "max",
    "pooling_mode_mean_tokens": "mean",
    "pooling_mode_mean_sqrt_len_tokens": "mean_sqrt_len_tokens",
    "pooling_mode_weightedmean_tokens": "weightedmean",
    "pooling_mode_lasttoken": "lasttoken",
}

#: output names that hold the token embeddings (optimum's, sentence-transformers' exports)
TOKEN_OUTPUTS = ("last_hidden_state", "token_embeddings")


class Embedder:
    """An ONNX sentence-embedding model: `embed(items)` -> (float32 [n, dim] unit vectors, tokens).

    path: the .onnx file; tokenizer: a tokenizer.json path (default: the one next to the model,
    else in its parent folder, as Hugging Face repositories keep exports in onnx/); context: the
    MLContext (default: the process's); max_length: tokens per input, longer ones are cut (default:
    the tokenizer's own truncation length, else 512, BERT's positions); pooling: a mode of
    POOLING or a tuple of them (concatenated), and normalize: L2-normalise the vectors (default
    for both: the model's sentence-transformers configuration, else mean and True)."""

    def __init__(self, path, *, tokenizer=None, context=None, max_length=None, pooling=None, normalize=None):
        from tokenizers import Tokenizer  # the llm / serve extra

        if not os.path.isfile(path):
            raise FileNotFoundError(f"[Embedder] no such file: {path}")
        here = os.path.dirname(os.path.abspath(path))
        candidates = (
            [tokenizer] if tokenizer else [os.path.join(d, "tokenizer.json") for d in (here, os.path.dirname(here))]
        )
        tok_path = next((c for c in candidates if os.path.isfile(c)), None)
        if tok_path is None:
            raise FileNotFoundError(f"[Embedder] no tokenizer.json for the model (looked for {', '.join(candidates)})")
        self.path = path
        self.tokenizer = Tokenizer.from_file(tok_path)
        if max_length is None:
            max_length = (self.tokenizer.truncation or {}).get("max_length") or 512
        self.tokenizer.no_padding()
        self.tokenizer.no_truncation()
        self.max_length = int(max_length)
        self.vocab_size = self.tokenizer.get_vocab_size(with_added_tokens=True)
        self.session = InferenceSession(path, context)
        inputs = {i.name: i for i in self.session.get_inputs()}
        if "input_ids" not in inputs:
            raise ValueError(f"[Embedder] the model has no input_ids input (inputs: {', '.join(inputs)})")
        self.inputs = inputs
        outs = [o.name for o in self.session.get_outputs()]
        self.output = next((o for o in TOKEN_OUTPUTS if o in outs), outs[0])
        self.pad_id = self._pad_id()
        modes, norm = st_config(here)
        self.pooling = tuple([pooling] if isinstance(pooling, str) else pooling or modes)
        self.normalize = norm if normalize is None else bool(normalize)
        bad = [m for m in self.pooling if m not in POOLING]
        if bad or not self.pooling:
            raise ValueError(f"[Embedder] pooling must be among {', '.join(POOLING)}, got {self.pooling}")

    def _pad_id(self):
        p = self.tokenizer.padding
        if p and "pad_id" in p:
            return int(p["pad_id"])
        for t in ("[PAD]", "<pad>"):
            i = self.tokenizer.token_to_id(t)
            if i is not None:
                return i
        return 0

    def encode(self, items):
        """Token ids of each item (str: tokenized with the special tokens; ids: as given), cut to
        max_length."""
        out = []
        for it in items:
            ids = self.tokenizer.encode(it).ids if isinstance(it, str) else list(it)
            out.append(ids[: self.max_length] or [self.pad_id])
        return out

    def _dtype(self, name):
        t = str(self.inputs[name].type)
        return np.int32 if "int32" in t else np.int64

    def embed(self, items):
        """(vectors [n, dim] float32, the number of tokens read): one run for all of `items`."""
        ids = self.encode(items)
        n, s = len(ids), max(len(x) for x in ids)
        tokens = np.full((n, s), self.pad_id, np.int64)
        mask = np.zeros((n, s), np.int64)
        for i, x in enumerate(ids):
            tokens[i, : len(x)] = x
            mask[i, : len(x)] = 1
        feeds = {"input_ids": tokens.astype(self._dtype("input_ids"))}
        if "attention_mask" in self.inputs:
            feeds["attention_mask"] = mask.astype(self._dtype("attention_mask"))
        if "token_type_ids" in self.inputs:
            feeds["token_type_ids"] = np.zeros((n, s), self._dtype("token_type_ids"))
        (hidden,) = self.session.run([self.output], feeds)
        return pool(hidden, mask, self.pooling, self.normalize), int(mask.sum())


def st_config(folder):
    """(pooling modes, normalize) from the sentence-transformers files in `folder` or its parent
    (module doc); (("mean",), True) when there are none."""
    for d in (folder, os.path.dirname(folder)):
        path = os.path.join(d, "modules.json")
        if os.path.isfile(path):
            break
    else:
        return ("mean",), True
    with open(path, encoding="utf-8") as f:
        modules = json.load(f)
    modes, norm = ("mean",), False
    for m in modules:
        kind = str(m.get("type", "")).rsplit(".", 1)[-1]
        if kind == "Transformer":
            continue
        if kind == "Normalize":
            norm = True
        elif kind == "Pooling":
            with open(os.path.join(d, m.get("path", ""), "config.json"), encoding="utf-8") as f:
                modes = _pooling_modes(json.load(f))
        else:
            raise NotSupportedError(
                f"[Embedder] the sentence-transformers module {m.get('type')} ({path}) is not supported "
                "(supported: Transformer, Pooling, Normalize)"
            )
    return modes, norm


def _pooling_modes(cfg):
    if cfg.get("include_prompt", True) is not True:
        raise NotSupportedError("[Embedder] pooling with include_prompt false is not supported")
    if "pooling_mode" in cfg:  # sentence-transformers 6: a mode or a list of them, in that order
        mode = cfg["pooling_mode"]
        return tuple([mode] if isinstance(mode, str) else mode)
    return tuple(_OLD_KEYS[k] for k in sorted(_OLD_KEYS, key=lambda k: POOLING.index(_OLD_KEYS[k])) if cfg.get(k))


def pool(hidden, mask, modes=("mean",), normalize=True):
    """The token embeddings pooled over the tokens where mask is 1 by each of `modes`
    (concatenated), then L2-normalised if asked: sentence-transformers' Pooling and Normalize,
    whose clamps these are."""
    hidden = np.asarray(hidden, np.float32)
    if hidden.ndim == 2:  # a model that pools itself: [batch, dim]
        v = hidden
    else:
        m = np.asarray(mask, np.float32)[:, :, None]
        n = np.maximum(m.sum(1), 1e-9)
        parts = []
        for mode in modes:
            if mode == "cls":
                parts.append(hidden[:, 0])
            elif mode == "max":
                parts.append(np.where(m > 0, hidden, -1e9).max(1))
            elif mode in ("mean", "mean_sqrt_len_tokens"):
                parts.append((hidden * m).sum(1) / (n if mode == "mean" else np.sqrt(n)))
            elif mode == "weightedmean":
                w = m * np.arange(1, m.shape[1] + 1, dtype=np.float32)[None, :, None]
                parts.append((hidden * w).sum(1) / np.maximum(w.sum(1), 1e-9))
            else:  # lasttoken: the last token the mask keeps (padding on the right)
                last = np.maximum(m[:, :, 0].sum(1).astype(np.int64) - 1, 0)
                parts.append(hidden[np.arange(hidden.shape[0]), last])
        v = np.concatenate(parts, axis=1)
    if normalize:
        v = v / np.maximum(np.linalg.norm(v, axis=1, keepdims=True), 1e-12)
    return v.astype(np.float32)
