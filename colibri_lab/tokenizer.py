"""Text <-> token ids for GGUF models, built from the file's own vocabulary.

The tokenizer is assembled from the GGUF metadata (``tokenizer.ggml.*`` keys)
with the ``tokenizers`` library, so that it reproduces llama.cpp's tokenization
of the same file id for id:

- ``tokenizer.ggml.model = "gpt2"``: byte-level BPE from ``tokenizer.ggml.tokens``
  (id = position) and ``tokenizer.ggml.merges`` ("left right" strings, rank =
  position); the pre-tokenizer is chosen by ``tokenizer.ggml.pre`` from
  ``PRE_TOKENIZERS``; each entry is the split llama.cpp applies for that name,
  written with the ``tokenizers`` building blocks (the regexes are the original
  ones from the models' tokenizer.json files, which llama.cpp's hand-written
  splitters mirror);
- ``tokenizer.ggml.model = "llama"`` (SentencePiece vocabularies: Gemma, Llama 2,
  ...): llama.cpp's SPM tokenizer has no merge list and no pre-tokenizer.  It
  writes spaces as U+2581, starts from single characters and repeatedly joins
  the adjacent pair whose concatenation is the vocabulary token with the
  highest ``tokenizer.ggml.scores`` entry; a character no token covers becomes
  its UTF-8 bytes as ``<0xXX>`` tokens.  That is BPE with one merge per way of
  splitting a token into two tokens, ranked by the joined token's score, plus
  byte fallback: ``_spm_merges`` derives that list;
- special tokens: ids whose ``token_type`` is CONTROL (3) or UNKNOWN (2) are
  matched in the text as whole tokens only when ``parse_special`` is true (like
  llama.cpp's ``parse_special``/``special=True``); USER_DEFINED (4) ones always.

``metadata`` is a plain dict: key -> str / int / float / bool / list, as the
engine's ``Model.metadata()`` returns it (and as tests build it from
``gguf.GGUFReader``).
"""

from __future__ import annotations

import dataclasses
import operator
import threading
from typing import Any, Callable, Iterable, Mapping, Sequence

from tokenizers import AddedToken, Regex
from tokenizers import Tokenizer as _HFTokenizer
from tokenizers import models, normalizers, pre_tokenizers

from .errors import InvalidRequestError, ModelLoadError, UnsupportedModelError

__all__ = ["Tokenizer", "PRE_TOKENIZERS", "TOKEN_TYPE"]

# GGUF token types (llama.cpp's llama_token_type).
TOKEN_TYPE = {
    "UNDEFINED": 0,
    "NORMAL": 1,
    "UNKNOWN": 2,
    "CONTROL": 3,
    "USER_DEFINED": 4,
    "UNUSED": 5,
    "BYTE": 6,
}

# --- pre-tokenizers -------------------------------------------------------

# GPT-2's split (what ByteLevel(use_regex=True) applies internally).
_RE_LLAMA3 = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_RE_QWEN2 = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)


def _byte_level_gpt2():
    # Split with the GPT-2 regex, then map bytes to printable characters.
    return pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)


def _digits_then_gpt2():
    # llama.cpp's "smollm"/"starcoder" split: every digit on its own (\p{N}),
    # then the GPT-2 regex on what is left.
    return pre_tokenizers.Sequence(
        [
            pre_tokenizers.Digits(individual_digits=True),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True),
        ]
    )


def _regex_then_bytes(pattern: str) -> Callable[[], Any]:
    def build():
        return pre_tokenizers.Sequence(
            [
                pre_tokenizers.Split(Regex(pattern), behavior="isolated", invert=False),
                pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
            ]
        )

    return build


@dataclasses.dataclass(frozen=True)
class PreTokenizerSpec:
    """How one ``tokenizer.ggml.pre`` value splits text before BPE."""

    build: Callable[[], Any]  # returns a fresh tokenizers pre-tokenizer
    ignore_merges: bool = False  # a whole pre-token found in the vocab is emitted as is (llama3)


# tokenizer.ggml.pre -> spec.  The groups follow llama.cpp's llama_vocab::load,
# which maps several names onto one pre-tokenizer type.
PRE_TOKENIZERS: dict[str, PreTokenizerSpec] = {}
for _name in ("smollm", "starcoder", "refact", "codeshell", "exaone", "minerva-7b"):
    PRE_TOKENIZERS[_name] = PreTokenizerSpec(_digits_then_gpt2)
