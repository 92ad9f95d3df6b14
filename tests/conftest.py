"""Fixtures shared across test folders."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from gossamer.testing import data_dir

# Tests run tiny shapes on a small shared CPU: OpenMP threads only contend there (tens of times
# slower with 2 threads than with 1). Benchmarks choose their own thread counts.
torch.set_num_threads(1)


@pytest.fixture(scope="session")
def o200k_harmony_tokenizer_json(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tokenizer.json equivalent to o200k_harmony, built once per test session (~3 s)."""
    from gossamer.tokenizer import build_o200k_harmony_tokenizer_json

    out_path = tmp_path_factory.mktemp("o200k_harmony") / "tokenizer.json"
    return build_o200k_harmony_tokenizer_json(data_dir(), out_path)


@pytest.fixture(scope="session")
def harmony_tokenizer(o200k_harmony_tokenizer_json: Path):
    """gossamer.tokenizer.Tokenizer for o200k_harmony (the GPT-OSS tokenizer)."""
    from gossamer.tokenizer import Tokenizer

    return Tokenizer.from_file(o200k_harmony_tokenizer_json)


@pytest.fixture(scope="session")
def openai_harmony_encoding():
    """openai-harmony's GPT-OSS encoding, loaded offline from the shared data folder."""
    import openai_harmony

    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("TIKTOKEN_ENCODINGS_BASE", str(data_dir()))
        yield openai_harmony.load_harmony_encoding(
            openai_harmony.HarmonyEncodingName.HARMONY_GPT_OSS
        )


@pytest.fixture(scope="session")
def tiktoken_o200k_harmony(tmp_path_factory: pytest.TempPathFactory):
    """tiktoken's own o200k_harmony encoding, read offline: tiktoken's download cache is keyed
    by the SHA-1 of the URL, so a link under that name in an empty cache folder serves the file."""
    import hashlib

    import tiktoken
    from tiktoken_ext import openai_public

    url = "https://openaipublic.blob.core.windows.net/encodings/o200k_base.tiktoken"
    cache_dir = tmp_path_factory.mktemp("tiktoken_cache")
    (cache_dir / hashlib.sha1(url.encode()).hexdigest()).symlink_to(
        data_dir() / "o200k_base.tiktoken"
    )
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("TIKTOKEN_CACHE_DIR", str(cache_dir))
        yield tiktoken.Encoding(**openai_public.o200k_harmony())
