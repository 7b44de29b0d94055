"""Hyperparameters read from ``config.json``: llama.cpp's limits, and the typed, bounded readers every family uses
(:func:`config_int`, :func:`config_float`, :func:`config_bool`), with :class:`ConfigReader`, which remembers
which key gave each value so a value that later does not fit its GGUF field is named by its key."""

from __future__ import annotations

import contextlib
import json
import math
import os
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any, TypeVar

from gguf_mtp.errors import CheckpointError

__all__ = [
    "EXPERT_LIMIT",
    "INT32_MAX",
    "LLAMA_MAX_EXPERTS",
    "LLAMA_MAX_LAYERS",
    "MAX_WIDTH",
    "U32_MAX",
    "ConfigReader",
    "KVValueError",
    "config_bool",
    "config_float",
    "config_int",
    "shown_value",
]

_V = TypeVar("_V")

#: llama.cpp's own limits (``src/llama-hparams.h``): a model it loads has at most this many layers
#: (trunk and NextN blocks together) and routed experts. A head beyond them could never run.
LLAMA_MAX_LAYERS = 512
LLAMA_MAX_EXPERTS = 1024

#: The largest values of GGUF's 32-bit fields: u32 (context length, SSM sizes) and i32 (token ids).
U32_MAX = 2**32 - 1
INT32_MAX = 2**31 - 1
EXPERT_LIMIT = f"llama.cpp loads at most {LLAMA_MAX_EXPERTS} experts (LLAMA_MAX_EXPERTS)"

#: The largest width, length or head count read from config.json: 16x today's largest models, and
#: small enough that no product of two of them overflows GGUF's 64-bit dimensions.
MAX_WIDTH = 1 << 20

# ------------------------------------------------------------------------------------ config.json


def _found(
    config: dict[str, Any], keys: str | Sequence[str], where: str | os.PathLike[str] | None, *, optional: bool
) -> tuple[str, Any] | None:
    """(the first of ``keys`` that config.json sets to a non-null value, its value); ``None`` when none is
    set and ``optional``.

    Raises:
        CheckpointError: none is set and the value is required.
    """
    names = (keys,) if isinstance(keys, str) else tuple(keys)
    for key in names:
        if config.get(key) is not None:
            return key, config[key]
    if optional:
        return None
    wanted = names[0] if len(names) == 1 else f"none of {', '.join(names)}"
    raise CheckpointError(f"config.json has {'no ' if len(names) == 1 else ''}{wanted}", where)


def shown_value(value: Any) -> str:
    """A config value as JSON (``256.0``, ``"4k"``, ``true``), cut short for a one-line message."""
    text = json.dumps(value, default=str)
    return text if len(text) <= 40 else text[:37] + "..."


def config_int(
    config: dict[str, Any], keys: str | Sequence[str], *, where: str | os.PathLike[str] | None,
    minimum: int = 1, maximum: int = MAX_WIDTH, optional: bool = False, limit: str | None = None,
) -> int | None:
    """The integer hyperparameter ``keys`` (the first one set) of a config, checked for type and range.

    A JSON integer only: ``256.0``, ``"256"``, ``true`` and ``1e30`` are refused, as is anything outside
    ``minimum..maximum``. ``null`` counts as absent.

    Args:
        config: the parsed ``config.json``.
        keys: the key, or its spellings in order of preference (``["hidden_size", "d_model"]``).
        where: the config file, for messages.
        optional: return ``None`` when absent instead of refusing.
        limit: why ``maximum`` is what it is, added to the message when it is exceeded.

    Raises:
        CheckpointError: one line naming the key and its value.
    """
    found = _found(config, keys, where, optional=optional)
    if found is None:
        return None
    key, value = found
    if isinstance(value, bool) or not isinstance(value, int):
        raise CheckpointError(f"{key} = {shown_value(value)} is not an integer (expected {minimum:,}..{maximum:,})",
                              where)
    if not minimum <= value <= maximum:
        reason = f": {limit}" if limit and value > maximum else ""
        raise CheckpointError(f"{key} = {value:,} is out of range (expected {minimum:,}..{maximum:,}){reason}", where)
    return value


def config_float(
    config: dict[str, Any], keys: str | Sequence[str], *, where: str | os.PathLike[str] | None,
    above: float = 0.0, maximum: float = 1e6, optional: bool = False,
) -> float | None:
    """The number hyperparameter ``keys`` of a config: finite, ``> above`` and ``<= maximum`` (an integer
    such as ``5`` is accepted as ``5.0``; a string or a bool is not). ``null`` counts as absent.

    Raises:
        CheckpointError: one line naming the key and its value.
    """
    found = _found(config, keys, where, optional=optional)
    if found is None:
        return None
    key, value = found
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise CheckpointError(f"{key} = {shown_value(value)} is not a number", where)
    number = float(value)
    if not math.isfinite(number) or not above < number <= maximum:
        raise CheckpointError(f"{key} = {shown_value(value)} is out of range (expected more than {above:g}, at most "
                              f"{maximum:g})", where)
    return number


