/* Graph replay in C: the launches of one dispatch as one call from Python.
 *
 * From Python, every wgpu-native call through cffi costs ~0.3-0.5 us of marshalling, three calls a
 * kernel (set pipeline, set bind group, dispatch): ~1 us a kernel, the floor of any Python loop.
 * This loop makes the same calls from C, with the function pointers of the wgpu-native library
 * wgpu-py loaded (mlt_init), so both share one library and one pass. Built at set-up or first use
 * with the system C compiler (mltensor/runtime/replay.py); without one, Python replays. */
#include <stddef.h>
#include <stdint.h>

typedef void (*set_pipeline_fn)(void *pass, void *pipeline);
typedef void (*set_bind_group_fn)(void *pass, uint32_t index, void *group, size_t n_offsets,
                                  const uint32_t *offsets);
typedef void (*dispatch_fn)(void *pass, uint32_t x, uint32_t y, uint32_t z);
typedef void (*set_immediates_fn)(void *pass, uint32_t offset, const void *data, size_t size);

static set_pipeline_fn set_pipeline;
static set_bind_group_fn set_bind_group;
static dispatch_fn dispatch;
static set_immediates_fn set_immediates;

void mlt_init(uintptr_t sp, uintptr_t sb, uintptr_t dp, uintptr_t si) {
    set_pipeline = (set_pipeline_fn)sp;
    set_bind_group = (set_bind_group_fn)sb;
    dispatch = (dispatch_fn)dp;
    set_immediates = (set_immediates_fn)si;
}

/* n launches into `pass`: pipes[i] / groups[i] are NULL where launch i - 1 set the same object;
 * xyz holds 3 workgroup counts per launch. */
void mlt_replay(uintptr_t pass, size_t n, void *const *pipes, void *const *groups, const uint32_t *xyz) {
    void *p = (void *)pass;
    for (size_t i = 0; i < n; i++) {
        if (pipes[i]) set_pipeline(p, pipes[i]);
        if (groups[i]) set_bind_group(p, 0, groups[i], 0, NULL);
        dispatch(p, xyz[3 * i], xyz[3 * i + 1], xyz[3 * i + 2]);
    }
}

/* The same for a graph whose kernels take immediate data (mltensor/dynamic/kernels.py): the sizes
 * of dynamic dimensions, or a kernel's launch parameters. xyz holds this dispatch's workgroup
 * counts; at[2i], at[2i + 1] the byte offset in imm and the size of launch i's immediates, set
 * after its pipeline (size 0: nothing to set, the pass keeps what the previous launch set). */
void mlt_replay_imm(uintptr_t pass, size_t n, void *const *pipes, void *const *groups, uintptr_t xyz_addr,
                    const uint32_t *at, uintptr_t imm_addr) {
    void *p = (void *)pass;
    const uint32_t *xyz = (const uint32_t *)xyz_addr;
    const uint8_t *imm = (const uint8_t *)imm_addr;
    for (size_t i = 0; i < n; i++) {
        if (pipes[i]) set_pipeline(p, pipes[i]);
        if (at[2 * i + 1]) set_immediates(p, 0, imm + at[2 * i], at[2 * i + 1]);
        if (groups[i]) set_bind_group(p, 0, groups[i], 0, NULL);
        dispatch(p, xyz[3 * i], xyz[3 * i + 1], xyz[3 * i + 2]);
    }
}
