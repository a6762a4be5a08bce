"""Typed validators for config values: each returns the value or raises a located ConfigError."""

from __future__ import annotations

import datetime
import difflib
import ipaddress
import re
from collections.abc import Iterable, Mapping
from typing import Any, TypeGuard

from inventory.model import GpuSpec, NprocSpec
from inventory.tomlsource import Reporter, join_key

NPROC_WORDS = ("gpu", "cpu", "auto")
MAX_NPROC_PER_NODE = 1024
"""Most processes one host may run (nproc_per_node, hostfile/inventory slots) and most GPUs it may
declare: far beyond any real machine, so a larger number is a typo, not a cluster."""
_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")  # \Z: "$" would let a trailing newline through
_TOKEN_BAD = re.compile(r"[\s\x00-\x1f\x7f]")
_DURATION = re.compile(r"(\d+(?:\.\d+)?)\s*(s|m|min|h|d|w)\Z")
_DURATION_UNITS = {"s": 1.0, "m": 60.0, "min": 60.0, "h": 3600.0, "d": 86400.0, "w": 7 * 86400.0}


def duration_seconds(text: str) -> float | None:
    """A duration with its unit ("90s", "30m", "24h", "7d", "2w") in seconds; None if it is not one."""
    m = _DURATION.match(text.strip().lower())
    return float(m.group(1)) * _DURATION_UNITS[m.group(2)] if m else None


def describe(value: object) -> str:
    """Human description of a TOML value for 'expected X, got Y' messages."""
    if isinstance(value, bool):
        return f"boolean {str(value).lower()}"
    if isinstance(value, int):
        return f"integer {value}"
    if isinstance(value, float):
        return f"float {value}"
    if isinstance(value, str):
        return f'string "{value}"'
    if isinstance(value, list):
        return "an array"
    if isinstance(value, dict):
        return "a table"
    if isinstance(value, datetime.date | datetime.time):
        return f"date/time {value.isoformat()}"
    return type(value).__name__


def suggest(word: str, choices: Iterable[str]) -> str | None:
    """'did you mean "x"?' for the closest choice, or None."""
    close = difflib.get_close_matches(word, list(choices), n=3, cutoff=0.6)
    if not close:
        return None
    return "did you mean " + " or ".join(f'"{c}"' for c in close) + "?"


def check_keys(
    src: Reporter, prefix: str, table: Mapping[str, Any], allowed: Iterable[str]
) -> None:
    """Reject keys outside `allowed`, suggesting the closest allowed name."""
    allowed = tuple(allowed)
    for name in table:
        if name in allowed:
            continue
        key = join_key(prefix, name)
        where = f"in [{prefix}]" if prefix else "at the top level"
        hint = suggest(name, allowed) or "allowed keys: " + ", ".join(allowed)
        raise src.key_error(key, f'unknown key "{name}" {where}', hint)


def expect_table(src: Reporter, key: str, value: object) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise src.error(key, f"expected a table, got {describe(value)}", f"write it as [{key}]")
    return value


def expect_bool(src: Reporter, key: str, value: object) -> bool:
    if not isinstance(value, bool):
        raise src.error(key, f"expected true or false, got {describe(value)}", "write true or false",
                        value=value)
    return value


def expect_str(src: Reporter, key: str, value: object) -> str:
    """A non-empty string; numbers and booleans get a 'quote it' hint."""
    if not isinstance(value, str):
        hint = f'quote it: "{_toml_text(value)}"' if _scalar(value) else "write a quoted string"
        raise src.error(key, f"expected a string, got {describe(value)}", hint, value=value)
    if not value.strip():
        raise src.error(key, "must not be empty", "give a non-empty string", value=value)
    return expect_no_nul(src, key, value)


def expect_no_nul(src: Reporter, key: str, text: str) -> str:
    """Every string of a job ends up in an argv, an environment or a path, none of which can hold
    a NUL byte (TOML's "\\u0000"): refused here, where the key is known, not on every host."""
    if "\0" in text:
        raise src.error(key, 'the value contains a NUL byte ("\\u0000" in TOML), which no command line, '
                        "environment variable or path can hold", "remove it", value=text)
    return text


def expect_token(src: Reporter, key: str, value: object) -> str:
    """A string safe to pass as one SSH argument: no whitespace, no leading '-'."""
    text = expect_str(src, key, value)
    if _TOKEN_BAD.search(text):
        raise src.error(key, f'"{text}" contains whitespace or control characters', value=text)
    if text.startswith("-"):
        raise src.error(
            key, f'"{text}" starts with "-"', "names must not look like options", value=text
        )
    return text


