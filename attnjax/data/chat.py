"""A model's chat template: the Jinja template that turns a conversation into the text an
instruction-tuned model was trained on (SmolLM's ``<|im_start|>user ... <|im_end|>``), as a
GGUF file's ``tokenizer.chat_template`` or a Hugging Face directory's ``tokenizer_config.json``
(or ``chat_template.jinja``) holds it.

An imported run keeps it in ``RUN/tokenizer_config.json`` (``CHAT_FILE``: the Hugging Face
file's name and keys: ``chat_template``, ``bos_token``, ``eos_token``), and ``attnjax generate
--chat`` renders the prompt through it as transformers' ``apply_chat_template`` does: a
sandboxed Jinja environment with ``trim_blocks`` and ``lstrip_blocks``, the loop controls, the
``raise_exception`` function and the ``tojson`` filter; variables ``messages``,
``add_generation_prompt``, ``bos_token``, ``eos_token``.
"""

from __future__ import annotations

import json
from pathlib import Path

from attnjax.userfiles import JSON_LIMIT, checked_size, read_json

CHAT_FILE = "tokenizer_config.json"
TEMPLATE_FILE = "chat_template.jinja"            # a Hugging Face directory's, beside it


def _token(value) -> str | None:
    """A special token as tokenizer_config.json writes it: its text, or ``{"content": text}``."""
    if isinstance(value, dict):
        value = value.get("content")
    return value if isinstance(value, str) else None


def directory_chat(directory: Path) -> tuple[dict | None, list[Path]]:
    """``(chat, files read)`` of a Hugging Face model directory: ``{"chat_template",
    "bos_token", "eos_token"}`` from its ``chat_template.jinja`` or ``tokenizer_config.json``
    (a template given as a list of named ones: the one named ``default``), or None without a
    template."""
    config_path, template_path = directory / CHAT_FILE, directory / TEMPLATE_FILE
    config = read_json(config_path) if config_path.is_file() else {}
    template = config.get("chat_template")
    if isinstance(template, list):
        template = next((t.get("template") for t in template
                         if isinstance(t, dict) and t.get("name") == "default"), None)
    files = [config_path] if config_path.is_file() else []
    if template_path.is_file():
        checked_size(template_path, JSON_LIMIT)
        try:
            template = template_path.read_bytes().decode("utf-8")
        except UnicodeDecodeError:
            raise ValueError(f"{template_path} is not UTF-8 text") from None
        files.append(template_path)
    if not isinstance(template, str):
        return None, files
    return {"chat_template": template, "bos_token": _token(config.get("bos_token")),
            "eos_token": _token(config.get("eos_token"))}, files


def read_chat(run_path: Path) -> dict | None:
    """The chat template a run keeps (``CHAT_FILE``), or None."""
    path = Path(run_path) / CHAT_FILE
    if not path.is_file():
        return None
    chat = read_json(path)
    return chat if isinstance(chat.get("chat_template"), str) else None


def render_chat(chat: dict, messages: list[dict], add_generation_prompt: bool = True) -> str:
    """The text of ``messages`` (``[{"role", "content"}]``) under ``chat``'s template; a
    template that does not parse or raises is one line."""
    from jinja2 import TemplateError
    from jinja2.ext import loopcontrols
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    def raise_exception(message):
        raise TemplateError(message)

    environment = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                                extensions=[loopcontrols])
    environment.filters["tojson"] = lambda value, indent=None: json.dumps(
        value, ensure_ascii=False, indent=indent)
    environment.globals["raise_exception"] = raise_exception
    try:
        return environment.from_string(chat["chat_template"]).render(
            messages=messages, add_generation_prompt=add_generation_prompt,
            bos_token=chat.get("bos_token") or "", eos_token=chat.get("eos_token") or "")
    except TemplateError as error:
        raise ValueError(f"the run's chat template fails: {error}") from None
