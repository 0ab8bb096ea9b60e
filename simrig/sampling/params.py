"""One request's sampling parameters (``SamplingSpec``), their bounds and their JSON form.

A spec states what a trace asks of vLLM's ``SamplingParams``, field by field with vLLM's
meanings; a request without one (``simrig.step.NewRequest.sampling`` None) runs under
vLLM's defaults. ``SamplingSpec.from_json`` reads a trace's ``sampling`` object and
``SamplingSpec.check`` holds a spec to the bounds below, each problem a
``SamplingSpecError`` naming its field; ``to_json`` writes only what differs from the
defaults. The bounds are vLLM's own (``SamplingParams._verify_args``, the MRV2 sampler's
buffers) unless marked as ours. The format's spec is traces/README.md.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, fields
from typing import Any

INT32_MAX = 2**31 - 1
INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1
MAX_LOGPROBS = 20  # ModelConfig.max_logprobs' default: the most a request may ask for

# ----------------------------------------------------------------- the bounds
# field -> (low, high, low end open, high end open)
FLOAT_BOUNDS: dict[str, tuple[float, float, bool, bool]] = {
    "temperature": (0.0, 2.0, False, False),  # "temperature must be in [0, 2]"
    "top_p": (0.0, 1.0, True, False),  # "top_p must be in (0, 1]"
    "min_p": (0.0, 1.0, False, False),  # "min_p must be in [0, 1]"
    "presence_penalty": (-2.0, 2.0, False, False),  # "presence_penalty must be in [-2, 2]"
    "frequency_penalty": (-2.0, 2.0, False, False),  # "frequency_penalty must be in [-2, 2]"
    "repetition_penalty": (0.0, 2.0, True, False),  # vLLM: "must be greater than zero"; the 2 is ours
}
# field -> (low, high), both included
INT_BOUNDS: dict[str, tuple[int, int]] = {
    "top_k": (-1, INT32_MAX),  # 0 and -1: the whole vocabulary; SamplingStates.top_k is int32
    "seed": (INT64_MIN, INT64_MAX),  # SamplingStates.seeds is int64
    "min_tokens": (0, INT32_MAX),  # LogitBiasState.min_lens is int32; at most the request's max_tokens
    "logprobs": (-1, MAX_LOGPROBS),  # -1: the whole vocabulary
    "prompt_logprobs": (-1, MAX_LOGPROBS),
}
LOGIT_BIAS_BOUNDS = (-100.0, 100.0)  # SamplingParams clamps a bias to it; a trace states it inside
MAX_LOGIT_BIAS = 1024  # MRV2's MAX_NUM_LOGIT_BIAS_TOKENS (v1/worker/gpu/sample/logit_bias.py)
MAX_STOP_TOKEN_IDS = 128  # MRV2's MAX_NUM_STOP_TOKEN_IDS (the same module)
MAX_BAD_WORDS = 128  # VLLM_MAX_NUM_BAD_WORDS' default
MAX_BAD_WORD_TOKENS = 1024  # VLLM_MAX_BAD_WORDS_TOTAL_TOKENS' default
_TOKEN_KEY = re.compile(r"0|[1-9][0-9]*")  # a logit_bias key: one spelling per token id


class SamplingSpecError(ValueError):
    """A sampling parameter vLLM (or the rig) cannot take: ``field`` names it
    (``sampling.top_p``, ``new_requests[0].sampling.logit_bias.17``), ``problem`` says
    what is wrong; the text is ``field: problem``, one line."""

    def __init__(self, field: str, problem: str) -> None:
        self.field, self.problem = field, problem
        super().__init__(f"{field}: {problem}")


@dataclass(frozen=True)
class SamplingSpec:
    """One request's sampling parameters, as the trace states them (vLLM's SamplingParams meanings)."""

    temperature: float = 1.0  # 0: greedy
    top_k: int = 0  # 0 or -1: the whole vocabulary
    top_p: float = 1.0  # (0, 1]
    min_p: float = 0.0  # [0, 1]
    seed: int | None = None  # int64; None: vLLM draws one
    presence_penalty: float = 0.0  # [-2, 2]
    frequency_penalty: float = 0.0  # [-2, 2]
    repetition_penalty: float = 1.0  # (0, 2]
    logit_bias: tuple[tuple[int, float], ...] = ()  # (token id, bias in [-100, 100]), sorted by token, unique
    bad_words: tuple[tuple[int, ...], ...] = ()  # token-id sequences, each non-empty
    min_tokens: int = 0  # >= 0: stop_token_ids are masked until this many tokens are out
    stop_token_ids: tuple[int, ...] = ()
    logprobs: int | None = None  # None: none; -1: whole vocabulary; else 0..20
    prompt_logprobs: int | None = None  # same range as logprobs

    @property
    def is_default(self) -> bool:
        """True when every field is vLLM's default (the spec asks for nothing)."""
        return self == _DEFAULT

    def to_json(self) -> dict[str, Any]:
        """The fields that differ from the defaults; ``logit_bias`` as ``{"17": 2.5}``."""
        out: dict[str, Any] = {}
        for f in fields(self):
            value = getattr(self, f.name)
            if value == f.default:
                continue
            if f.name == "logit_bias":
                value = {str(token): bias for token, bias in value}
            elif f.name == "bad_words":
                value = [list(word) for word in value]
            elif f.name == "stop_token_ids":
                value = list(value)
            out[f.name] = value
        return out

    @classmethod
    def from_json(cls, raw: Any, *, where: str = "sampling", vocab_size: int | None = None,
                  max_tokens: int | None = None) -> SamplingSpec:
        """The spec a trace's ``sampling`` object states, checked (see ``check``); raises
        ``SamplingSpecError`` naming the field (``where`` + its key) on the first problem.
        An absent key or ``null`` is the default."""
        if not isinstance(raw, dict):
            raise SamplingSpecError(where, f"must be an object, got {type(raw).__name__}")
        unknown = sorted(set(raw) - _NAMES)
        if unknown:
            more = f" (also {', '.join(unknown[1:])})" if len(unknown) > 1 else ""
            raise SamplingSpecError(f"{where}.{unknown[0]}", f"unknown field{more}")
        values: dict[str, Any] = {}
        for name, value in raw.items():
            here = f"{where}.{name}"
            if value is None and name in _OPTIONAL:
                continue
            if name in FLOAT_BOUNDS:
                values[name] = float(_number(value, here))
            elif name in INT_BOUNDS:
                values[name] = _integer(value, here)
            elif name == "logit_bias":
                values[name] = _logit_bias(value, here)
            elif name == "bad_words":
                values[name] = tuple(tuple(_list(word, f"{here}[{i}]"))
                                     for i, word in enumerate(_list(value, here)))
            else:
                values[name] = tuple(_list(value, here))
        spec = cls(**values)
        spec.check(where=where, vocab_size=vocab_size, max_tokens=max_tokens)
        return spec

    def check(self, *, where: str = "sampling", vocab_size: int | None = None,
              max_tokens: int | None = None) -> None:
        """Raise ``SamplingSpecError`` for the first field outside its bounds. Token ids must
        lie in ``[0, vocab_size)`` (``[0, 2**31)`` when None: the runner's int32 tables);
        ``min_tokens`` must not exceed ``max_tokens`` when given (vLLM: "min_tokens must be
        less than or equal to max_tokens")."""
        for name, (low, high, low_open, high_open) in FLOAT_BOUNDS.items():
            value = _number(getattr(self, name), f"{where}.{name}")
            inside = (low < value if low_open else low <= value) and (
                value < high if high_open else value <= high)
            if not inside:
                finite = "" if math.isfinite(value) else "a finite number "
                raise SamplingSpecError(f"{where}.{name}", f"must be {finite}in {'(' if low_open else '['}"
                                        f"{low:g}, {high:g}{')' if high_open else ']'}, got {value!r}")
        for name, (low, high) in INT_BOUNDS.items():
            value = getattr(self, name)
            if value is None and name in _OPTIONAL:
                continue
            value = _integer(value, f"{where}.{name}")
            if not low <= value <= high:
                raise SamplingSpecError(f"{where}.{name}", f"must be in [{low}, {high}], got {value}")
        if self.seed == -1:  # SamplingParams: "if self.seed == -1: self.seed = None"
            raise SamplingSpecError(f"{where}.seed", "-1 is vLLM's spelling of no seed: leave seed out")
        if max_tokens is not None and self.min_tokens > max_tokens:
            raise SamplingSpecError(f"{where}.min_tokens", f"{self.min_tokens} exceeds the request's "
                                    f"max_tokens {max_tokens}")
        tokens = _TokenIds(vocab_size)
        self._check_logit_bias(f"{where}.logit_bias", tokens)
        self._check_bad_words(f"{where}.bad_words", tokens)
        stops = _tuple(self.stop_token_ids, f"{where}.stop_token_ids")
        _at_most(stops, MAX_STOP_TOKEN_IDS, "token ids", f"{where}.stop_token_ids")
        for i, token in enumerate(stops):
            tokens.check(token, f"{where}.stop_token_ids[{i}]")
            if token in stops[:i]:
                raise SamplingSpecError(f"{where}.stop_token_ids[{i}]", f"repeats token id {token}")

    def _check_logit_bias(self, here: str, tokens: _TokenIds) -> None:
        entries = _tuple(self.logit_bias, here)
        _at_most(entries, MAX_LOGIT_BIAS, "entries", here)
        previous = -1
        for entry in entries:
            if not isinstance(entry, tuple) or len(entry) != 2:
                raise SamplingSpecError(here, f"each entry must be a (token id, bias) pair, got {entry!r}")
            token, bias = entry
            tokens.check(token, f"{here}.{token}" if _is_int(token) else here)
            if token <= previous:
                raise SamplingSpecError(f"{here}.{token}", "entries must be sorted by token id, each once")
            previous = token
            low, high = LOGIT_BIAS_BOUNDS
            bias = _number(bias, f"{here}.{token}")
            if not low <= bias <= high:
                raise SamplingSpecError(f"{here}.{token}", f"must be in [{low:g}, {high:g}], got {bias!r}")

    def _check_bad_words(self, here: str, tokens: _TokenIds) -> None:
        words = _tuple(self.bad_words, here)
        _at_most(words, MAX_BAD_WORDS, "words", here)
        total = 0
        for i, word in enumerate(words):
            word = _tuple(word, f"{here}[{i}]")
            if not word:
                raise SamplingSpecError(f"{here}[{i}]", "must hold at least one token id (vLLM: "
                                        "\"bad_words entries must tokenize to at least one token\")")
            for j, token in enumerate(word):
                tokens.check(token, f"{here}[{i}][{j}]")
            if word in words[:i]:
                raise SamplingSpecError(f"{here}[{i}]", f"repeats bad word {words.index(word)}")
            total += len(word)
        if total > MAX_BAD_WORD_TOKENS:
            raise SamplingSpecError(here, f"holds {total} token ids in all, at most {MAX_BAD_WORD_TOKENS} "
                                    "(VLLM_MAX_BAD_WORDS_TOTAL_TOKENS)")


