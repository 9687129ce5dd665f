// Order-preserving stream compaction (mltensor/ops/select.py): `_nonzero` (ONNX NonZero) and
// the exclusive scan of per-workgroup counts that `_nms` (shaders/nms.wgsl) shares.
// The input x is bound as u32 words whatever its type; element e is nonzero when (kind):
//   "f32": its bits other than the sign are not all 0 (NaN is nonzero, -0.0 is zero),
//   "f16": likewise on the 16-bit half (e & 1) of word e / 2 (float16 computed in f16),
//   "b32": its word is not 0 (int32, uint32, int8 / uint8 in their i32 / u32 compute form),
//   "b64": one of its two words is not 0 (int64 / uint64, native or emulated: 8 bytes either way).
// Blocks of BLOCK = WG * EPT elements, thread li of a block owning the EPT consecutive elements
// from li * EPT. The output `out` is int64 [R, N] (R coordinates) bound as u32 word pairs (low,
// high): nonzero element e, the k-th nonzero in row-major order, writes its coordinates into
// column k; the zero elements fill the columns from the count on with zeros, in order (column
// count + number of zero elements before e), so every column is written exactly once.
// Paths:
//   "count":   a workgroup per block: its number of nonzeros into cnt[block].
//   "scan":    one workgroup: cnt[0..NC) -> exclusive prefix sums in place, cnt[NC] = the sum,
//              total[0] = the sum as i32 (NonZero's count; NMS's number of selected boxes).
//   "scatter": a workgroup per block: the nonzeros before the block are cnt[block], the total is
//              cnt[NB]; a workgroup scan of the threads' counts places each element.
//   "small":   one workgroup does it all (few blocks): a counting pass, then the blocks in order.
{{ bindings }}
{$ include "common.wgsl" $}

const WG = {{ WORKGROUP }}u;
var<workgroup> part: array<u32, {{ WORKGROUP }}>;

// (exclusive prefix over the workgroup's threads of v, the workgroup's sum); every thread calls
// it (barriers), in uniform control flow
fn wg_scan(li: u32, v: u32) -> vec2<u32> {
    part[li] = v;
    for (var off = 1u; off < WG; off = off << 1u) {
        workgroupBarrier();
        var o = 0u;
        if (li >= off) { o = part[li - off]; }
        workgroupBarrier();
        part[li] = part[li] + o;
    }
    workgroupBarrier();
    let incl = part[li];
    let sum = part[WG - 1u];
    workgroupBarrier();  // part is written again by the next call
    return vec2<u32>(incl - v, sum);
}

{$ if path == "scan" $}
const NC = {{ NC }}u;  // counts
const CH = {{ CH }}u;  // counts a thread owns (contiguous): ceil(NC / WG)

@compute @workgroup_size({{ WORKGROUP }})
fn main(@builtin(local_invocation_index) li: u32) {
    let lo = min(li * CH, NC);
    let hi = min(lo + CH, NC);
    var s = 0u;
    for (var i = lo; i < hi; i = i + 1u) { s = s + cnt[i]; }
    let sc = wg_scan(li, s);
    var run = sc.x;
    for (var i = lo; i < hi; i = i + 1u) {
        let c = cnt[i];
        cnt[i] = run;
        run = run + c;
    }
    if (li == WG - 1u) {
        cnt[NC] = sc.y;
        total[0] = i32(sc.y);
    }
}
{$ else $}
const N = {{ N }}u;      // elements
const EPT = {{ EPT }}u;  // elements a thread owns in a block (consecutive)
const BLOCK = WG * EPT;
const NB = {{ NB }}u;    // blocks

