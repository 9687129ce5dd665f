"""POST /v1/embeddings (issue 44): a real BERT export (tests/corpus.py's "bert": a transformers
BertModel from a small configuration with seeded random weights, exported by torch.onnx.export)
with a WordPiece tokenizer.json beside it, served by mltensor.serve's Embedder (InferenceSession,
one padded batch per request, mean pooling over the attention mask, L2 normalisation), against the
same pooling computed by torch on the transformers model in a child process (torch never loads
in this process: see tests/corpus.py)."""

import hashlib
import importlib.util
import json
import os
import shutil
import subprocess
import sys

import numpy as np
import pytest

pytest.importorskip("tokenizers")
openai = pytest.importorskip("openai")
pytest.importorskip("fastapi")
pytest.importorskip("sse_starlette")
pytest.importorskip("prometheus_client")
if not (importlib.util.find_spec("torch") and importlib.util.find_spec("transformers")):
    pytest.skip("the reference needs torch and transformers (the models extra)", allow_module_level=True)

import corpus  # noqa: E402
from mltensor.errors import NotSupportedError  # noqa: E402
from mltensor.serve import Embedder, create_app  # noqa: E402

from serve_helpers import ThreadServer, post  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
TEXTS = ["the cat sat on the mat", "hello world", "a dog", "zebra 42 quietly runs over the small red hill today"]
WORDS = "the cat sat on mat hello world a dog runs over small red hill today quiet ##ly".split()

# the reference: the corpus case's model rebuilt as its export process builds it (torch.manual_seed(0)
# before the build), sentence-transformers' mean pooling and normalisation in torch
REFERENCE = """
import json, sys
import numpy as np
import torch
import corpus
from tokenizers import Tokenizer

tok_path, out, texts = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
torch.manual_seed(0)
e = corpus.CASES["bert"].build(False)
with torch.no_grad():
    for p in e.module.parameters():
        if p.ndim >= 2 and not p.any():
            p.normal_(0.0, 0.02)
tok = Tokenizer.from_file(tok_path)
rows = []
for t in texts:  # one at a time: no padding at all in the reference
    ids = torch.tensor([tok.encode(t).ids])
    mask = torch.ones_like(ids)
    with torch.no_grad():
        h = e.module(ids, mask)[0]
    m = mask.unsqueeze(-1).float()
    v = (h * m).sum(1) / torch.clamp(m.sum(1), min=1e-9)
    rows.append(torch.nn.functional.normalize(v, p=2, dim=1)[0].numpy())
np.save(out, np.stack(rows))
"""


def _tokenizer_json(path):
    """A WordPiece tokenizer of the corpus BERT's 128 ids (BERT's normalizer, pre-tokenizer and
    [CLS] ... [SEP] template)."""
    from tokenizers import Tokenizer, models, normalizers, pre_tokenizers, processors

    vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"] + WORDS
    vocab += [c for c in "abcdefghijklmnopqrstuvwxyz0123456789" if c not in vocab]
    vocab += ["##" + c for c in "abcdefghijklmnopqrstuvwxyz0123456789"]
    assert len(vocab) <= 128
    tok = Tokenizer(models.WordPiece({t: i for i, t in enumerate(vocab)}, unk_token="[UNK]"))
    tok.normalizer = normalizers.BertNormalizer(lowercase=True)
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tok.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]", special_tokens=[("[CLS]", 2), ("[SEP]", 3)]
    )
    tok.save(str(path))


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    d = tmp_path_factory.mktemp("embed")  # as Hugging Face repositories lay them out: onnx/model.onnx
    (d / "onnx").mkdir()
    shutil.copy(corpus.export("bert"), d / "onnx" / "model.onnx")
    _tokenizer_json(d / "tokenizer.json")
    return d


def _child(script, *args, timeout):
    """Run a reference script in a child process (torch is never imported beside wgpu)."""
    r = subprocess.run(
        [sys.executable, "-c", script, *args],
        capture_output=True,
        text=True,
        cwd=HERE,
        env=dict(os.environ, PYTHONPATH=os.pathsep.join([HERE, os.path.dirname(HERE)])),
        timeout=timeout,
    )
    assert r.returncode == 0, r.stderr[-3000:]


