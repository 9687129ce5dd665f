"""Chat with SmolLM2-135M-Instruct (or any Llama GGUF file) on the GPU: 4-bit weights, the KV cache
and the sampler on the GPU, 4 bytes read back per token.

    python examples/chat.py --prompt "What is the capital of France?"
    python examples/chat.py                                  # interactive
    python examples/chat.py --model my.gguf --temperature 0.7 --top-p 0.9 --seed 1

The same program as the `mltensor-chat` console command (mltensor/apps/chat.py).
"""

import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from mltensor.apps.chat import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())
