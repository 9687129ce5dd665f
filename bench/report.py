"""Run the benchmark suite and write bench/results/REPORT.md (tables of ratios + PNG plots).

    python -m bench.report                  # whole suite, this machine's adapter
    python -m bench.report -k matmul        # a subset (pytest -k expression)
    python -m bench.report --name h100      # writes REPORT-h100.md (for runs on other machines)

Every figure comes from bench/ tests run in this same invocation; each row shows our figure, the
reference measured in the same run, and the ratio (reference time / our time: > 1 means faster).
"""

import argparse
import datetime
import json
import os
import platform
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
RESULTS = os.path.join(HERE, "results")


def run_suite(json_path, extra):
    cmd = [
        sys.executable,
        "-m",
        "pytest",
        HERE,
        "-q",
        "-p",
        "no:randomly",
        "-s",
        "--benchmark-json",
        json_path,
        "--benchmark-columns=median",
        *extra,
    ]
    print("running:", " ".join(cmd), flush=True)
    return subprocess.call(cmd, cwd=os.path.dirname(HERE))


def adapter_stamp():
    import mltensor  # noqa: F401  (first: it gives wgpu an XDG_RUNTIME_DIR, see mltensor/_xdg.py)
    import wgpu

    a = wgpu.gpu.request_adapter_sync(power_preference="high-performance")
    i = a.info
    return {
        "adapter": i["device"],
        "driver": i.get("description", ""),
        "backend": i["backend_type"],
        "type": i["adapter_type"],
    }


def _fmt_time(s):
    if s is None:
        return "-"
    if s >= 1:
        return f"{s:.2f} s"
    if s >= 1e-3:
        return f"{s * 1e3:.2f} ms"
    return f"{s * 1e6:.1f} µs"


def _ours(info):
    if info.get("ours_rate") is not None:
        return f"{info['ours_rate']:.3g} {info['unit']}"
    return _fmt_time(info.get("ours_total_s"))


def _ref(info):
    if info.get("ref_missing"):
        return f"{info.get('ref_name')}: not installed"
    if info.get("ref_total_s") is None:
        return "-"
    val = (
        f"{info['ref_rate']:.3g} {info['unit']}" if info.get("ref_rate") is not None else _fmt_time(info["ref_total_s"])
    )
    return f"{info.get('ref_name')}: {val}"


_SKIP = {
    "group",
    "ours_total_s",
    "ours_enqueue_s",
    "ours_rate",
    "unit",
    "ref_name",
    "ref_total_s",
    "ref_rate",
    "ratio",
    "ref_missing",
}


def _details(info):
    parts = []
    for k, v in info.items():
        if k in _SKIP:
            continue
        if isinstance(v, float):
            v = f"{v:.4g}"
        parts.append(f"{k}={v}")
    return ", ".join(parts)


def write_report(data, stamp, out_md, plot_png, profile_text):
    rows = []
    for b in data.get("benchmarks", []):
        info = b.get("extra_info", {})
        if "group" not in info:
            continue
        rows.append((info["group"], b["name"], info))
    groups = {}
    for g, name, info in rows:
        groups.setdefault(g, []).append((name, info))
    lines = [
        "# mltensor benchmark report",
        "",
        f"- adapter: **{stamp['adapter']}** ({stamp['backend']}, {stamp['type']}), driver: {stamp['driver']}",
        f"- date: {stamp['date']}, host: {platform.machine()} with {os.cpu_count()} cores, Python {platform.python_version()}",
        "- every reference was measured in the same run; ratio = reference time / our time (> 1: mltensor is faster)",
        "- times are medians of total time (enqueue + wait for the GPU); enqueue time alone is listed as well",
        "",
    ]
    for g, items in groups.items():
        if g == "kernel counts":  # its own table below: counts, not times
            continue
        lines += [
            f"## {g}",
            "",
            "| benchmark | mltensor | enqueue | reference | ratio | details |",
            "|---|---|---|---|---|---|",
        ]
        for name, info in items:
            ratio = f"{info['ratio']:.2f}x" if info.get("ratio") else "-"
            lines.append(
                f"| {name.removeprefix('test_')} | {_ours(info)} | {_fmt_time(info.get('ours_enqueue_s'))} | "
                f"{_ref(info)} | {ratio} | {_details(info)} |"
            )
        lines.append("")
    counts = groups.get("kernel counts", [])
    if counts:
        # issue 15: kernels one dispatch launches, copy-free concat off (every concat input copied,
        # MLTENSOR_NO_PLACEMENT=1) vs on, both built in this run
        lines += [
            "## kernel counts",
            "",
            "| model | kernels before | kernels after | concat kernels before | concat kernels after |",
            "|---|---|---|---|---|",
        ]
        for _, info in counts:
            lines.append(
                f"| {info['model']} | {info['kernels_before']} | {info['kernels_after']} | "
                f"{info['concat_before']} | {info['concat_after']} |"
            )
        lines.append("")
    if profile_text:
        lines += ["## GPU time per kernel (timestamp queries)", "", "```", profile_text, "```", ""]
    if plot_png:
        lines += ["## Ratios", "", f"![ratios]({os.path.basename(plot_png)})", ""]
    with open(out_md, "w") as f:
        f.write("\n".join(lines))
    return rows