@pytest.fixture(scope="module")
def reference(model_dir):
    """The torch reference, computed once and kept in the corpus cache (keyed by its versions and
    by this reference's script, texts and vocabulary)."""
    key = hashlib.sha256((REFERENCE + json.dumps([TEXTS, WORDS])).encode()).hexdigest()[:12]
    out = os.path.join(corpus.corpus_dir(), f"serve-embeddings-{key}.npy")
    if not os.path.exists(out):
        os.makedirs(os.path.dirname(out), exist_ok=True)
        tmp = out + f".{os.getpid()}.npy"
        _child(REFERENCE, str(model_dir / "tokenizer.json"), tmp, json.dumps(TEXTS), timeout=600)
        os.replace(tmp, out)
    return np.load(out)


@pytest.fixture(scope="module")
def server(model_dir):
    emb = Embedder(str(model_dir / "onnx" / "model.onnx"))
    assert emb.max_length == 512
    with ThreadServer(create_app({}, {"bert": emb})) as s:
        s.embedder = emb
        yield s


def test_embeddings_match_torch_pooling(server, reference):
    client = server.client()
    r = client.embeddings.create(model="bert", input=TEXTS)  # the client asks for base64
    got = np.array([d.embedding for d in r.data], np.float32)
    assert [d.index for d in r.data] == list(range(len(TEXTS)))
    assert got.shape == reference.shape and reference.shape[1] == 32
    np.testing.assert_allclose(np.linalg.norm(got, axis=1), 1.0, rtol=1e-5)
    np.testing.assert_allclose(got, reference, atol=2e-5)  # the batch is padded; the pooling ignores it
    n_tokens = sum(len(server.embedder.tokenizer.encode(t).ids) for t in TEXTS)
    assert r.usage.prompt_tokens == r.usage.total_tokens == n_tokens
    # as floats in the JSON; token ids in
    f = client.embeddings.create(model="bert", input=TEXTS, encoding_format="float")
    np.testing.assert_allclose([d.embedding for d in f.data], reference, atol=2e-5)
    ids = [server.embedder.tokenizer.encode(t).ids for t in TEXTS]
    t = client.embeddings.create(model="bert", input=ids[::-1], encoding_format="float")
    np.testing.assert_allclose([d.embedding for d in t.data], reference[::-1], atol=2e-5)
    one = client.embeddings.create(model="bert", input=TEXTS[1], encoding_format="float")
    assert len(one.data) == 1
    np.testing.assert_allclose(one.data[0].embedding, reference[1], atol=2e-5)
    assert [m.id for m in client.models.list().data] == ["bert"]


def test_embedding_errors(server):
    client = server.client()
    with pytest.raises(openai.NotFoundError):
        client.embeddings.create(model="nope", input="x")
    for body in (
        {"model": "bert"},
        {"model": "bert", "input": []},
        {"model": "bert", "input": [1, "a"]},
        {"model": "bert", "input": [[500]]},
        {"model": "bert", "input": "x", "encoding_format": "int8"},
        {"model": "bert", "input": "x", "dimensions": 8},
    ):
        r = post(server.url + "/v1/embeddings", body)
        assert r.status_code == 400 and r.json()["error"]["message"], (body, r.text)
    with pytest.raises(openai.NotFoundError):  # no language model here
        client.completions.create(model="bert", prompt="x")


# sentence-transformers itself as the reference for its pooling configurations: the corpus BERT
# saved as a SentenceTransformer (Transformer, Pooling(modes)[, Normalize]) in its own format, or
# rewritten to the older format (pooling_mode_*_token keys, sentence_transformers.models.* types)
# and loaded back, then encode() one text at a time; the ONNX export sits in its onnx/ folder
ST_REFERENCE = """
import json, os, sys, warnings
warnings.filterwarnings("ignore")
import numpy as np
import torch
import corpus
from transformers import PreTrainedTokenizerFast
from sentence_transformers import SentenceTransformer
from sentence_transformers.sentence_transformer.modules import Normalize, Pooling, Transformer

tok_path, cases, texts = sys.argv[1], json.loads(sys.argv[2]), json.loads(sys.argv[3])
torch.manual_seed(0)
bert = corpus.CASES["bert"].build(False).module.m
with torch.no_grad():
    for p in bert.parameters():
        if p.ndim >= 2 and not p.any():
            p.normal_(0.0, 0.02)
keys = {"cls": "pooling_mode_cls_token", "max": "pooling_mode_max_tokens", "mean": "pooling_mode_mean_tokens",
        "mean_sqrt_len_tokens": "pooling_mode_mean_sqrt_len_tokens",
        "weightedmean": "pooling_mode_weightedmean_tokens", "lasttoken": "pooling_mode_lasttoken"}
for out, modes, norm, old in cases:
    hf = os.path.join(out, "hf")
    bert.save_pretrained(hf)
    PreTrainedTokenizerFast(
        tokenizer_file=tok_path, pad_token="[PAD]", unk_token="[UNK]", cls_token="[CLS]", sep_token="[SEP]"
    ).save_pretrained(hf)
    mods = [Transformer(hf), Pooling(bert.config.hidden_size, pooling_mode=tuple(modes))]
    st = os.path.join(out, "st")
    SentenceTransformer(modules=mods + ([Normalize()] if norm else [])).save(st)
    if old:
        cfg = {"word_embedding_dimension": bert.config.hidden_size, "include_prompt": True}
        cfg.update({k: m in modes for m, k in keys.items()})
        json.dump(cfg, open(os.path.join(st, "1_Pooling", "config.json"), "w"))
        mj = [{"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
              {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"}]
        if norm:
            mj.append({"idx": 2, "name": "2", "path": "2_Normalize", "type": "sentence_transformers.models.Normalize"})
        json.dump(mj, open(os.path.join(st, "modules.json"), "w"))
    model = SentenceTransformer(st)
    np.save(os.path.join(out, "ref.npy"), np.stack([model.encode([t], convert_to_numpy=True)[0] for t in texts]))
"""

