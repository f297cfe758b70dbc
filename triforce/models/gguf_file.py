"""A GGUF file's metadata and tensors, read as ``gguf.GGUFReader`` reads them, in a fraction of its time.

``gguf.GGUFReader`` builds every metadata value out of NumPy views of the mapped file, one view per string and
per array element: a vocabulary of 49152 tokens and its merges are ~250,000 views, 2.7-3.2 s of the 4.1-4.2 s that
``load_gguf_int8`` took on SmolLM2's file on this project's CPU (a 151,936-token Qwen vocabulary has about three
times as many). :class:`GGUFFile` parses the same
layout with ``struct`` over the mapped bytes and keeps each value as the reader would return it: ``fields``
(name -> a field whose ``contents()`` is ``ReaderField.contents()``'s value: a string decoded from UTF-8 when
asked, as the reader does, a number, a bool, or a list) and ``tensors`` (``name``, ``tensor_type``, ``shape``
(the dimensions as stored, innermost first), ``n_elements``, ``n_bytes``, ``data_offset``, ``data``: the same
read-only NumPy view of the mapped file, in the same dtype and shape). Files it does not parse itself (another
byte order, arrays of arrays) are read by ``gguf.GGUFReader``. A malformed file raises ``ValueError``: a count or
length that runs past the end of the file, a duplicate key or tensor name, an unknown value or tensor type, an
unsupported version, a bad ``general.alignment``.

tests/test_gguf_file.py checks every field and tensor against ``gguf.GGUFReader`` on the embedded model's file
and on files of every value type, and random corruptions of them."""
from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import Any

import numpy as np

GGUF_MAGIC = 0x46554747  # "GGUF", little-endian
VERSIONS = (2, 3)  # what gguf.GGUFReader reads
DEFAULT_ALIGNMENT = 32

# GGUF value types (gguf.GGUFValueType): scalar type -> (struct code, NumPy dtype)
_UINT8, _INT8, _UINT16, _INT16, _UINT32, _INT32, _FLOAT32, _BOOL, _STRING, _ARRAY, _UINT64, _INT64, _FLOAT64 = \
    range(13)
# tensor types gguf's reader gives in their own NumPy dtype (every other type: its bytes, uint8)
_PLAIN = {"F16": np.float16, "F32": np.float32, "F64": np.float64, "I8": np.int8, "I16": np.int16, "I32": np.int32,
          "I64": np.int64}
_SCALARS = {_UINT8: ("<B", np.uint8), _INT8: ("<b", np.int8), _UINT16: ("<H", np.uint16), _INT16: ("<h", np.int16),
            _UINT32: ("<I", np.uint32), _INT32: ("<i", np.int32), _FLOAT32: ("<f", np.float32),
            _BOOL: ("<?", np.bool_), _UINT64: ("<Q", np.uint64), _INT64: ("<q", np.int64),
            _FLOAT64: ("<d", np.float64)}


class _Fallback(Exception):
    """A file this parser leaves to gguf.GGUFReader (another byte order, nested arrays)."""


@dataclass(frozen=True)
class Field:
    """One metadata value; ``contents()`` as ``gguf.ReaderField.contents()`` returns it."""

    name: str
    kind: int          # the GGUF value type
    value: Any         # a Python scalar, the bytes of a string, a NumPy array, or a list of bytes (strings)
    item_kind: int | None = None  # an array's element type

    def contents(self) -> Any:
        if self.kind == _STRING:
            return str(self.value, encoding="utf-8")
        if self.kind == _ARRAY:
            if self.item_kind == _STRING:
                return [str(s, encoding="utf-8") for s in self.value]
            return self.value.tolist()
        return self.value


@dataclass(frozen=True)
class Tensor:
    """One tensor's description and its data, as ``gguf.ReaderTensor``."""

    name: str
    tensor_type: Any   # gguf.GGMLQuantizationType
    shape: np.ndarray  # uint64 dimensions as stored (innermost first)
    n_elements: int
    n_bytes: int
    data_offset: int
    data: np.ndarray