def expect_int(
    src: Reporter, key: str, value: object, minimum: int | None = None, maximum: int | None = None
) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        hint = f"write it without quotes: {key.rsplit('.', 1)[-1]} = {value}"
        if not (isinstance(value, str) and is_ascii_digits(value.strip())):
            hint = "write a whole number"
        raise src.error(key, f"expected an integer, got {describe(value)}", hint, value=value)
    if (minimum is not None and value < minimum) or (maximum is not None and value > maximum):
        raise src.error(key, f"{value} is out of range", _range_hint(minimum, maximum))
    return value


def expect_duration(src: Reporter, key: str, value: object, minimum: float, maximum: float) -> float:
    """Seconds: a number, or a string with a unit ("90s", "30m", "24h", "7d")."""
    seconds: float | None = None
    if _scalar(value) and not isinstance(value, bool):
        seconds = float(value)  # type: ignore[arg-type]
    elif isinstance(value, str):
        seconds = duration_seconds(value)
    if seconds is None:
        raise src.error(key, f"expected seconds or a duration, got {describe(value)}",
                        f'write seconds ({key.rsplit(".", 1)[-1]} = {min(maximum, 86400.0):g}) or a duration '
                        'with its unit: "90s", "30m", "24h", "7d"', value=value)
    if not minimum <= seconds <= maximum:
        raise src.error(key, f"{seconds:g} s is out of range", f"use {minimum:g} to {maximum:g} seconds",
                        value=value)
    return seconds


def expect_port(src: Reporter, key: str, value: object, allow_auto: bool = False) -> int | str:
    """A TCP port 1..65535, or "auto" when `allow_auto`."""
    if allow_auto and value == "auto":
        return "auto"
    if isinstance(value, int) and not isinstance(value, bool) and not 1 <= value <= 65535:
        extra = ' or "auto"' if allow_auto else ""
        raise src.error(
            key, f"port {value} is outside 1-65535", f"use a port between 1 and 65535{extra}"
        )
    if allow_auto and isinstance(value, str) and not is_ascii_digits(value.strip()):
        raise src.error(
            key, f'expected a port number or "auto", got {describe(value)}', value=value
        )
    return expect_int(src, key, value, 1, 65535)


def expect_gpus(src: Reporter, key: str, value: object) -> GpuSpec:
    """A GPU count 0..MAX_NPROC_PER_NODE, "auto" (detect on the host), or an array of the GPU
    indices the host's ranks use (nvidia-smi's numbering), kept in the order given."""
    if value == "auto":
        return "auto"
    if isinstance(value, list):
        return expect_gpu_indices(src, key, value)
    if isinstance(value, str):
        raise src.error(
            key,
            f'expected a GPU count, "auto" or an array of GPU indices, got {describe(value)}',
            _gpus_text_hint(value),
            value=value,
        )
    if _is_int(value) and value > MAX_NPROC_PER_NODE:
        raise src.error(
            key,
            f"{value} GPUs is more than {MAX_NPROC_PER_NODE} per host",
            'give the number of GPUs the host has, or "auto" to detect it',
        )
    return expect_int(src, key, value, 0, MAX_NPROC_PER_NODE)


def expect_gpu_indices(src: Reporter, key: str, value: list[Any]) -> tuple[int, ...]:
    """A non-empty array of distinct GPU indices 0..MAX_NPROC_PER_NODE-1 (`gpus = [0, 2]`)."""
    if not value:
        raise src.error(
            key,
            "the GPU selection is empty",
            'list the GPUs to use, e.g. gpus = [0, 1], or write "auto" for all of them '
            "(gpus = 0: a host without GPU)",
        )
    if len(value) > MAX_NPROC_PER_NODE:
        raise src.error(
            key,
            f"selects {len(value)} GPUs, more than {MAX_NPROC_PER_NODE} per host",
            'list only the GPUs the host has, or write "auto" for all of them',
        )
    seen: list[int] = []
    for i, item in enumerate(value):
        index = _gpu_index(src, f"{key}[{i}]", item)
        if index in seen:
            unique = ", ".join(str(g) for g in dict.fromkeys(_plain_ints(value)))
            raise src.error(
                f"{key}[{i}]",
                f"GPU {index} is listed twice",
                f"list each GPU once: gpus = [{unique}]",
            )
        seen.append(index)
    return tuple(seen)


def _gpu_index(src: Reporter, key: str, item: object) -> int:
    if not _is_int(item):
        if isinstance(item, str) and is_ascii_digits(item.strip()):
            hint = f"write it without quotes: {item.strip()}"
        else:
            hint = "write the index nvidia-smi shows for the GPU, e.g. 0"
        raise src.error(key, f"expected a GPU index, got {describe(item)}", hint, value=item)
    if item < 0:
        raise src.error(
            key, f"GPU index {item} is negative", "GPU indices start at 0, as nvidia-smi numbers them"
        )
    if item >= MAX_NPROC_PER_NODE:
        raise src.error(
            key,
            f"GPU index {item} is beyond the {MAX_NPROC_PER_NODE} GPUs a host may have",
            "use the index nvidia-smi shows for the GPU (0, 1, ...)",
        )
    return item


