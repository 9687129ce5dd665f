"""Sentence embeddings for POST /v1/embeddings: an ONNX encoder (a sentence-transformers model's
export: inputs input_ids, attention_mask and maybe token_type_ids; output the token embeddings,
[batch, sequence, hidden]) run by mltensor's InferenceSession, then mean pooling over the
attention mask and L2 normalisation, as sentence-transformers' Pooling(mean) + Normalize do.

A request's inputs run as one batch (padded to the longest, at most `max_length` tokens each; the
pooling ignores the padding). The tokenizer is the `tokenizer.json` next to the model or in its
parent folder (the `tokenizers` package), with its own special tokens ([CLS] ... [SEP]); token ids
given by the client are taken as they are. Mean pooling only: a model trained for its [CLS]
vector (pooling_mode_cls_token) gets other vectors than sentence-transformers gives.
"""

import os

import numpy as np

from ..session.inference import InferenceSession

#: output names that hold the token embeddings (optimum's, sentence-transformers' exports)
TOKEN_OUTPUTS = ("last_hidden_state", "token_embeddings")


class Embedder:
    """An ONNX sentence-embedding model: `embed(items)` -> (float32 [n, dim] unit vectors, tokens).

    path: the .onnx file; tokenizer: a tokenizer.json path (default: the one next to the model,
    else in its parent folder, as Hugging Face repositories keep exports in onnx/); context: the
    MLContext (default: the process's); max_length: tokens per input, longer ones are cut (default:
    the tokenizer's own truncation length, else 512, BERT's positions)."""

    def __init__(self, path, *, tokenizer=None, context=None, max_length=None):
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
        return pool(hidden, mask), int(mask.sum())


def pool(hidden, mask):
    """Mean of the token embeddings where mask is 1, then L2-normalised (sentence-transformers'
    Pooling(mean) and Normalize, whose clamps these are)."""
    hidden = np.asarray(hidden, np.float32)
    if hidden.ndim == 2:  # a model that pools itself: [batch, dim]
        v = hidden
    else:
        m = np.asarray(mask, np.float32)[:, :, None]
        v = (hidden * m).sum(1) / np.maximum(m.sum(1), 1e-9)
    norm = np.maximum(np.linalg.norm(v, axis=1, keepdims=True), 1e-12)
    return (v / norm).astype(np.float32)
