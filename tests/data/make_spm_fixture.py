"""Writes spm_bpe.model and spm_bpe.json, the SentencePiece fixture of tests/test_tokenizer.py (not run by the
tests; kept to show how the files were made and to remake them):

    pip install sentencepiece==0.2.3   # only for this script
    python tests/data/make_spm_fixture.py

spm_bpe.model: a 1200-piece BPE model trained by the SentencePiece library itself on Python's documentation
(pydoc_data), with Llama 2's settings: byte fallback, the identity normalizer, spaces kept, a dummy prefix,
split digits, a user-defined piece. spm_bpe.json: 240 texts (documentation snippets, and mixes of code,
spaces, tabs, newlines, digits, accents, CJK and emoji) and the ids that the library encodes them to.
"""
import json
import random
import tempfile
from pathlib import Path

import pydoc_data.topics as topics
import sentencepiece as spm

HERE = Path(__file__).parent


def main():
    texts = list(topics.topics.values())
    with tempfile.TemporaryDirectory() as tmp:
        corpus = Path(tmp) / "corpus.txt"
        corpus.write_text("\n".join(texts[:60]), encoding="utf-8")
        spm.SentencePieceTrainer.train(
            input=str(corpus), model_prefix=str(Path(tmp) / "m"), vocab_size=1200, model_type="bpe",
            byte_fallback=True, normalization_rule_name="identity", remove_extra_whitespaces=False,
            add_dummy_prefix=True, split_digits=True, allow_whitespace_only_pieces=True,
            user_defined_symbols=["<|user|>"], character_coverage=0.9995, num_threads=1, minloglevel=2)
        model = (Path(tmp) / "m.model").read_bytes()
    (HERE / "spm_bpe.model").write_bytes(model)
    sp = spm.SentencePieceProcessor(model_proto=model)
    rng = random.Random(0)
    text = " ".join(texts)
    cases = []
    for k in range(240):
        if k % 3 == 0:
            parts = list("ab cd\n\t  e日😀é12345.,()") + ["   ", "def ", "self", "  return x"]
            s = "".join(rng.choice(parts) for _ in range(rng.randrange(1, 40)))
        else:
            i = rng.randrange(len(text) - 200)
            s = text[i:i + rng.randrange(1, 200)]
        cases.append({"text": s, "ids": sp.encode(s)})
    lines = ",\n".join(json.dumps(c, ensure_ascii=False) for c in cases)  # one case a line
    (HERE / "spm_bpe.json").write_text(f'{{"sentencepiece": "{spm.__version__}", "cases": [\n{lines}\n]}}\n',
                                       encoding="utf-8")


if __name__ == "__main__":
    main()