def config_bool(config: dict[str, Any], key: str, *, where: str | os.PathLike[str] | None) -> bool | None:
    """The ``true``/``false`` hyperparameter ``key`` of a config, ``None`` when absent or null.

    Raises:
        CheckpointError: it is something else (``1``, ``"yes"``), named with its value.
    """
    value = config.get(key)
    if value is not None and not isinstance(value, bool):
        raise CheckpointError(f"{key} = {shown_value(value)} is not true or false", where)
    return value




class KVValueError(ValueError):
    """A metadata value that does not fit the GGUF type it is written as.

    Attributes:
        key: the GGUF key; value: the offending value (the item, for an array); reason: what the type holds.
    """

    def __init__(self, key: str, value: Any, reason: str) -> None:
        self.key, self.value, self.reason = key, value, reason
        super().__init__(f"{key} = {shown_value(value)}: {reason}")


def _gave(read: Any, written: Any) -> bool:
    """Whether a value read from config.json is (or, for a list, holds) a value being written."""
    if isinstance(read, (list, tuple)):
        return any(_gave(item, written) for item in read)
    return isinstance(read, bool) == isinstance(written, bool) and read == written


class ConfigReader:
    """A checkpoint's ``config.json`` (:attr:`hparams`), read through typed, bounded readers that remember which key
    gave each value (:meth:`hparam_origin`), for messages about values that do not fit where they are written."""

    def __init__(self, hparams: dict[str, Any], config_path: Path) -> None:
        self.hparams = hparams
        #: The ``config.json`` named by every message about a hyperparameter.
        self.config_path = config_path
        #: (config key or derivation, value) for every hyperparameter read, in reading order (for messages).
        self._origins: list[tuple[str, Any]] = []

    def _origin_of(self, *keys: str) -> str:
        """Which spelling of a hyperparameter config.json used (the first of ``keys`` it sets, else the first)."""
        return next((k for k in keys if self.hparams.get(k) is not None), keys[0])

    def hparam_int(self, keys: str | Sequence[str], *, minimum: int = 1, maximum: int = MAX_WIDTH,
                   limit: str | None = None) -> int:
        """A required integer hyperparameter, type- and range-checked (see :func:`config_int`)."""
        value = config_int(self.hparams, keys, where=self.config_path, minimum=minimum, maximum=maximum, limit=limit)
        assert value is not None
        return self._read(keys, value)

    def optional_hparam_int(self, keys: str | Sequence[str], *, minimum: int = 1, maximum: int = MAX_WIDTH,
                            limit: str | None = None) -> int | None:
        """An optional integer hyperparameter (``None`` when absent), checked like :meth:`hparam_int`."""
        return self._read(keys, config_int(self.hparams, keys, where=self.config_path, minimum=minimum,
                                           maximum=maximum, optional=True, limit=limit))

    def optional_hparam_float(self, keys: str | Sequence[str], *, above: float = 0.0,
                              maximum: float = 1e6) -> float | None:
        """An optional finite number hyperparameter (see :func:`config_float`)."""
        return self._read(keys, config_float(self.hparams, keys, where=self.config_path, above=above,
                                             maximum=maximum, optional=True))

    def optional_hparam_bool(self, key: str) -> bool | None:
        """An optional ``true``/``false`` hyperparameter (see :func:`config_bool`)."""
        return self._read(key, config_bool(self.hparams, key, where=self.config_path))

    def _read(self, keys: str | Sequence[str], value: _V) -> _V:
        """Remember that ``value`` came from the first of ``keys`` config.json sets (see :meth:`hparam_origin`)."""
        if value is not None:
            names = (keys,) if isinstance(keys, str) else tuple(keys)
            self.hparam_origin(next((k for k in names if self.hparams.get(k) is not None), names[0]), value)
        return value

    def hparam_origin(self, origin: str, value: _V) -> _V:
        """Record that ``value`` (a value, a list, or a product of several) is what config.json's ``origin``
        (``"rope_parameters.rope_theta"``, ``"linear_num_value_heads x linear_value_head_dim"``) gave; returns it.
        The typed readers record what they read; a family records what it reads or derives itself."""
        self._origins.append((origin, value))
        return value

    @contextlib.contextmanager
    def writing_config_values(self) -> Iterator[None]:
        """Metadata written inside this block that does not fit its GGUF type (:class:`KVValueError`, raised by the
        writer's one check) is refused with one line naming ``config.json`` and the key that gave the value.

        Raises:
            CheckpointError: ``<folder>/config.json: rope_parameters.rope_theta = 1e+39 cannot be written as
                qwen35.rope.freq_base (f32 holds at most 3.403e+38)``.
        """
        try:
            yield
        except KVValueError as e:
            origin = next((o for o, v in reversed(self._origins) if _gave(v, e.value)), None)
            if origin is None:
                message = f"{e.key} = {shown_value(e.value)} (from config.json) does not fit: {e.reason}"
            else:
                value = next(v for o, v in reversed(self._origins) if o == origin)
                entry = f"entry {shown_value(e.value)}: " if isinstance(value, (list, tuple)) else ""
                message = f"{origin} = {shown_value(value)} cannot be written as {e.key} ({entry}{e.reason})"
            raise CheckpointError(message, self.config_path) from None

