"""Tokenizers for ``chute convert --tokenizer``: one small interface over four kinds.

* a Hugging Face ``tokenizer.json`` (a path, or a ``tokenizers.Tokenizer``): the
  ``tokenizers`` package, ``encode_batch`` with the tokenizer's own defaults (so
  a post-processor that adds BOS adds it here too); a folder saved by
  transformers' ``save_pretrained`` names its end token in ``tokenizer_config.json``;
* a transformers tokenizer object (API only): a fast one (``PreTrainedTokenizerFast``)
  through its Rust ``backend_tokenizer`` as above, its end token ``eos_token_id``;
  a slow one through its own batch call;
* a tiktoken encoding (a name such as ``cl100k_base``, or a ``tiktoken.Encoding``):
  ``encode_ordinary_batch`` (special tokens written in the text stay text);
* a Python callable ``fn(text) -> sequence of int`` (API only).

An :class:`Encoder` is picklable: it goes to each worker process once, when the
process starts. Nothing is imported before a tokenizer of that kind is asked for
(``pip install 'chute[text]'``).
"""

from __future__ import annotations

import dataclasses
import os
import pickle
from collections.abc import Sequence
from typing import Any

from chute.errors import ChuteError

EOS_NAMES = ("<|endoftext|>", "<|end_of_text|>", "</s>", "<eos>", "<|eos|>")
"""Special tokens taken as a tokenizer.json's end-of-document token, first found wins."""

TIKTOKEN_URL_HINT = (
    "tiktoken downloads an encoding's BPE file from the internet the first time it is used and keeps it in "
    "the folder $TIKTOKEN_CACHE_DIR. Without a network: on a machine that has one, run "
    "TIKTOKEN_CACHE_DIR=/some/folder python -c \"import tiktoken; tiktoken.get_encoding('{name}')\", copy that "
    "folder here and set TIKTOKEN_CACHE_DIR to it; or build a tiktoken.Encoding from a local .tiktoken file "
    "and pass it to chute.tokens.convert(tokenizer=...)"
)


@dataclasses.dataclass
class Encoder:
    """A loaded tokenizer: ``encode(texts)`` gives each text's token ids.

    ``name`` is for messages; ``vocab_size`` is None when unknown (a callable);
    ``eos_id`` is the tokenizer's own end-of-document token, None if it has none.
    """

    name: str
    kind: str  # "hf", "tiktoken" or "callable"
    impl: Any
    vocab_size: int | None
    eos_id: int | None

    def encode(self, texts: list[str]) -> list[Sequence[int]]:
        if self.kind == "hf":  # encode_batch_fast (tokenizers >= 0.20): the same ids, no character offsets
            encode_batch = getattr(self.impl, "encode_batch_fast", self.impl.encode_batch)
            return [encoding.ids for encoding in encode_batch(texts)]
        if self.kind == "tiktoken":
            return self.impl.encode_ordinary_batch(texts)
        if self.kind == "transformers":  # a slow (Python) transformers tokenizer: its own batch call
            return self.impl(texts, add_special_tokens=True)["input_ids"]
        return [self.impl(text) for text in texts]


def load_tokenizer(spec: Any, *, vocab_size: int | None = None) -> Encoder:
    """An :class:`Encoder` from a path to ``tokenizer.json``, a tiktoken name, or a tokenizer object.

    ``vocab_size`` overrides the tokenizer's own (needed for a callable to pick
    the narrowest dtype up front; without it the writer picks it from the tokens).
    """
    encoder = _load(spec)
    if vocab_size is not None:
        if vocab_size < 1:
            raise ChuteError(f"vocab_size must be at least 1, got {vocab_size}")
        encoder.vocab_size = vocab_size
    return encoder


def _load(spec: Any) -> Encoder:
    if isinstance(spec, Encoder):
        return dataclasses.replace(spec)
    if isinstance(spec, (str, os.PathLike)):
        text = os.fspath(spec)
        if os.path.isdir(text) and os.path.isfile(os.path.join(text, "tokenizer.json")):
            text = os.path.join(text, "tokenizer.json")
        if os.path.isfile(text):
            if text.endswith(".tiktoken"):
                raise ChuteError(
                    f"{text}: a .tiktoken file alone does not say how to split text (its pattern and special tokens "
                    "live in tiktoken's code); " + TIKTOKEN_URL_HINT.format(name=os.path.basename(text)[: -len(".tiktoken")])
                )
            return _hf_from_file(text)
        if os.path.isdir(text):
            raise ChuteError(f"tokenizer folder {text} holds no tokenizer.json")
        if os.sep in text or text.endswith(".json"):
            raise ChuteError(f"tokenizer file {text} does not exist")
        return _tiktoken_by_name(text)
    module = type(spec).__module__.split(".")[0]
    if module == "transformers" or hasattr(spec, "backend_tokenizer") or hasattr(spec, "eos_token_id") and hasattr(spec, "convert_tokens_to_ids"):
        return _transformers(spec)
    if module == "tokenizers":
        return _hf(spec, f"tokenizers.Tokenizer ({spec.get_vocab_size(with_added_tokens=True)} tokens)")
    if module in ("tiktoken", "tiktoken_ext"):
        return _tiktoken(spec, f"tiktoken encoding {spec.name}")
    if callable(spec):
        name = getattr(spec, "__qualname__", None) or type(spec).__name__
        return Encoder(f"tokenizer function {getattr(spec, '__module__', '?')}.{name}", "callable", spec, None, None)
    raise ChuteError(
        f"cannot use a {type(spec).__name__} as a tokenizer; pass a path to a tokenizer.json (or its folder), a "
        "tiktoken encoding name (e.g. cl100k_base), a transformers tokenizer, a tokenizers.Tokenizer, a "
        "tiktoken.Encoding, or a function text -> token ids"
    )


