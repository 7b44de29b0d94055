"""The typed config.json accessors every converter reads its hyperparameters through (issue 11, item 9)."""

from __future__ import annotations

from pathlib import Path

import pytest

from gguf_mtp.conversion.base import LLAMA_MAX_EXPERTS, MAX_WIDTH, config_bool, config_float, config_int
from gguf_mtp.errors import CheckpointError

WHERE = Path("/ckpt/config.json")


@pytest.mark.parametrize(("value", "message"), [
    (256.0, "hidden_size = 256.0 is not an integer (expected 1..1,048,576)"),
    ("4k", 'hidden_size = "4k" is not an integer'),
    ("256", 'hidden_size = "256" is not an integer'),
    (True, "hidden_size = true is not an integer"),
    (1e30, "hidden_size = 1e+30 is not an integer"),
    ([256], "hidden_size = [256] is not an integer"),
    (-1, "hidden_size = -1 is out of range (expected 1..1,048,576)"),
    (0, "hidden_size = 0 is out of range"),
    (MAX_WIDTH + 1, "hidden_size = 1,048,577 is out of range"),
])
def test_config_int_refuses_wrong_types_and_ranges_naming_key_and_value(value: object, message: str) -> None:
    with pytest.raises(CheckpointError) as info:
        config_int({"hidden_size": value}, "hidden_size", where=WHERE)
    assert str(info.value).startswith(f"{WHERE}: {message}")


def test_config_int_takes_the_first_spelling_set_and_treats_null_as_absent() -> None:
    config = {"hidden_size": None, "d_model": 512}
    assert config_int(config, ["hidden_size", "d_model"], where=WHERE) == 512
    assert config_int({}, "moe_latent_size", where=WHERE, optional=True) is None
    with pytest.raises(CheckpointError, match="config.json has none of hidden_size, d_model"):
        config_int({"hidden_size": None}, ["hidden_size", "d_model"], where=WHERE)
    with pytest.raises(CheckpointError, match="config.json has no head_dim"):
        config_int({}, "head_dim", where=WHERE)


def test_config_int_says_why_a_maximum_is_what_it_is() -> None:
    limit = "llama.cpp loads at most 1024 experts (LLAMA_MAX_EXPERTS)"
    assert config_int({"e": LLAMA_MAX_EXPERTS}, "e", where=WHERE, maximum=LLAMA_MAX_EXPERTS, limit=limit) == 1024
    with pytest.raises(CheckpointError, match=r"e = 1,025 is out of range \(expected 1..1,024\): llama.cpp loads"):
        config_int({"e": 1025}, "e", where=WHERE, maximum=LLAMA_MAX_EXPERTS, limit=limit)


@pytest.mark.parametrize(("value", "message"), [
    ("1e-5", 'eps = "1e-5" is not a number'),
    (False, "eps = false is not a number"),
    (0, "eps = 0 is out of range (expected more than 0, at most 1)"),
    (-1e-5, "eps = -1e-05 is out of range (expected more than 0, at most 1)"),
    (2.0, "eps = 2.0 is out of range (expected more than 0, at most 1)"),
])
def test_config_float_refuses_strings_bools_and_out_of_range(value: object, message: str) -> None:
    with pytest.raises(CheckpointError) as info:
        config_float({"eps": value}, "eps", where=WHERE, maximum=1.0)
    assert str(info.value) == f"{WHERE}: {message}"


def test_config_float_accepts_integers_as_numbers() -> None:
    assert config_float({"scale": 5}, "scale", where=WHERE) == 5.0
    assert config_float({"scale": 2.5}, "scale", where=WHERE) == 2.5
    assert config_float({}, "scale", where=WHERE, optional=True) is None


@pytest.mark.parametrize("value", [1, 0, "true", "yes", [True]])
def test_config_bool_accepts_only_true_or_false(value: object) -> None:
    assert config_bool({"norm_topk_prob": True}, "norm_topk_prob", where=WHERE) is True
    assert config_bool({}, "norm_topk_prob", where=WHERE) is None
    with pytest.raises(CheckpointError, match="norm_topk_prob = .* is not true or false"):
        config_bool({"norm_topk_prob": value}, "norm_topk_prob", where=WHERE)
