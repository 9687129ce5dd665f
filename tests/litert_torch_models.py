"""torchvision models converted to .tflite by litert-torch (Google's PyTorch-to-LiteRT converter,
successor of ai-edge-torch): the test set of tests/test_tflite_litert_torch.py.

Run with a Python that has `litert-torch` and `torchvision` (never imported by the test process;
see MLTENSOR_LITERT_TORCH_PYTHON in docs/guides/environment.md):

    python tests/litert_torch_models.py OUT_DIR [NAME...]

writes OUT_DIR/<name>.tflite for each model (random weights, seeded; batch-norm statistics taken from
random inputs) and OUT_DIR/versions.json.
"""

import json
import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
os.environ.setdefault("CUDA_VISIBLE_DEVICES", "")

import litert_torch  # noqa: E402
import torch  # noqa: E402
import torchvision  # noqa: E402

# name -> (torchvision builder, keyword arguments, input shape)
MODELS = {
    "mobilenet_v3_small": ("mobilenet_v3_small", {}, (1, 3, 96, 96)),
    "resnet18": ("resnet18", {}, (1, 3, 64, 64)),
    "efficientnet_b0": ("efficientnet_b0", {}, (1, 3, 64, 64)),
    "vit_small": (
        "VisionTransformer",
        dict(image_size=32, patch_size=8, num_layers=2, num_heads=4, hidden_dim=64, mlp_dim=128, num_classes=10),
        (1, 3, 32, 32),
    ),
}


def build(name):
    fn, kw, shape = MODELS[name]
    torch.manual_seed(0)
    if fn == "VisionTransformer":
        from torchvision.models.vision_transformer import VisionTransformer

        model = VisionTransformer(**kw)
        torch.nn.init.normal_(model.heads.head.weight, std=0.5)  # (zeros as torchvision initializes it)
    else:
        model = getattr(torchvision.models, fn)(weights=None, **kw)
    # batch-norm statistics of the random network's own activations (with the initial ones, 1 and
    # 0, EfficientNet's outputs vanish to 1e-13): a few forward passes in training mode
    model.train()
    with torch.no_grad():
        for _ in range(10):
            model(torch.randn((4, *shape[1:])))
    return model.eval(), torch.randn(shape)


def main(out, names):
    os.makedirs(out, exist_ok=True)
    for name in names or list(MODELS):
        model, x = build(name)
        edge = litert_torch.convert(model, (x,))
        path = os.path.join(out, f"{name}.tflite")
        edge.export(path + ".part")
        os.replace(path + ".part", path)
    import importlib.metadata as meta

    versions = {p: meta.version(p) for p in ("litert-torch", "torch", "torchvision", "ai-edge-litert")}
    with open(os.path.join(out, "versions.json"), "w") as f:
        json.dump(versions, f)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2:])
