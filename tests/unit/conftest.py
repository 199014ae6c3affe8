"""Fixtures shared by the single-process unit tests."""

import pytest

from tests.tiny import hf_model


@pytest.fixture
def ckpt(tmp_path):
    """A tiny random ERNIE 3.0 checkpoint written by transformers (config.json + model.safetensors)."""
    hf_model("ernie3", "base").save_pretrained(tmp_path / "ckpt")
    return tmp_path / "ckpt"
