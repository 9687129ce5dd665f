"""
Selfie segmentation of a video, every frame on the GPU
======================================================

A short headless run of ``examples/selfie_segmentation.py`` (the README's first command, with
fewer and smaller frames so the docs build stays quick): the demo source (a synthetic camera move
over a photo) is segmented by MediaPipe's selfie segmentation model and its background blurred.
The frames never leave the GPU between upload and the composited result; the summary's counters
show it. The snapshot (the last composited frame) is shown below.

The model is fetched once from PyPI (inside the ``mediapipe`` wheel) and cached.
"""

import os
import tempfile

import matplotlib.pyplot as plt
from PIL import Image

from mltensor.apps.selfie_segmentation import main

out = tempfile.mkdtemp(prefix="mltensor-gallery-")
video, snapshot = os.path.join(out, "out.mp4"), os.path.join(out, "out.png")
# main() returns the exit status; assigned, so the page does not print it as the block's value
status = main(["--frames", "12", "--size", "480x270", "--output", video, "--snapshot", snapshot])
assert status == 0, status

# %%
# The snapshot: the person keeps its pixels, the background is blurred.

frame = Image.open(snapshot)
fig, ax = plt.subplots(figsize=(6.4, 3.6), dpi=100)
ax.imshow(frame)
ax.set_axis_off()
fig.tight_layout(pad=0)
plt.show()
