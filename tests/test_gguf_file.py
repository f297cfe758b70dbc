"""The GGUF reader (triforce/models/gguf_file.py) against ``gguf.GGUFReader``: every field's contents and every
tensor's name, type, dimensions, sizes, offset and data equal on the embedded model's file, on a file of every
value type and tensor dtype, on files it leaves to gguf's reader (big-endian, arrays of arrays), and on random
corruptions of a file (where both read it, the same; where gguf's reader reads it, ours reads it the same or
raises ValueError; ours raises nothing but ValueError)."""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

gguf = pytest.importorskip("gguf")

from triforce.models.gguf_file import GGUFFile  # noqa: E402
from triforce.models.loading import open_gguf  # noqa: E402


def contents(field):
    try:
        return ("ok", field.contents())
    except Exception as e:  # a string that is not UTF-8 raises when read, in both
        return ("raises", type(e).__name__)


def assert_same(ours: GGUFFile, path) -> None:
    theirs = gguf.GGUFReader(str(path))
    assert list(ours.fields) == list(theirs.fields)
    for name, field in theirs.fields.items():
        assert contents(ours.fields[name]) == contents(field), name
    assert len(ours.tensors) == len(theirs.tensors)
    for a, b in zip(ours.tensors, theirs.tensors):
        assert (a.name, a.tensor_type, a.shape.tolist(), a.n_elements, a.n_bytes, a.data_offset) == \
            (b.name, b.tensor_type, b.shape.tolist(), b.n_elements, b.n_bytes, b.data_offset)
        assert a.data.dtype == b.data.dtype and a.data.shape == b.data.shape and a.data.tobytes() == b.data.tobytes()
        assert not a.data.flags.writeable  # a read-only view of the mapped file, as gguf's