class GGUFFile:
    """``GGUFFile(path)``: ``fields`` (an ordered dict of :class:`Field`) and ``tensors`` (a list of
    :class:`Tensor`), as ``gguf.GGUFReader(path)`` has them (module docstring); ``reader`` is that reader where
    the file was left to it (else None)."""

    def __init__(self, path):
        self.reader = None
        self.data = np.memmap(path, mode="r")
        try:
            self._parse()
        except _Fallback:
            import gguf

            self.reader = gguf.GGUFReader(path)
            self.fields, self.tensors = self.reader.fields, self.reader.tensors
            self.data_offset = self.reader.data_offset

    # -- parsing (little-endian only; everything else goes to gguf's reader)
    def _need(self, off: int, n: int) -> int:
        if n < 0 or off + n > self.size:
            raise ValueError(f"GGUF: {n} bytes at offset {off} run past the end of the file ({self.size} bytes)")
        return off + n

    def _unpack(self, code: str, off: int):
        end = self._need(off, struct.calcsize(code))
        return struct.unpack_from(code, self.buf, off)[0], end

    def _bytes(self, off: int) -> tuple[bytes, int]:
        n, off = self._unpack("<Q", off)
        end = self._need(off, n)
        return bytes(self.buf[off:end]), end

    def _value(self, kind: int, off: int, name: str) -> tuple[Field, int]:
        if kind == _STRING:
            s, off = self._bytes(off)
            return Field(name, kind, s), off
        if kind in _SCALARS:
            v, off = self._unpack(_SCALARS[kind][0], off)
            return Field(name, kind, v), off
        if kind != _ARRAY:
            raise ValueError(f"GGUF: unknown value type {kind} of {name!r}")
        item, off = self._unpack("<I", off)
        n, off = self._unpack("<Q", off)
        if item == _STRING:
            items = []
            for _ in range(n):
                s, off = self._bytes(off)
                items.append(s)
            return Field(name, kind, items, item), off
        if item == _ARRAY:
            raise _Fallback
        if item not in _SCALARS:
            raise ValueError(f"GGUF: unknown array element type {item} of {name!r}")
        dtype = np.dtype(_SCALARS[item][1])
        end = self._need(off, n * dtype.itemsize)
        return Field(name, kind, np.frombuffer(self.buf, dtype, n, off), item), end

    def _parse(self) -> None:
        import gguf

        self.buf = memoryview(self.data)  # (np.memmap refuses an empty file)
        self.size = len(self.buf)
        magic, off = self._unpack("<I", 0)
        if magic != GGUF_MAGIC:
            raise ValueError("GGUF magic invalid")
        version, off = self._unpack("<I", off)
        if version & 0xFFFF == 0:
            raise _Fallback  # the other byte order
        if version not in VERSIONS:
            raise ValueError(f"GGUF: version {version}, not one of {VERSIONS}")
        n_tensors, off = self._unpack("<Q", off)
        n_kv, off = self._unpack("<Q", off)
        fields = {"GGUF.version": Field("GGUF.version", _UINT32, version),
                  "GGUF.tensor_count": Field("GGUF.tensor_count", _UINT64, n_tensors),
                  "GGUF.kv_count": Field("GGUF.kv_count", _UINT64, n_kv)}
        for _ in range(n_kv):
            key, off = self._bytes(off)
            name = str(key, encoding="utf-8")
            kind, off = self._unpack("<I", off)
            field, off = self._value(kind, off, name)
            if name in fields:
                raise ValueError(f"GGUF: duplicate key {name!r}")
            fields[name] = field
        infos, names = [], set()
        for _ in range(n_tensors):
            raw, off = self._bytes(off)
            name = str(raw, encoding="utf-8")
            if name in names:
                raise ValueError(f"GGUF: duplicate tensor {name!r}")
            names.add(name)
            n_dims, off = self._unpack("<I", off)
            end = self._need(off, 8 * n_dims)
            dims = np.frombuffer(self.buf, np.uint64, n_dims, off).copy()
            kind, off = self._unpack("<I", end)
            at, off = self._unpack("<Q", off)
            infos.append((name, dims, gguf.GGMLQuantizationType(kind), at))
        align = fields.get("general.alignment")
        alignment = DEFAULT_ALIGNMENT
        if align is not None:
            if align.kind != _UINT32:
                raise ValueError("GGUF: general.alignment must be a uint32")
            alignment = align.value
            if alignment == 0 or alignment & (alignment - 1):
                raise ValueError("GGUF: general.alignment must be a non-zero power of two")
        start = -(-off // alignment) * alignment
        self.fields, self.tensors, self.data_offset = fields, [], start
        for name, dims, kind, at in infos:
            n = 1
            for d in dims.tolist():
                n *= d
            block, type_size = gguf.GGML_QUANT_SIZES[kind]
            n_bytes = n * type_size // block
            shape = tuple(reversed(dims.tolist()))
            dtype, count = _PLAIN.get(kind.name), n
            if dtype is None:
                dtype, count, shape = np.uint8, n_bytes, gguf.quant_shape_to_byte_shape(shape, kind)
            lo = start + at
            size = np.dtype(dtype).itemsize
            data = self.data[lo:lo + size * count].view(dtype)[:count].reshape(shape)
            self.tensors.append(Tensor(name, kind, dims, n, n_bytes, lo, data))
