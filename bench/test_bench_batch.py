"""The Ray Data batch app: frames per second with 1 and with 2 actors, same inputs, same run.

Ours: 2 actors (`mltensor-batch --workers 2`); reference: 1 actor. Each run starts and stops its
own local Ray and processes the same folder of generated images (the demo scene) end to end:
decode, segment with one InferenceSession per actor, composite, write PNGs. Ray's start-up is
outside the timed region only in part (actors start inside it), as a user would see it. On a
2-core software adapter the two actors share the cores that lavapipe already uses, so the ratio
says more on a machine with a GPU per actor.
"""

import os

import pytest

ray = pytest.importorskip("ray")
Image = pytest.importorskip("PIL.Image")

import mltensor  # noqa: E402
from mltensor.apps import batch  # noqa: E402
from mltensor.apps.video_frames import DemoSource  # noqa: E402

from .timing import measure, record  # noqa: E402

N_IMAGES = 16


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    try:
        mltensor.models.fetch("selfie_segmentation", progress=False)
    except Exception as e:  # noqa: BLE001
        pytest.skip(f"model not available: {e}")
    d = tmp_path_factory.mktemp("batch-in")
    src = DemoSource(320, 180, frames=N_IMAGES)
    for i in range(N_IMAGES):
        Image.fromarray(src.frame(i)).save(os.path.join(d, f"f{i:03d}.png"))
    return str(d)


def test_batch_one_vs_two_actors(benchmark, folder, tmp_path):
    cpus = max(2, os.cpu_count() or 2)
    summaries = {}

    def run(workers):
        s = batch.run_batch([folder], str(tmp_path / f"out{workers}"), workers=workers, ray_init={"num_cpus": cpus})
        assert s["ok"] == N_IMAGES, batch.format_summary(s)
        summaries[workers] = s

    two = measure(lambda: run(2), rounds=1, warmup=0)
    one = measure(lambda: run(1), rounds=1, warmup=0)
    info = record(
        benchmark,
        two,
        f"batch segmentation, {N_IMAGES} images 320x180, Ray Data",
        ref=one,
        ref_name="1 actor",
        frames_per_s=N_IMAGES / two["total_s"],
        ref_frames_per_s=N_IMAGES / one["total_s"],
        resources=summaries[2]["resources"],
        per_worker={k: round(v["frames_per_s"], 2) for k, v in summaries[2]["per_worker"].items()},
    )
    print(
        f"\n[batch] 2 actors {info['frames_per_s']:.2f} frames/s vs 1 actor {info['ref_frames_per_s']:.2f} "
        f"frames/s: x{info['ratio']:.2f} ({summaries[2]['resources']})"
    )