for _name in ("gpt-2", "phi-2", "jina-es", "jina-de", "gigachat", "jina-v1-en",
              "jina-v2-es", "jina-v2-de", "jina-v2-code", "roberta-bpe"):
    PRE_TOKENIZERS[_name] = PreTokenizerSpec(_byte_level_gpt2)
for _name in ("llama3", "llama-v3", "llama-bpe", "falcon3", "pixtral"):
    PRE_TOKENIZERS[_name] = PreTokenizerSpec(_regex_then_bytes(_RE_LLAMA3), ignore_merges=True)
for _name in ("qwen2", "deepseek-r1-qwen", "megrez"):
    PRE_TOKENIZERS[_name] = PreTokenizerSpec(_regex_then_bytes(_RE_QWEN2))
del _name

# --- end-of-generation detection (mirrors llama.cpp's llama_vocab::load) ------

# Tokens whose text makes them end generation.
_EOG_TEXTS = frozenset(
    {
        "<|eot_id|>", "<|im_end|>", "<|end|>", "<|return|>", "<|call|>", "<|flush|>",
        "<|calls|>", "<end_of_turn>", "<|endoftext|>", "</s>", "<|eom_id|>", "<EOT>",
        "_<EOT>", "[EOT]", "[EOS]", "<|end_of_text|>", "<end_of_utterance>", "<eos>",
        "<turn|>", "<|tool_response>", "<｜end▁of▁sentence｜>", "[e~[",
    }
)
# Fill-in-the-middle pad / repo / file-separator tokens, which llama.cpp also
# treats as end of generation; found by metadata key, else by text.
_FIM_EOG = {
    "tokenizer.ggml.fim_pad_token_id": ("<|fim_pad|>", "<fim-pad>", "<fim_pad>", "<PAD>"),
    "tokenizer.ggml.fim_rep_token_id": (
        "<|fim_repo|>", "<|repo_name|>", "<fim-repo>", "<REPO>", "<reponame>",
    ),
    "tokenizer.ggml.fim_sep_token_id": ("<|file_sep|>",),
}