ST_CASES = {
    "cls": (["cls"], False, False),  # (BGE's pooling, no Normalize module)
    "max+mean, normalized": (["max", "mean"], True, False),
    "older format: lasttoken + mean_sqrt_len, normalized": (["mean_sqrt_len_tokens", "lasttoken"], True, True),
    "older format: weightedmean": (["weightedmean"], False, True),
}


@pytest.fixture(scope="module")
def st_models(model_dir):
    if importlib.util.find_spec("sentence_transformers") is None:  # (found, not imported: torch)
        pytest.skip("the reference needs sentence-transformers (the models extra)")
    dirs, todo = {}, []
    for name, (modes, norm, old) in ST_CASES.items():
        key = hashlib.sha256((ST_REFERENCE + json.dumps([TEXTS, WORDS, modes, norm, old])).encode()).hexdigest()[:12]
        dirs[name] = d = os.path.join(corpus.corpus_dir(), f"serve-st-{key}")
        if not os.path.exists(os.path.join(d, "ref.npy")):
            todo.append((d, d + f".{os.getpid()}", modes, norm, old))
    if todo:  # (one child process: one torch import for every case)
        cases = [(tmp, modes, norm, old) for _, tmp, modes, norm, old in todo]
        _child(ST_REFERENCE, str(model_dir / "tokenizer.json"), json.dumps(cases), json.dumps(TEXTS), timeout=900)
        for d, tmp, *_ in todo:
            os.makedirs(os.path.join(tmp, "st", "onnx"), exist_ok=True)
            shutil.copy(corpus.export("bert"), os.path.join(tmp, "st", "onnx", "model.onnx"))
            shutil.rmtree(d, ignore_errors=True)
            os.replace(tmp, d)
    return dirs


@pytest.mark.parametrize("case", list(ST_CASES))
def test_pooling_as_sentence_transformers_configures_it(st_models, case):
    """The Embedder reads the model's modules.json and pooling config (sentence-transformers' own
    files, both formats) and gives sentence-transformers' vectors."""
    d = st_models[case]
    emb = Embedder(os.path.join(d, "st", "onnx", "model.onnx"))
    modes, norm, _ = ST_CASES[case]
    assert emb.pooling == tuple(modes if not ST_CASES[case][2] else sorted(modes, key=POOLING_ORDER.index))
    assert emb.normalize is norm
    got, _ = emb.embed(TEXTS)
    np.testing.assert_allclose(got, np.load(os.path.join(d, "ref.npy")), atol=2e-5)


POOLING_ORDER = ["cls", "max", "mean", "mean_sqrt_len_tokens", "weightedmean", "lasttoken"]


def test_unsupported_module_is_refused(st_models, tmp_path):
    """A Dense projection after the pooling (some sentence-transformers models have one) is refused
    by name instead of giving other vectors."""
    src = os.path.join(st_models["cls"], "st")
    d = tmp_path / "dense"
    shutil.copytree(src, d)
    mj = json.load(open(d / "modules.json"))
    mj.append({"idx": 2, "name": "2", "path": "2_Dense", "type": "sentence_transformers.models.Dense"})
    json.dump(mj, open(d / "modules.json", "w"))
    with pytest.raises(NotSupportedError, match="Dense"):
        Embedder(str(d / "onnx" / "model.onnx"))