def every_type_file(path, endianess=gguf.GGUFEndian.LITTLE, alignment: int | None = 64):
    """Scalars and arrays of every value type, strings in several scripts, empty ones, and tensors of the plain and
    quantised dtypes (random bytes for the blocks), written by gguf's writer."""
    V = gguf.GGUFValueType
    w = gguf.GGUFWriter(str(path), "llama", endianess=endianess)
    if alignment is not None:
        w.add_custom_alignment(alignment)  # the key general.alignment, and the data laid out so
    values = {V.UINT8: 200, V.INT8: -100, V.UINT16: 60000, V.INT16: -30000, V.UINT32: 4_000_000_000,
              V.INT32: -2_000_000_000, V.FLOAT32: 1.1, V.BOOL: True, V.UINT64: 2 ** 63 + 5, V.INT64: -2 ** 62,
              V.FLOAT64: 1e-300, V.STRING: "Grüße, 世界 ✓"}
    for t, v in values.items():
        w.add_key_value(f"test.scalar.{t.name.lower()}", v, t)
        if t != V.STRING:
            w.add_key_value(f"test.array.{t.name.lower()}", [v, v, v] if t != V.BOOL else [True, False, True], V.ARRAY,
                            t)
    w.add_key_value("test.array.string", ["", "a", "Grüße", "世界", " x\n"], V.ARRAY, V.STRING)
    w.add_key_value("test.string.empty", "", V.STRING)
    rng = np.random.default_rng(0)
    w.add_tensor("f32", rng.standard_normal((3, 5)).astype(np.float32))
    w.add_tensor("f16", rng.standard_normal((2, 3, 4)).astype(np.float16))
    w.add_tensor("i32", rng.integers(-9, 9, (7,)).astype(np.int32))
    for kind, rows in (("Q8_0", 2), ("Q4_K", 3), ("BF16", 2), ("IQ2_XXS", 1)):
        qt = gguf.GGMLQuantizationType[kind]
        block, size = gguf.GGML_QUANT_SIZES[qt]
        raw = rng.integers(0, 256, (rows, 256 // block * size), dtype=np.uint8)
        w.add_tensor(kind.lower(), raw, raw_dtype=qt)  # (the writer reads the byte rows as 256 weights each)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def test_the_embedded_models_file_reads_as_ggufs_reader():
    from triforce.models.smollm2 import smollm2_gguf_path

    path = smollm2_gguf_path()
    ours = open_gguf(path)
    assert isinstance(ours, GGUFFile) and ours.reader is None  # parsed here, not left to gguf
    assert len(ours.fields["tokenizer.ggml.tokens"].contents()) == 49152
    assert_same(ours, path)


@pytest.mark.parametrize("alignment", [None, 64, 1])
def test_every_value_type_and_tensor_dtype(tmp_path, alignment):
    path = every_type_file(tmp_path / "all.gguf", alignment=alignment)
    ours = GGUFFile(str(path))
    assert ours.reader is None
    assert ours.fields["test.scalar.string"].contents() == "Grüße, 世界 ✓"
    assert ours.fields["test.array.bool"].contents() == [True, False, True]
    assert_same(ours, path)


def test_files_left_to_ggufs_reader(tmp_path):
    """Another byte order, and an array of arrays (which gguf's reader flattens), are read by gguf's reader."""
    path = every_type_file(tmp_path / "big.gguf", endianess=gguf.GGUFEndian.BIG)
    ours = GGUFFile(str(path))
    assert ours.reader is not None and ours.data_offset == ours.reader.data_offset
    assert_same(ours, path)
    w = gguf.GGUFWriter(str(tmp_path / "nested.gguf"), "llama")
    w.add_key_value("test.nested", [[1, 2], [3]], gguf.GGUFValueType.ARRAY)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    ours = GGUFFile(str(tmp_path / "nested.gguf"))
    assert ours.reader is not None and ours.fields["test.nested"].contents() == \
        gguf.GGUFReader(str(tmp_path / "nested.gguf")).fields["test.nested"].contents()


def test_malformed_files_raise_value_error(tmp_path):
    path = every_type_file(tmp_path / "all.gguf")
    raw = path.read_bytes()
    cases = {"magic": b"GGUX" + raw[4:], "version": raw[:4] + (7).to_bytes(4, "little") + raw[8:],
             "truncated": raw[:200], "header only": raw[:24]}
    for name, data in cases.items():
        bad = tmp_path / f"{name}.gguf"
        bad.write_bytes(data)
        with pytest.raises(ValueError):
            GGUFFile(str(bad))
        with pytest.raises(ValueError, match="corrupt or truncated"):
            open_gguf(bad)
    # a duplicate key, as gguf's reader refuses it (it raises KeyError)
    V = gguf.GGUFValueType
    w = gguf.GGUFWriter(str(tmp_path / "dup.gguf"), "llama")
    w.add_key_value("test.a", 1, V.UINT32)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.close()
    data = (tmp_path / "dup.gguf").read_bytes()
    kv = data.index(b"test.a") - 8
    entry = data[kv:]
    dup = bytearray(data + entry)
    dup[16:24] = (int.from_bytes(data[16:24], "little") + 1).to_bytes(8, "little")  # kv_count + 1
    (tmp_path / "dup2.gguf").write_bytes(bytes(dup))
    with pytest.raises(ValueError, match="duplicate key 'test.a'"):
        GGUFFile(str(tmp_path / "dup2.gguf"))
    with pytest.raises(KeyError):
        gguf.GGUFReader(str(tmp_path / "dup2.gguf"))


@pytest.fixture(scope="module")
def sample(tmp_path_factory):
    """(the path of a file of every type, where its tensors' bytes start)."""
    path = every_type_file(tmp_path_factory.mktemp("gguf") / "sample.gguf", alignment=None)
    return str(path), GGUFFile(str(path)).data_offset


@settings(max_examples=60, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_random_corruptions(sample, tmp_path_factory, data):
    """Bytes overwritten (in the header, the metadata or the tensor infos: the tensors' own bytes are just data) or
    the file cut short: ours raises ValueError or reads what gguf's reader reads, and never raises anything else. It
    checks every count and length against the file's end; gguf's reader takes a shorter view there, and an array
    whose count runs past the end makes it append empty views without end (found by this test: the process grew
    until the kernel killed it), so it is asked only about files ours reads."""
    path, head = sample
    raw = bytearray(open(path, "rb").read())
    for _ in range(data.draw(st.integers(1, 4), label="edits")):
        at = data.draw(st.integers(0, head), label="at")
        raw[at:at + 1] = bytes([data.draw(st.integers(0, 255), label="byte")])
    if data.draw(st.booleans(), label="cut"):
        raw = raw[:data.draw(st.integers(1, len(raw)), label="length")]
    path = tmp_path_factory.mktemp("bad") / "x.gguf"
    path.write_bytes(bytes(raw))
    try:
        ours = GGUFFile(str(path))
    except ValueError:
        return
    assert_same(ours, path)  # (gguf's reader only here: on some corruptions it never returns, see the docstring)
