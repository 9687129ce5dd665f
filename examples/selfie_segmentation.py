"""Real-time selfie segmentation, all on the GPU: background blur (or replacement) of a video.

    python examples/selfie_segmentation.py                       # demo source; window, or .mp4 headless
    python examples/selfie_segmentation.py --frames 30 --output out.mp4 --snapshot out.png
    python examples/selfie_segmentation.py --source webcam
    python examples/selfie_segmentation.py --source clip.mp4 --effect replace --background beach.jpg

The implementation is mltensor/apps/selfie_segmentation.py and its video_*.py modules (also installed as
`mltensor-selfie`).
"""

import sys

from mltensor.apps.selfie_segmentation import main

if __name__ == "__main__":
    sys.exit(main())