def _plain_ints(items: Iterable[object]) -> list[int]:
    return [i for i in items if _is_int(i)]


def _gpus_text_hint(text: str) -> str:
    """'gpus = "0,2"' -> an array; '"4"' -> unquote it; near-miss words -> "auto"."""
    parts = [p.strip() for p in text.split(",")]
    if len(parts) > 1 and all(is_ascii_digits(p) for p in parts):
        return f"write the GPU indices as an array: gpus = [{', '.join(parts)}]"
    if is_ascii_digits(text.strip()):
        return f"write the count without quotes: gpus = {text.strip()}"
    return suggest(text, ["auto"]) or 'use a count (gpus = 4), "auto", or GPU indices (gpus = [0, 2])'


def expect_nproc(src: Reporter, key: str, value: object) -> NprocSpec:
    """Processes per node: an integer 1..MAX_NPROC_PER_NODE, or "gpu" / "cpu" / "auto"."""
    if isinstance(value, str) and value in NPROC_WORDS:
        return value  # type: ignore[return-value]
    if isinstance(value, str) and not is_ascii_digits(value.strip()):
        choice = suggest(value, NPROC_WORDS)
        words = ", ".join(f'"{w}"' for w in NPROC_WORDS)
        raise src.error(
            key,
            f"expected an integer >= 1 or one of {words}, got {describe(value)}",
            choice or f"use a number of processes per host, or one of {words}",
            value=value,
        )
    if _is_int(value) and value < 1:
        raise src.error(
            key,
            f"nproc_per_node must be at least 1, got {value}",
            'use 1 or more, or "gpu" for one process per GPU',
        )
    if _is_int(value) and value > MAX_NPROC_PER_NODE:
        raise src.error(
            key,
            f"nproc_per_node {value} is more than {MAX_NPROC_PER_NODE} processes per host",
            f'use at most {MAX_NPROC_PER_NODE}, or "gpu" for one process per GPU',
        )
    return expect_int(src, key, value, 1, MAX_NPROC_PER_NODE)


def expect_env_name(src: Reporter, key: str, name: str) -> str:
    if not _ENV_NAME.match(name):
        raise src.error(
            key,
            f'"{name}" is not a valid environment variable name',
            "use letters, digits and _ only, not starting with a digit",
            value=name,
        )
    return name


def expect_env(src: Reporter, key: str, value: object) -> dict[str, str]:
    """A table of NAME = "value" strings; numbers/booleans are refused with a 'quote it' hint."""
    table = expect_table(src, key, value)
    env: dict[str, str] = {}
    for name, raw in table.items():
        item_key = join_key(key, name)
        expect_env_name(src, item_key, name)
        if not isinstance(raw, str):
            hint = (
                f'quote it: {name} = "{_toml_text(raw)}"'
                if _scalar(raw)
                else "environment values must be strings"
            )
            raise src.error(item_key, f"expected a string, got {describe(raw)}", hint, value=raw)
        env[name] = expect_no_nul(src, item_key, raw)
    return env


def expect_str_list(src: Reporter, key: str, value: object) -> list[str]:
    """An array of strings (elements may be empty: they are passed through as arguments)."""
    if not isinstance(value, list):
        raise src.error(
            key, f"expected an array of strings, got {describe(value)}", 'write ["a", "b"]'
        )
    out: list[str] = []
    for i, item in enumerate(value):
        if not isinstance(item, str):
            hint = f'quote it: "{_toml_text(item)}"' if _scalar(item) else "use strings only"
            raise src.error(
                f"{key}[{i}]", f"expected a string, got {describe(item)}", hint, value=item
            )
        out.append(expect_no_nul(src, f"{key}[{i}]", item))
    return out


def is_ip_address(text: str) -> bool:
    """An IPv4 or IPv6 address (not a name)."""
    try:
        ipaddress.ip_address(text)
    except ValueError:
        return False
    return True


def is_ascii_digits(text: str) -> bool:
    """True for a plain whole number like "42" (isdigit alone accepts "²", which int() refuses)."""
    return text.isascii() and text.isdigit()


def _is_int(value: object) -> TypeGuard[int]:
    return isinstance(value, int) and not isinstance(value, bool)


def _scalar(value: object) -> bool:
    return isinstance(value, bool | int | float)


def _toml_text(value: object) -> str:
    return str(value).lower() if isinstance(value, bool) else str(value)


def _range_hint(minimum: int | None, maximum: int | None) -> str:
    if minimum is not None and maximum is not None:
        return f"use a value between {minimum} and {maximum}"
    if minimum is not None:
        return f"use a value of at least {minimum}"
    return f"use a value of at most {maximum}"
