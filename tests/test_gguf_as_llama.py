"""GGUF files of models that transformers runs only by their own code and llama.cpp runs as llama: InternLM2 / 2.5
and XVERSE (q / k permuted as llama's by their converters), EXAONE 3 / 3.5 (q / k in the checkpoint's order, RoPE on
halves). Each loads as the llama model its tensors are, bitwise the same as that model's llama file; with
``TRIFORCE_LLAMA_CPP=1`` every file loaded is also run by llama.cpp (tests/llama_cpp_oracle.py)."""
import pytest
import torch

from triforce.models import Llama, LlamaConfig

from .test_config import write_gguf
from .test_families import TINY, randomize_
from .test_model import TOL

pytest.importorskip("gguf")


def tiny_llama(tied: bool) -> Llama:
    torch.manual_seed(0)
    return randomize_(Llama(LlamaConfig(**{**TINY, "tie_word_embeddings": tied})).eval())


@pytest.mark.parametrize("arch", ["internlm2", "xverse", "exaone"])
@pytest.mark.parametrize("tied", [False, True], ids=["untied", "tied"])
def test_the_file_loads_as_the_llama_model_it_holds(tmp_path, arch, tied):
    model = tiny_llama(tied)
    ids = torch.randint(0, 101, (2, 30), generator=torch.Generator().manual_seed(1))
    loaded = Llama.from_pretrained(write_gguf(tmp_path / f"{arch}.gguf", model, arch=arch), cache_dir=False)
    as_llama = Llama.from_pretrained(write_gguf(tmp_path / "llama.gguf", model), cache_dir=False)
    assert loaded.config.model_type == "llama" and loaded.config.tie_word_embeddings == tied
    with torch.no_grad():
        assert torch.equal(loaded(ids), as_llama(ids))
        assert (loaded(ids) - model(ids)).abs().max().item() <= TOL


def test_each_q_k_order_matters(tmp_path, monkeypatch):
    """An exaone file written with llama's permuted q / k rows, or an internlm2 one without, loads off the model past
    TOL (the order each architecture's file holds is the one read: the test above can fail)."""
    from . import test_config

    model = tiny_llama(False)
    ids = torch.randint(0, 101, (2, 30), generator=torch.Generator().manual_seed(1))
    monkeypatch.setattr(test_config, "_GGUF_PERMUTED", ("exaone",))
    wrong = [Llama.from_pretrained(write_gguf(tmp_path / f"{a}.gguf", model, arch=a), cache_dir=False)
             for a in ("exaone", "internlm2")]
    with torch.no_grad():
        for m in wrong:
            assert (m(ids) - model(ids)).abs().max().item() > 100 * TOL
