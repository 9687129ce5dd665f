"""Batch segmentation of folders of images and videos on Ray Data, one InferenceSession per worker.

    python examples/batch_segmentation.py photos/ clips/*.mp4 --output out/           # local Ray
    python examples/batch_segmentation.py /shared/in --output /shared/out --address auto   # a cluster
    python examples/batch_segmentation.py in/ -o out/ --model seg.onnx --preprocess imagenet --postprocess softmax

Needs Ray Data (`pip install 'mltensor[ray]'`). The implementation is mltensor/apps/batch.py (also
installed as `mltensor-batch`).
"""

import sys

from mltensor.apps.batch import main

if __name__ == "__main__":
    sys.exit(main())