// 1 where element e (< N) is nonzero, else 0
fn nz(e: u32) -> u32 {
{$ if kind == "f32" $}
    return select(0u, 1u, (x[e] & 0x7fffffffu) != 0u);
{$ elif kind == "f16" $}
    return select(0u, 1u, ((x[e >> 1u] >> ((e & 1u) * 16u)) & 0x7fffu) != 0u);
{$ elif kind == "b64" $}
    return select(0u, 1u, (x[2u * e] | x[2u * e + 1u]) != 0u);
{$ else $}
    return select(0u, 1u, x[e] != 0u);
{$ endif $}
}

// bit j set where element blk * BLOCK + li * EPT + j is nonzero (elements past N: 0)
fn flags(blk: u32, li: u32) -> u32 {
    let e0 = blk * BLOCK + li * EPT;
    var f = 0u;
{$ for j in range(EPT) $}
    if (e0 + {{ j }}u < N) { f = f | (nz(e0 + {{ j }}u) << {{ j }}u); }
{$ endfor $}
    return f;
}

{$ if path != "count" $}
// column `col` of the output: element e's coordinates (row-major over the input's shape)
fn put(col: u32, e: u32) {
{$ for k in range(R) $}
    out[2u * ({{ k }}u * N + col)] = {{ coords[k] }};
    out[2u * ({{ k }}u * N + col) + 1u] = 0u;
{$ endfor $}
}

fn put_zero(col: u32) {
{$ for k in range(R) $}
    out[2u * ({{ k }}u * N + col)] = 0u;
    out[2u * ({{ k }}u * N + col) + 1u] = 0u;
{$ endfor $}
}

// writes block blk given the nonzeros before it (before) and in all (total); returns the
// block's count. Every thread calls it (wg_scan's barriers).
fn scatter_block(blk: u32, li: u32, before: u32, total: u32) -> u32 {
    let f = flags(blk, li);
    let sc = wg_scan(li, countOneBits(f));
    var k = before + sc.x;  // nonzeros before this thread's first element
    let e0 = blk * BLOCK + li * EPT;
{$ for j in range(EPT) $}
    if (e0 + {{ j }}u < N) {
        if (((f >> {{ j }}u) & 1u) != 0u) {
            put(k, e0 + {{ j }}u);
            k = k + 1u;
        } else {
            put_zero(total + (e0 + {{ j }}u - k));  // after the nonzeros, the zeros in order
        }
    }
{$ endfor $}
    return sc.y;
}
{$ endif $}

{$ if path == "count" $}
var<workgroup> acc: atomic<u32>;

@compute @workgroup_size({{ WORKGROUP }})
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) li: u32) {
    let g = wid.y * nwg.x + wid.x;
    if (g >= NB) { return; }  // uniform per workgroup
    if (li == 0u) { atomicStore(&acc, 0u); }
    workgroupBarrier();
    let c = countOneBits(flags(g, li));
    if (c != 0u) { atomicAdd(&acc, c); }
    workgroupBarrier();
    if (li == 0u) { cnt[g] = atomicLoad(&acc); }
}
{$ elif path == "scatter" $}
@compute @workgroup_size({{ WORKGROUP }})
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) li: u32) {
    let g = wid.y * nwg.x + wid.x;
    if (g >= NB) { return; }  // uniform per workgroup
    scatter_block(g, li, cnt[g], cnt[NB]);
}
{$ else $}
var<workgroup> acc: atomic<u32>;

@compute @workgroup_size({{ WORKGROUP }})
fn main(@builtin(local_invocation_index) li: u32) {
    if (li == 0u) { atomicStore(&acc, 0u); }
    workgroupBarrier();
    var c = 0u;
    for (var blk = 0u; blk < NB; blk = blk + 1u) { c = c + countOneBits(flags(blk, li)); }
    if (c != 0u) { atomicAdd(&acc, c); }
    workgroupBarrier();
    let total = atomicLoad(&acc);
    var before = 0u;
    for (var blk = 0u; blk < NB; blk = blk + 1u) {
        before = before + scatter_block(blk, li, before, total);
    }
    if (li == 0u) { count[0] = i32(total); }
}
{$ endif $}
{$ endif $}