def _import(package: str) -> Any:
    try:
        return __import__(package)
    except ImportError:
        raise ChuteError(f"this tokenizer needs the `{package}` package: pip install 'chute[text]' (or pip install {package})") from None


def _hf_from_file(path: str) -> Encoder:
    tokenizers = _import("tokenizers")
    try:
        tokenizer = tokenizers.Tokenizer.from_file(path)
    except Exception as exc:  # tokenizers raises a bare Exception for a malformed file
        raise ChuteError(f"{path} is not a Hugging Face tokenizer.json the tokenizers package can read ({exc})") from None
    encoder = _hf(tokenizer, f"tokenizer {path}")
    named = _config_eos(os.path.join(os.path.dirname(path), "tokenizer_config.json"))
    if named is not None:  # a save_pretrained folder names its end token: that one, as transformers would
        token = tokenizer.token_to_id(named)
        if token is not None:
            encoder.eos_id = int(token)
    return encoder


def _config_eos(path: str) -> str | None:
    """The ``eos_token`` a transformers ``tokenizer_config.json`` names, if the file exists and names one."""
    import json

    try:
        with open(path, encoding="utf-8") as f:
            config = json.load(f)
    except (OSError, ValueError):
        return None
    eos = config.get("eos_token") if isinstance(config, dict) else None
    if isinstance(eos, dict):  # an AddedToken written out
        eos = eos.get("content")
    return eos if isinstance(eos, str) else None


def _transformers(tokenizer: Any) -> Encoder:
    """A transformers tokenizer: a fast one encodes through its Rust tokenizer (``backend_tokenizer``, the same ids
    as ``tokenizer(texts)["input_ids"]``, its special tokens included); a slow one through its own batch call.
    The end token is its ``eos_token_id``; the vocabulary ``len(tokenizer)`` (added tokens included)."""
    name = f"transformers {type(tokenizer).__name__} ({getattr(tokenizer, 'name_or_path', '') or 'in memory'})"
    eos = getattr(tokenizer, "eos_token_id", None)
    eos = int(eos) if isinstance(eos, int) and not isinstance(eos, bool) else None
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is not None:
        encoder = _hf(backend, name)
        size = max(int(len(tokenizer)), encoder.vocab_size or 0)
        return Encoder(name, "hf", backend, size, eos)
    return Encoder(name, "transformers", tokenizer, int(len(tokenizer)), eos)


def _hf(tokenizer: Any, name: str) -> Encoder:
    vocab = tokenizer.get_vocab(with_added_tokens=True)
    size = max(tokenizer.get_vocab_size(with_added_tokens=True), max(vocab.values(), default=-1) + 1)
    specials = {t.content for t in tokenizer.get_added_tokens_decoder().values() if t.special}
    eos = next((vocab[n] for n in EOS_NAMES if n in specials and n in vocab), None)
    return Encoder(name, "hf", tokenizer, size, eos)


def _tiktoken_by_name(name: str) -> Encoder:
    tiktoken = _import("tiktoken")
    names = tiktoken.list_encoding_names()
    if name not in names:
        raise ChuteError(
            f"--tokenizer {name}: no such file, and not a tiktoken encoding (those are {', '.join(names)}); "
            "give the path to a Hugging Face tokenizer.json or a tiktoken encoding name"
        )
    try:
        encoding = tiktoken.get_encoding(name)
    except Exception as exc:  # requests' errors, a hash mismatch, a read-only cache folder
        raise ChuteError(
            f"cannot load tiktoken encoding {name}: {type(exc).__name__}: {exc}. " + TIKTOKEN_URL_HINT.format(name=name)
        ) from None
    return _tiktoken(encoding, f"tiktoken encoding {name}")


def _tiktoken(encoding: Any, name: str) -> Encoder:
    try:
        eos = int(encoding.eot_token)
    except (KeyError, AttributeError):  # an encoding without <|endoftext|>
        eos = None
    return Encoder(name, "tiktoken", encoding, int(encoding.n_vocab), eos)


def check_picklable(encoder: Encoder) -> None:
    """Worker processes get the tokenizer pickled: refuse one that cannot be, saying what to do."""
    try:
        pickle.dumps(encoder.impl)
    except Exception as exc:
        raise ChuteError(
            f"the {encoder.name} cannot be sent to worker processes ({type(exc).__name__}: {exc}); define it at "
            "the top level of a module (not a lambda or a nested function), or pass workers=0 to tokenize in this process"
        ) from None


def encoder_eos(encoder: Encoder, eos: bool, eos_id: int | None) -> int | None:
    """The end-of-document id to append: ``eos_id`` if given, the tokenizer's own if ``eos``, else None."""
    if eos_id is not None:
        if eos_id < 0 or (encoder.vocab_size is not None and eos_id >= encoder.vocab_size):
            raise ChuteError(f"eos_id {eos_id} is not a token of the {encoder.name} (ids 0 to {encoder.vocab_size - 1})"
                             if encoder.vocab_size is not None else f"eos_id must be >= 0, got {eos_id}")
        return eos_id
    if not eos:
        return None
    if encoder.eos_id is None:
        raise ChuteError(
            f"the {encoder.name} has no end-of-document token chute knows ({', '.join(EOS_NAMES)}); "
            "name it with --eos-id N (eos_id=N)"
        )
    return encoder.eos_id