def plot(rows, png, stamp):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    pts = [(n.removeprefix("test_"), info["ratio"]) for g, n, info in rows if info.get("ratio")]
    if not pts:
        return None
    labels, ratios = zip(*pts)
    fig, ax = plt.subplots(figsize=(10, 0.32 * len(pts) + 1.6))
    colors = ["tab:green" if r >= 1 else "tab:red" for r in ratios]
    # bars grow from 1 (parity) to the ratio, so slower and faster read the same way on a log axis
    ax.barh(range(len(pts)), [r - 1 for r in ratios], left=1, color=colors)
    for i, r in enumerate(ratios):
        ax.text(
            r * (1.15 if r >= 1 else 1 / 1.15),
            i,
            f"{r:.2g}x",
            va="center",
            ha="left" if r >= 1 else "right",
            fontsize=7,
        )
    ax.set_yticks(range(len(pts)), labels, fontsize=8)
    ax.axvline(1.0, color="k", lw=0.8)
    ax.set_xscale("log")
    lo, hi = min(ratios + (1,)), max(ratios + (1,))
    ax.set_xlim(lo / 4, hi * 4)
    ax.set_xlabel("reference time / mltensor time (log scale; right of 1: mltensor is faster)")
    ax.set_title(f"mltensor vs same-run references, {stamp['adapter']}", fontsize=10)
    ax.invert_yaxis()
    fig.tight_layout()
    fig.savefig(png, dpi=110)
    return png


def profile_table():
    """Per-kernel GPU time of a small conv net built with the builder (timestamp queries)."""
    try:
        import numpy as np

        import mltensor
        from mltensor.runtime.profiler import format_profile, profile_dispatch

        ctx = mltensor.ml.create_context_sync(power_preference="high-performance")
        if "timestamp-query" not in ctx.device.features:
            return "(adapter has no timestamp-query)"
        rng = np.random.default_rng(0)
        b = mltensor.MLGraphBuilder(ctx)
        x = b.input("x", data_type="float32", shape=[1, 64, 64, 16])
        y = x
        for i in range(3):
            w = b.constant((rng.standard_normal((16, 3, 3, 16)) * 0.1).astype(np.float32))
            y = b.hard_swish(b.conv2d(y, w, padding=[1, 1, 1, 1], input_layout="nhwc", filter_layout="ohwi"))
            dw = b.constant((rng.standard_normal((1, 3, 3, 16)) * 0.1).astype(np.float32))
            y = b.relu(b.conv2d(y, dw, padding=[1, 1, 1, 1], groups=16, input_layout="nhwc", filter_layout="ihwo"))
        y = b.sigmoid(b.reduce_mean(y, axes=[1, 2]))
        g = b.build_sync({"y": y})
        t_in = ctx.create_tensor_sync(data_type="float32", shape=[1, 64, 64, 16], writable=True)
        t_out = ctx.create_tensor_sync(data_type="float32", shape=list(g.output_descriptors["y"][1]), readable=True)
        return "small NHWC conv net, 1x64x64x16:\n" + format_profile(
            profile_dispatch(ctx, g, {"x": t_in}, {"y": t_out})
        )
    except Exception as e:  # the report still gets written
        return f"(profile failed: {e})"


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--name", default="", help="suffix for REPORT-<name>.md (e.g. the device)")
    ap.add_argument("-k", default=None, help="pytest -k expression to run a subset")
    ap.add_argument("--from-json", default=None, help="write the report from an existing JSON run")
    args = ap.parse_args(argv)
    os.makedirs(RESULTS, exist_ok=True)
    suffix = f"-{args.name}" if args.name else ""
    json_path = args.from_json or os.path.join(RESULTS, f"run{suffix}.json")
    rc = 0
    if not args.from_json:
        rc = run_suite(json_path, ["-k", args.k] if args.k else [])
    with open(json_path) as f:
        data = json.load(f)
    stamp = adapter_stamp()
    stamp["date"] = datetime.datetime.now().strftime("%Y-%m-%d %H:%M")
    png = os.path.join(RESULTS, f"ratios{suffix}.png")
    out_md = os.path.join(RESULTS, f"REPORT{suffix}.md")
    rows = write_report(data, stamp, out_md, None, None)
    png = plot(rows, png, stamp)
    write_report(data, stamp, out_md, png, profile_table())
    print(f"wrote {out_md}" + (f" and {png}" if png else ""))
    return rc


if __name__ == "__main__":
    sys.exit(main())
