"""The pretrained setting of the claims audit, P-MiniLM (docs/CLAIMS_AUDIT.md, section H): the
real all-MiniLM-L6-v2 encoder imported from its Hugging Face files (``make minilm`` puts them
in ``.cache/models/all-MiniLM-L6-v2``; ``$ATTNJAX_MINILM`` names another directory), and its
inputs: English sentences of 8-40 WordPiece tokens from the interpreter's standard-library
documentation (the module docstrings of its top-level sources, ``builtin_corpus_files``, in
file order), each run alone as ``[CLS] ... [SEP]``.

A claim on it measures nothing when the model is absent: its results say so (``absent``) and
its verdict is untestable, naming how to install it; ``fingerprint`` changes when the model
appears, so the audit measures it then.
"""

from __future__ import annotations

import ast
import os
import re
from pathlib import Path

import numpy as np

from attnjax.analysis.capture import attention_weights
from attnjax.config import Config
from attnjax.data.text import builtin_corpus_files
from attnjax.data.tokenizer import TextTokenizer
from attnjax.pretrained import load_pretrained
from attnjax.pretrained.run import imported_config

MIN_TOKENS, MAX_TOKENS = 8, 40           # WordPiece tokens of a sentence, [CLS] and [SEP] in
INSTALL = "'make minilm' installs it (or set ATTNJAX_MINILM to its directory)"
_SENTENCE_END = re.compile(r"(?<=[.!?])\s+")
_ENGLISH = re.compile(r"[A-Z][A-Za-z ,;'-]+[a-z]\.")   # words and light punctuation only


def minilm_directory() -> Path:
    return Path(os.environ.get("ATTNJAX_MINILM", ".cache/models/all-MiniLM-L6-v2"))


def fingerprint() -> str:
    """What the P-MiniLM claims' results depend on outside their files: the weights' size and
    modification time, or "absent"."""
    weights = minilm_directory() / "model.safetensors"
    if not weights.is_file():
        return "absent"
    stat = weights.stat()
    return f"{stat.st_size}:{stat.st_mtime_ns}"


def absent() -> dict | None:
    """``{"absent": why}`` when the model is not installed, else None."""
    if fingerprint() != "absent":
        return None
    return {"absent": f"all-MiniLM-L6-v2 is not installed at {minilm_directory()}: {INSTALL}"}


def load_minilm(count: int) -> tuple[Config, dict, TextTokenizer, list[np.ndarray]]:
    """``(config, params, tokenizer, sentences)`` of P-MiniLM: ``count`` sentences
    (``documentation_sentences``)."""
    directory = minilm_directory()
    model, params = load_pretrained(directory)
    tokenizer = TextTokenizer(directory / "tokenizer.json")
    config = imported_config(model, str(tokenizer.path))
    return config, params, tokenizer, documentation_sentences(tokenizer, count)


def sentence_attention(config: Config, params, sentences) -> list[np.ndarray]:
    """Each sentence's attention ``[layers, heads, T, T]``, the sentence run alone."""
    return [attention_weights(config, params, ids[None])[:, 0] for ids in sentences]


def documentation_sentences(tokenizer: TextTokenizer, count: int) -> list[np.ndarray]:
    """The ids ``[CLS] ... [SEP]`` of the first ``count`` distinct sentences of the module
    docstrings that are plain English (a capital, then only letters, spaces, ``,;'-``, and a
    final full stop) and have ``MIN_TOKENS`` to ``MAX_TOKENS`` tokens."""
    seen, out = set(), []
    for path in builtin_corpus_files():
        try:
            docstring = ast.get_docstring(ast.parse(path.read_text(encoding="utf-8")))
        except (SyntaxError, UnicodeDecodeError, ValueError):
            continue
        for sentence in _SENTENCE_END.split(" ".join((docstring or "").split())):
            if sentence in seen or not _ENGLISH.fullmatch(sentence):
                continue
            ids = tokenizer.encode(sentence)
            if MIN_TOKENS <= ids.size <= MAX_TOKENS:
                seen.add(sentence)
                out.append(ids)
                if len(out) == count:
                    return out
    raise ValueError(f"the standard-library docstrings hold {len(out)} such sentences, fewer "
                     f"than {count}")
