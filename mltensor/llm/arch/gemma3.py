"""`gemma3`: Gemma 3 (text). Gemma 2's layer with QK-norm (attn_q_norm / attn_k_norm) and no
attention soft-capping; five sliding-window layers then a global one (attention.
sliding_window_pattern where the file has it, else 6, as llama.cpp), the sliding layers with
their own rope base (rope.freq_base_swa where present, else 10000, llama.cpp's constant) and no
position scaling, the global ones rope.freq_base (1e6) with the file's linear scaling. A final
soft-cap only where the file has final_logit_softcapping."""

from .base import Arch


class Gemma3(Arch):
    name = "gemma3"
    rope = "neox"
    activation = "gelu"
    post_norms = True
    qk_norm = True
    embed_scale = True
    swa_pattern = 6
    big_layers = 62

    def configure(self, c, num):
        c.window = num("attention.sliding_window", 0)
        c.final_softcap = num("final_logit_softcapping", 0.0, float)
        c.swa_pattern = num("attention.sliding_window_pattern", self.swa_pattern)
        c.rope_base_swa = num("rope.freq_base_swa", 10000.0, float)

    def sliding(self, c, i):
        n = c.swa_pattern
        return bool(c.window) and n > 0 and i % n < n - 1

    def layer_rope(self, c, i):
        if self.sliding(c, i):
            return c.rope_base_swa, 1.0
        return c.rope_base, c.rope_scale


ARCH = Gemma3()