_DEFAULT = SamplingSpec()
_NAMES = frozenset(f.name for f in fields(SamplingSpec))
_OPTIONAL = frozenset(f.name for f in fields(SamplingSpec) if f.default is None)  # null: the default


class _TokenIds:
    """Token ids in ``[0, vocab_size)``, or in the runner's int32 range without a vocabulary."""

    def __init__(self, vocab_size: int | None) -> None:
        self.end = INT32_MAX + 1 if vocab_size is None else vocab_size

    def check(self, token: Any, here: str) -> None:
        if not _is_int(token) or not 0 <= token < self.end:
            raise SamplingSpecError(here, f"must be a token id in [0, {self.end}), got {token!r}")


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _integer(value: Any, here: str) -> int:
    if not _is_int(value):
        raise SamplingSpecError(here, f"must be an integer, got {type(value).__name__} {value!r}")
    return value


def _number(value: Any, here: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise SamplingSpecError(here, f"must be a number, got {type(value).__name__} {value!r}")
    if isinstance(value, int) and abs(value) > 1e300:  # a JSON integer float() cannot hold
        raise SamplingSpecError(here, f"must be a finite number, got an integer of {len(str(value))} digits")
    return value


def _list(value: Any, here: str) -> list:
    if not isinstance(value, list):
        raise SamplingSpecError(here, f"must be a list, got {type(value).__name__}")
    return value


def _tuple(value: Any, here: str) -> tuple:
    if not isinstance(value, tuple):
        raise SamplingSpecError(here, f"must be a tuple, got {type(value).__name__}")
    return value


def _at_most(items: tuple, limit: int, what: str, here: str) -> None:
    if len(items) > limit:
        raise SamplingSpecError(here, f"holds {len(items)} {what}, at most {limit}")


def _logit_bias(value: Any, here: str) -> tuple[tuple[int, float], ...]:
    """``{"17": 2.5, "3": -1}`` -> ``((3, -1.0), (17, 2.5))``."""
    if not isinstance(value, dict):
        raise SamplingSpecError(here, f"must be an object token id -> bias, got {type(value).__name__}")
    entries = []
    for key, bias in value.items():
        if not _TOKEN_KEY.fullmatch(key):
            raise SamplingSpecError(f"{here}.{key}", "the key must be a token id in decimal digits")
        if len(key) > 100:  # int() of thousands of digits is slow, and no vocabulary is that large
            raise SamplingSpecError(f"{here}.{key}", f"must be a token id, got a number of {len(key)} digits")
        entries.append((int(key), float(_number(bias, f"{here}.{key}"))))
    return tuple(sorted(entries))