def _bytes_to_unicode() -> dict[int, str]:
    """GPT-2's reversible byte -> printable character table."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(
        range(ord("®"), ord("ÿ") + 1)
    )
    cs = list(bs)
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {b: chr(c) for b, c in zip(bs, cs)}


_UNICODE_TO_BYTE = {c: b for b, c in _bytes_to_unicode().items()}

_SPM_SPACE = "\u2581"  # SentencePiece's visible space


def _spm_merges(tokens: Sequence[str], scores: Sequence[float]) -> list[tuple[str, str]]:
    """The merge list that makes BPE behave as llama.cpp's SPM tokenizer.

    llama.cpp joins the adjacent symbols whose concatenation is a token with
    the highest score (ties: leftmost first).  So every split of a token t into
    two tokens (a, b) is a merge, ranked by t's score; splits of one token
    share its rank (which of them applies is decided by the symbols present,
    never by rank), and distinct tokens with equal scores (only special
    tokens in the vocabularies we know) are ranked by id.
    """
    vocab = {t: i for i, t in enumerate(tokens)}  # last id wins, as in llama.cpp
    order = sorted(range(len(tokens)), key=lambda i: (-float(scores[i]), i))
    pairs = []
    for i in order:
        t = tokens[i]
        if vocab.get(t) != i:
            continue  # a duplicate text: llama.cpp never emits this id
        for k in range(1, len(t)):
            a = t[:k]
            if a in vocab:
                b = t[k:]
                if b in vocab:
                    pairs.append((a, b))
    return pairs


def _as_list(meta: Mapping[str, Any], key: str, required: bool = True) -> list | None:
    if key not in meta:
        if required:
            raise ModelLoadError(f"GGUF metadata has no {key!r}: cannot build the tokenizer")
        return None
    value = meta[key]
    if isinstance(value, (str, bytes)) or not isinstance(value, Iterable):
        raise ModelLoadError(f"GGUF metadata {key!r} should be an array, got {type(value).__name__}")
    return list(value)


class Tokenizer:
    """A GGUF model's tokenizer.  Immutable after construction; thread-safe."""

    def __init__(
        self,
        tokens: Sequence[str],
        merges: Sequence[str],
        token_types: Sequence[int] | None = None,
        *,
        pre: str = "gpt-2",
        model: str = "gpt2",
        scores: Sequence[float] | None = None,
        add_space_prefix: bool = False,
        bos_id: int | None = None,
        eos_id: int | None = None,
        add_bos: bool = False,
        add_eos: bool = False,
        extra_eog_ids: Iterable[int] = (),
    ):
        n = len(tokens)
        if n == 0:
            raise ModelLoadError("tokenizer vocabulary is empty")
        if token_types is None:
            token_types = [TOKEN_TYPE["NORMAL"]] * n
        if len(token_types) != n:
            raise ModelLoadError(
                f"tokenizer.ggml.token_type has {len(token_types)} entries, tokens has {n}"
            )
        if model not in ("gpt2", "llama"):
            raise UnsupportedModelError(
                f"unsupported tokenizer model tokenizer.ggml.model={model!r} "
                "(supported: 'gpt2' byte-level BPE, 'llama' SentencePiece-style BPE)"
            )
        spm = model == "llama"
        spec = None
        if not spm:
            spec = PRE_TOKENIZERS.get(pre)
            if spec is None:
                known = ", ".join(sorted(PRE_TOKENIZERS))
                raise UnsupportedModelError(
                    f"unsupported tokenizer pre-tokenizer type tokenizer.ggml.pre={pre!r} "
                    f"(supported: {known})"
                )
        elif scores is None or len(scores) != n:
            raise ModelLoadError(
                f"tokenizer.ggml.scores must have one entry per token ({n}) for a "
                "SentencePiece ('llama') vocabulary"
            )
        self.pre = pre
        self.model = model
        self.add_space_prefix = bool(add_space_prefix)
        self._tokens = [str(t) for t in tokens]  # id -> vocabulary string (byte-level encoded)
        self._types = [int(t) for t in token_types]  # id -> GGUF token type
        self.add_bos = bool(add_bos)
        self.add_eos = bool(add_eos)
        self.bos_id = self._check_id(bos_id)
        self.eos_id = self._check_id(eos_id)

        # token text -> id; on duplicates the last id wins, as in llama.cpp's map.
        vocab: dict[str, int] = {}
        for i, t in enumerate(self._tokens):
            vocab[t] = i
        self._vocab = vocab

        pairs = []
        for k, m in enumerate(() if spm else merges):
            m = str(m)
            # Split at the first space after the first character, as llama.cpp
            # does (a merge part is never empty).
            pos = m.find(" ", 1)
            if pos < 0:
                raise ModelLoadError(f"tokenizer.ggml.merges[{k}] = {m!r} is not 'left right'")
            left, right = m[:pos], m[pos + 1:]
            # tokenizers refuses merges with parts outside the vocabulary;
            # llama.cpp can never apply such a merge to a token either.
            if left in vocab and right in vocab and (left + right) in vocab:
                pairs.append((left, right))

        if spm:
            pairs = _spm_merges(self._tokens, scores)
        try:
            bpe = models.BPE(
                vocab=vocab,
                merges=pairs,
                ignore_merges=bool(spec and spec.ignore_merges),
                fuse_unk=False,
                byte_fallback=spm,
            )
        except Exception as e:  # tokenizers raises plain Exception
            raise ModelLoadError(f"cannot build the BPE model from the GGUF vocabulary: {e}") from e

        # Control / unknown tokens: matched only with parse_special; user-defined: always.
        special = {TOKEN_TYPE["CONTROL"], TOKEN_TYPE["UNKNOWN"]}
        self._special_ids = frozenset(
            i for i, t in enumerate(self._types) if t in special
        )
        self._eog_ids = frozenset(self._find_eog(extra_eog_ids))
        # llama.cpp forces end-of-generation tokens to CONTROL.
        self._special_ids = self._special_ids | self._eog_ids
        user_ids = [
            i for i, t in enumerate(self._types)
            if t == TOKEN_TYPE["USER_DEFINED"] and i not in self._special_ids
        ]

        def make(parse_special: bool) -> _HFTokenizer:
            tk = _HFTokenizer(bpe)
            if spm:
                # Applied to each stretch of text between special tokens, as
                # llama.cpp escapes each raw fragment (and, with
                # add_space_prefix, starts each with a space).
                steps = [normalizers.Replace(" ", _SPM_SPACE)]
                if self.add_space_prefix:
                    steps.insert(0, normalizers.Prepend(" "))
                tk.normalizer = normalizers.Sequence(steps)
            else:
                tk.pre_tokenizer = spec.build()
            # (no decoder: decode() joins token_to_piece's bytes, llama.cpp's pieces)
            if user_ids:
                tk.add_tokens([self._added(i, special=False) for i in user_ids])
            tk.add_special_tokens([self._added(i, special=True) for i in sorted(self._special_ids)])
            # True = do not split special tokens out of the text.
            tk.encode_special_tokens = not parse_special
            return tk

        self._make = make
        self._tk = make(True)
        self._tk_plain: _HFTokenizer | None = None  # built on first parse_special=False call
        self._lock = threading.Lock()

    # -- construction helpers ---------------------------------------------------

    def _added(self, i: int, special: bool) -> AddedToken:
        return AddedToken(
            self._tokens[i], single_word=False, lstrip=False, rstrip=False,
            normalized=False, special=special,
        )

    def _check_id(self, i: Any) -> int | None:
        # llama.cpp ignores a special id outside the vocabulary; so do we.
        if i is None or isinstance(i, bool):
            return None
        try:
            i = int(i)
        except (TypeError, ValueError):
            return None
        return i if 0 <= i < len(self._tokens) else None

    def _find_eog(self, extra: Iterable[int]) -> set[int]:
        eog = {i for t, i in self._vocab.items() if t in _EOG_TEXTS}
        for i in extra:
            j = self._check_id(i)
            if j is not None:
                eog.add(j)
        if self.eos_id is not None:
            eog.add(self.eos_id)
        return eog

    @classmethod
    def from_metadata(cls, meta: Mapping[str, Any]) -> "Tokenizer":
        """Build the tokenizer from GGUF metadata (a key -> value dict)."""
        model = meta.get("tokenizer.ggml.model")
        if model is None:
            raise ModelLoadError("GGUF metadata has no 'tokenizer.ggml.model'")
        if model not in ("gpt2", "llama"):
            raise UnsupportedModelError(
                f"unsupported tokenizer model tokenizer.ggml.model={model!r} "
                "(supported: 'gpt2' byte-level BPE, 'llama' SentencePiece-style BPE)"
            )
        spm = model == "llama"
        tokens = _as_list(meta, "tokenizer.ggml.tokens")
        merges = [] if spm else _as_list(meta, "tokenizer.ggml.merges")
        scores = _as_list(meta, "tokenizer.ggml.scores") if spm else None
        types = _as_list(meta, "tokenizer.ggml.token_type", required=False)
        pre = meta.get("tokenizer.ggml.pre", "default")
        if not spm and (pre == "default" or not pre):
            # llama.cpp's "default" BPE split is a four-regex chain that no
            # converted model we know of relies on: refuse rather than guess.
            raise UnsupportedModelError(
                "GGUF metadata has no usable 'tokenizer.ggml.pre' "
                f"(got {pre!r}); supported: {', '.join(sorted(PRE_TOKENIZERS))}"
            )
        extra: list[int] = []
        tmp = {t: i for i, t in enumerate(tokens)}
        for key in ("tokenizer.ggml.eot_token_id", "tokenizer.ggml.eom_token_id"):
            if key in meta:
                extra.append(meta[key])
        for key, texts in _FIM_EOG.items():
            if key in meta:
                extra.append(meta[key])
            else:
                found = [tmp[t] for t in texts if t in tmp]
                if found:
                    extra.append(found[0])
        return cls(
            tokens,
            merges,
            types,
            pre=str(pre),
            model=str(model),
            scores=scores,
            # llama.cpp's default for SentencePiece vocabularies is a prefix space.
            add_space_prefix=bool(meta.get("tokenizer.ggml.add_space_prefix", True)) and spm,
            bos_id=meta.get("tokenizer.ggml.bos_token_id"),
            eos_id=meta.get("tokenizer.ggml.eos_token_id"),
            add_bos=bool(meta.get("tokenizer.ggml.add_bos_token", False)),
            add_eos=bool(meta.get("tokenizer.ggml.add_eos_token", False)),
            extra_eog_ids=extra,
        )

    # -- properties -------------------------------------------------------------

    @property
    def n_vocab(self) -> int:
        return len(self._tokens)

    @property
    def eog_ids(self) -> frozenset[int]:
        """Ids that end generation: eos plus end-of-turn tokens found by text."""
        return self._eog_ids

    @property
    def special_ids(self) -> frozenset[int]:
        """Control tokens: parsed from text only with parse_special=True."""
        return self._special_ids

    def is_eog(self, token_id: int) -> bool:
        return token_id in self._eog_ids

    def is_special(self, token_id: int) -> bool:
        return token_id in self._special_ids

    def id_to_token(self, token_id: int) -> str:
        """The raw vocabulary string (byte-level encoded, e.g. 'Ġthe')."""
        self._check_ids([token_id])
        return self._tokens[token_id]

    def token_to_id(self, token: str) -> int | None:
        """Id of a raw vocabulary string, or None."""
        return self._vocab.get(token)

    # -- encode / decode --------------------------------------------------------

    def encode(
        self, text: str, add_special: bool | None = None, parse_special: bool = True
    ) -> list[int]:
        """Token ids of ``text``.

        add_special: prepend BOS / append EOS as the model's metadata asks
        (``tokenizer.ggml.add_bos_token`` / ``add_eos_token``); None = use those
        flags, False = never, True = same as None (flags decide which).
        parse_special: control tokens written in the text (e.g. "<|im_start|>")
        become their single id; when False they are tokenized as plain text.
        """
        if not isinstance(text, str):
            raise InvalidRequestError(f"text to encode must be str, got {type(text).__name__}")
        if parse_special:
            tk = self._tk
        else:
            with self._lock:
                if self._tk_plain is None:
                    self._tk_plain = self._make(False)
            tk = self._tk_plain
        try:
            ids = tk.encode(text, add_special_tokens=False).ids
        except Exception as e:  # e.g. lone surrogates in the str
            raise InvalidRequestError(f"cannot tokenize text: {e}") from e
        if add_special is None or add_special:
            if self.add_bos and self.bos_id is not None:
                ids.insert(0, self.bos_id)
            if self.add_eos and self.eos_id is not None:
                ids.append(self.eos_id)
        return ids

    def _check_ids(self, ids: Sequence[int]) -> None:
        n = len(self._tokens)
        for i in ids:
            if isinstance(i, bool) or not isinstance(i, int) or not 0 <= i < n:
                raise InvalidRequestError(f"token id {i!r} out of range [0, {n})")

    def decode(self, ids: Sequence[int], skip_special: bool = False) -> str:
        """Text of ``ids``; invalid UTF-8 (a cut multi-byte character) becomes U+FFFD."""
        try:
            ids = [operator.index(i) for i in ids]  # accepts numpy integers too
        except TypeError as e:
            raise InvalidRequestError(f"token ids must be integers: {e}") from e
        self._check_ids(ids)
        # The bytes llama.cpp's token_to_piece gives, joined, then decoded once:
        # a character split over byte-fallback tokens is whole again.
        data = b"".join(self._piece(i, not skip_special) for i in ids)
        return data.decode("utf-8", errors="replace")

    def token_to_piece(self, token_id: int, special: bool = True) -> bytes:
        """The bytes one token stands for.

        Control tokens give their text when ``special`` is true, else b"" (as
        llama.cpp's ``llama_token_to_piece``).
        """
        self._check_ids([token_id])
        return self._piece(token_id, special)

    def _piece(self, token_id: int, special: bool) -> bytes:
        text = self._tokens[token_id]
        kind = self._types[token_id]
        if self.model == "llama":
            if token_id in self._special_ids:
                return text.encode("utf-8") if special else b""
            if kind == TOKEN_TYPE["USER_DEFINED"]:
                return text.encode("utf-8")
            if kind == TOKEN_TYPE["NORMAL"]:
                return text.replace(_SPM_SPACE, " ").encode("utf-8")
            if kind == TOKEN_TYPE["BYTE"]:
                try:
                    return bytes([int(text[3:5], 16)]) if text[:3] == "<0x" and text[5:] == ">" else b""
                except ValueError:  # a malformed byte token renders as nothing
                    return b""
            return b""  # unused / undefined: rendered as nothing, as llama.cpp does
        if token_id in self._special_ids and kind != TOKEN_TYPE["UNKNOWN"]:
            return text.encode("utf-8") if special else b""
        if kind == TOKEN_TYPE["USER_DEFINED"]:
            return text.encode("utf-8")
        if kind != TOKEN_TYPE["NORMAL"]:
            # llama.cpp renders unknown / unused / byte / undefined BPE tokens as nothing.
            return b""
        out = bytearray()
        for ch in text:
            b = _UNICODE_TO_BYTE.get(ch)
            if b is None:
                out += ch.encode("utf-8")  # not a byte-level character: keep as is
            else:
                out.append(b)
        return bytes(out)

    def __repr__(self) -> str:
        return (
            f"Tokenizer(model={self.model!r}, pre={self.pre!r}, n_vocab={self.n_vocab}, bos_id={self.bos_id}, "
            f"eos_id={self.eos_id}, eog_ids={sorted(self._eog_ids)})"
        )
