"""The pretrained decoder setting of the claims audit, P-SmolLM (docs/CLAIMS_AUDIT.md, section
H): the real SmolLM2-135M-Instruct decoder as its GGUF Q4_1 file holds it (``make smollm`` puts
the file in ``.cache/models``; ``$ATTNJAX_SMOLLM`` names another path), dequantized to float32
and imported (``attnjax.pretrained.load_pretrained``), and its inputs: windows of plain English
text from the interpreter's standard-library documentation, tokenized by the model's own
tokenizer without BOS (the file says ``add_bos_token`` false), each window run alone.

The text (``documentation_text``): every docstring of the top-level standard-library sources
(``builtin_corpus_files``, in file order; in a file its module's, then its classes' and
functions' in source order), split into paragraphs at blank lines, each paragraph's lines
joined, and of those the distinct ones that are plain prose (a capital, then letters, digits,
spaces and ``,;:'()-.?!`` only, a final ``.?!``, at least ``MIN_WORDS`` words), joined by
blank lines. Its token ids cut from the start into consecutive windows of one length are the
windows (``documentation_windows``).

A claim on it measures nothing when the file is absent: its results say so (``absent``) and
its verdict is untestable, naming how to install it; ``fingerprint`` changes when the file
appears, so the audit measures it then.
"""

from __future__ import annotations

import ast
import functools
import os
import re
import tempfile
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

from attnjax.analysis.capture import attention_weights
from attnjax.config import ModelConfig
from attnjax.data.text import builtin_corpus_files
from attnjax.data.tokenizer import TextTokenizer
from attnjax.models import build
from attnjax.pretrained import open_source, read_pretrained
from attnjax.pretrained.architectures import architecture
from attnjax.pretrained.run import imported_config

FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
INSTALL = "'make smollm' installs it (or set ATTNJAX_SMOLLM to the .gguf file)"
MIN_WORDS = 8
FIRST_QUERY = 8                          # statistics over query positions 8 and later
_PROSE = re.compile(r"[A-Z][A-Za-z0-9 ,;:'()\-.?!]+[.?!]")
_DOCUMENTED = (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)


def smollm_file() -> Path:
    return Path(os.environ.get("ATTNJAX_SMOLLM", f".cache/models/{FILE}"))


def fingerprint() -> str:
    """What the P-SmolLM claims' results depend on outside their files: the GGUF file's size
    and modification time, or "absent"."""
    path = smollm_file()
    if not path.is_file():
        return "absent"
    stat = path.stat()
    return f"{stat.st_size}:{stat.st_mtime_ns}"


def absent() -> dict | None:
    """``{"absent": why}`` when the model is not installed, else None."""
    if fingerprint() != "absent":
        return None
    return {"absent": f"SmolLM2-135M-Instruct is not installed at {smollm_file()}: {INSTALL}"}


def model_config() -> ModelConfig:
    """The model the file describes, read from its metadata alone (no tensor is read)."""
    hf = open_source(smollm_file()).hf
    return architecture(hf).config(hf)


def smollm_tokenizer() -> TextTokenizer:
    """The tokenizer the file's metadata holds (no tensor is read)."""
    with tempfile.TemporaryDirectory() as scratch:
        path = Path(scratch) / "tokenizer.json"
        path.write_text(open_source(smollm_file()).tokenizer)
        return TextTokenizer(path)


@functools.lru_cache(maxsize=1)
def load_smollm() -> tuple[ModelConfig, dict, TextTokenizer]:
    """``(model config, float32 parameters, tokenizer)`` of P-SmolLM (read once per
    process)."""
    _, model, params = read_pretrained(smollm_file())
    return model, params, smollm_tokenizer()


def documentation_text() -> str:
    """The plain-prose paragraphs of the standard library's docstrings (module docstring)."""
    seen, paragraphs = set(), []
    for path in builtin_corpus_files():
        try:
            tree = ast.parse(path.read_text(encoding="utf-8"))
        except (SyntaxError, UnicodeDecodeError, ValueError):
            continue
        nodes = sorted((n for n in ast.walk(tree) if isinstance(n, _DOCUMENTED)),
                       key=lambda n: getattr(n, "lineno", 0))
        for node in nodes:
            for paragraph in re.split(r"\n\s*\n", ast.get_docstring(node) or ""):
                text = " ".join(paragraph.split())
                if (len(text.split()) >= MIN_WORDS and text not in seen
                        and _PROSE.fullmatch(text)):
                    seen.add(text)
                    paragraphs.append(text)
    return "\n\n".join(paragraphs)


def documentation_windows(tokenizer: TextTokenizer, count: int, length: int) -> np.ndarray:
    """int32 ``[count, length]``: the first ``count`` consecutive windows of ``length`` tokens
    of ``documentation_text`` (no special tokens)."""
    ids = tokenizer.encode(documentation_text(), special=False)
    if ids.size < count * length:
        raise ValueError(f"the standard-library docstrings hold {ids.size} tokens of prose, "
                         f"fewer than {count} windows of {length}")
    return ids[:count * length].reshape(count, length)


def window_attention(model: ModelConfig, params, windows: np.ndarray, batch: int = 4):
    """Each window's attention weights, run alone, in batches: yields ``[layers, B, heads, T,
    T]`` float32 arrays of ``batch`` windows (the last one fewer)."""
    config = imported_config(model, None)
    for start in range(0, len(windows), batch):
        yield attention_weights(config, params, windows[start:start + batch])


@functools.lru_cache(maxsize=16)
def _token_nll(model: ModelConfig):
    module = build(model)

    def nll(params, tokens):
        logits, _ = module.apply({"params": params}, tokens)
        logits = logits[:, :-1].astype(jnp.float32)
        target = jnp.take_along_axis(logits, tokens[:, 1:, None], axis=-1)[..., 0]
        return jax.nn.logsumexp(logits, axis=-1) - target                   # [B, T - 1]

    return jax.jit(nll)


def token_nll(model: ModelConfig, params, windows: np.ndarray, batch: int = 8) -> np.ndarray:
    """float64 ``[count, length - 1]``: the negative log-likelihood (nats) of each window's
    token ``i + 1`` given its tokens ``0..i`` (the prediction of query ``i``), each window run
    alone, in batches of ``batch``."""
    nll = _token_nll(model)
    return np.concatenate([np.asarray(nll(params, jnp.asarray(windows[s:s + batch])),
                                      np.float64) for s in range(0, len(windows), batch)])
