"""Chat templates: the file's own (`tokenizer.chat_template`, Jinja) or, where a file has none (base
models), the architecture's known format, as llama.cpp's built-in templates write it
(llama-chat.cpp: llama2, llama3, chatml, gemma, phi3).

`builtin_template(arch, tokens, spm)` picks one: gemma/gemma2/gemma3 -> gemma, phi3 -> phi3,
qwen2/qwen3 -> chatml; llama -> llama3 when the vocabulary has `<|start_header_id|>`, chatml when it
has `<|im_start|>`, llama2 for a SentencePiece vocabulary; anything else chatml (llama.cpp's own
fallback). `render(template, messages, ...)` renders in jinja2's immutable sandbox (a file's
template is untrusted) with `messages`, `add_generation_prompt`, `bos_token`, `eos_token`, as Hugging
Face's apply_chat_template does.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NoReturn

from jinja2.exceptions import TemplateError
from jinja2.sandbox import ImmutableSandboxedEnvironment

CHATML = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)

# Llama 2 chat: the system message inside the first [INST] block, each exchange after a BOS
LLAMA2 = (
    "{% set ns = namespace(system='') %}"
    "{% for m in messages %}{% if m['role'] == 'system' %}{% set ns.system = m['content'] %}"
    "{% elif m['role'] == 'user' %}{% if not loop.first %}{{ bos_token }}{% endif %}[INST] "
    "{% if ns.system %}<<SYS>>\n{{ ns.system }}\n<</SYS>>\n\n{% set ns.system = '' %}{% endif %}"
    "{{ m['content'] | trim }} [/INST]"
    "{% else %} {{ m['content'] | trim }} {{ eos_token }}{% endif %}{% endfor %}"
)

LLAMA3 = (
    "{% for m in messages %}<|start_header_id|>{{ m['role'] }}<|end_header_id|>\n\n"
    "{{ m['content'] | trim }}<|eot_id|>{% endfor %}"
    "{% if add_generation_prompt %}<|start_header_id|>assistant<|end_header_id|>\n\n{% endif %}"
)

# Gemma: no system role (its text opens the first user turn), the assistant is "model"
GEMMA = (
    "{% set ns = namespace(system='') %}"
    "{% for m in messages %}{% if m['role'] == 'system' %}{% set ns.system = m['content'] + '\n\n' %}"
    "{% else %}<start_of_turn>{{ 'model' if m['role'] == 'assistant' else m['role'] }}\n"
    "{% if m['role'] == 'user' %}{{ ns.system }}{% set ns.system = '' %}{% endif %}"
    "{{ m['content'] | trim }}<end_of_turn>\n{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}<start_of_turn>model\n{% endif %}"
)

PHI3 = (
    "{% for m in messages %}<|{{ m['role'] }}|>\n{{ m['content'] }}<|end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>\n{% endif %}"
)

BUILTIN = {"chatml": CHATML, "llama2": LLAMA2, "llama3": LLAMA3, "gemma": GEMMA, "phi3": PHI3}

#: the texts of end-of-turn tokens the built-in formats (and most files' templates) end a reply with
END_OF_TURN = ("<|im_end|>", "<|eot_id|>", "<|end_of_text|>", "<end_of_turn>", "<|end|>", "<|endoftext|>")


def builtin_template(arch: str, tokens: Sequence[str], spm: bool) -> str:
    """The name of the built-in format for a file without a template (see the module docstring)."""
    if arch in ("gemma", "gemma2", "gemma3"):
        return "gemma"
    if arch == "phi3":
        return "phi3"
    if arch in ("qwen2", "qwen3"):
        return "chatml"
    vocab = set(tokens)
    if "<|start_header_id|>" in vocab:
        return "llama3"
    if "<|im_start|>" in vocab:
        return "chatml"
    if arch == "llama" and spm:
        return "llama2"
    return "chatml"


def _raise(msg: str) -> NoReturn:
    raise TemplateError(msg)


def render(
    template: str,
    messages: Sequence[dict[str, str]],
    *,
    add_generation_prompt: bool,
    bos_token: str,
    eos_token: str,
) -> str:
    """The conversation as text, through `template` (a Jinja string) in the immutable sandbox."""
    for m in messages:
        if not isinstance(m, dict) or not isinstance(m.get("role"), str) or not isinstance(m.get("content"), str):
            raise TypeError(f"[tokenizer] each message must be a dict with str 'role' and 'content', got {m!r}")
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
    env.globals["raise_exception"] = _raise
    return env.from_string(template).render(
        messages=messages, add_generation_prompt=add_generation_prompt, bos_token=bos_token, eos_token=eos_token
    )
