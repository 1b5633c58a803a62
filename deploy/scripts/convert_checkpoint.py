#!/usr/bin/env python3
"""Convert a Hugging Face safetensors checkpoint directory to bf16 or f16.

Every floating-point tensor (F32, F64, F16, BF16) is rounded to the target
dtype, to nearest with ties to even (the rounding of common/base/dtype.h and
docs/numerics.md "Model dtype"); infinities stay infinities and NaN stays a
quiet NaN with its sign. F32 and F16 values are exact in double precision, so
the single rounding from double gives the same bits as rounding the f32
value. Integer and boolean tensors are copied unchanged. config.json is
copied with torch_dtype set to "bfloat16" or "float16"; every other file
that is not a weight file (tokenizer.json, tokenizer_config.json,
generation_config.json, ...) is copied as is. Sharded checkpoints
(model.safetensors.index.json) keep their shard names, and the index gets
the new total size.

Standard library only (no numpy, no torch): about a second per million
parameters; each shard is read into memory whole.

Exit codes: 0 converted; 1 bad input (missing directory, no safetensors
weights, a malformed file) or an I/O error; 2 bad usage (unknown option or
dtype); 3 the output exists and --force was not given.
"""

import argparse
import array
import json
import math
import os
import shutil
import struct
import sys
import tempfile

PROG = "convert_checkpoint"

TARGETS = {
    # --dtype: (safetensors dtype, config.json torch_dtype)
    "bf16": ("BF16", "bfloat16"),
    "f16": ("F16", "float16"),
}

# Bytes per element of every safetensors dtype; the float ones are converted.
DTYPE_BYTES = {
    "BOOL": 1, "U8": 1, "I8": 1, "F8_E4M3": 1, "F8_E5M2": 1,
    "I16": 2, "U16": 2, "F16": 2, "BF16": 2,
    "I32": 4, "U32": 4, "F32": 4,
    "I64": 8, "U64": 8, "F64": 8,
}
FLOAT_DTYPES = ("F32", "F64", "F16", "BF16")

# A header larger than this is not a checkpoint header (safetensors itself
# refuses headers over 100 MB).
MAX_HEADER_BYTES = 100 << 20

WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".ckpt", ".h5", ".msgpack", ".gguf")
INDEX_NAME = "model.safetensors.index.json"
SINGLE_NAME = "model.safetensors"


class InputError(Exception):
    """Bad input: reported as one line, exit code 1."""


class OutputExists(Exception):
    """The output directory exists and --force was not given: exit code 3."""


class Parser(argparse.ArgumentParser):
    def error(self, message):
        # One line instead of argparse's usage block; exit code 2.
        sys.stderr.write(f"{PROG}: error: {message} (see --help)\n")
        sys.exit(2)


def load_floats(dtype, data):
    """The tensor's values as Python floats (exact) from little-endian bytes."""
    if dtype == "F32":
        a = array.array("f")
    elif dtype == "F64":
        a = array.array("d")
    elif dtype == "F16":
        n = len(data) // 2
        return list(struct.unpack(f"<{n}e", data))
    else:  # BF16: the top half of an f32
        h = array.array("H")
        h.frombytes(data)
        if sys.byteorder == "big":
            h.byteswap()
        bits = array.array("I", (b << 16 for b in h))
        return array.array("f", bits.tobytes())
    a.frombytes(data)
    if sys.byteorder == "big":
        a.byteswap()
    return a


def to_bf16_bits(x):
    """bf16 bits of x, rounded to nearest even (x is an f32 value or any double)."""
    if math.isnan(x):
        sign = 0x8000 if math.copysign(1.0, x) < 0 else 0
        return sign | 0x7fc0
    if math.isinf(x):
        return 0xff80 if x < 0 else 0x7f80
    sign = 0x8000 if math.copysign(1.0, x) < 0 else 0
    a = abs(x)
    if a == 0.0:
        return sign
    # bf16 has f32's exponent range and 8 significant bits. Express a as
    # m * 2^e with m in [2^7, 2^8) (normal) or a multiple of 2^-133
    # (subnormal), round m to an integer with ties to even, then pack.
    mant, exp = math.frexp(a)  # a = mant * 2^exp, mant in [0.5, 1)
    e = max(exp - 8, -133)     # 2^-133: the step of bf16 subnormals
    m = round(math.ldexp(a, -e))  # round() ties to even; the ldexp is exact
    if m >= 256:               # carried into the next binade
        m //= 2
        e += 1
    if m < 128:                # subnormal (or rounded down to zero)
        return sign | m
    biased = e + 8 - 1 + 127   # exponent of the leading bit, biased
    if biased >= 255:
        return sign | 0x7f80   # rounded past the largest finite value
    return sign | (biased << 7) | (m - 128)


def to_f16_bits(x):
    """f16 bits of x, rounded to nearest even; overflow gives infinity."""
    if math.isnan(x):
        sign = 0x8000 if math.copysign(1.0, x) < 0 else 0
        return sign | 0x7e00
    try:
        # struct's 'e' rounds a double to nearest even, subnormals included.
        return struct.unpack("<H", struct.pack("<e", x))[0]
    except OverflowError:
        return 0xfc00 if x < 0 else 0x7c00


def f32_bits(data):
    """The u32 bit patterns of little-endian f32 data."""
    bits = array.array("I")
    bits.frombytes(data)
    if sys.byteorder == "big":
        bits.byteswap()
    return bits


def convert_tensor(dtype, data, target):
    """The tensor's bytes in the target dtype (little-endian)."""
    if target == "BF16" and dtype == "F32":
        # Fast path on the f32 bits (most checkpoints): round to nearest even
        # on the 16 dropped bits; NaN keeps its sign and top payload, quiet.
        bits = f32_bits(data)
        out = array.array(
            "H",
            ((b >> 16) | 0x40 if (b & 0x7fffffff) > 0x7f800000 else (b + 0x7fff + ((b >> 16) & 1)) >> 16
             for b in bits))
    elif dtype == "F32":
        # f16 from f32: a NaN keeps its sign and top payload bits, as in C++.
        bits = f32_bits(data)
        out = array.array(
            "H",
            ((b >> 16) & 0x8000 | 0x7e00 | (b >> 13) & 0x3ff if (b & 0x7fffffff) > 0x7f800000
             else to_f16_bits(v) for b, v in zip(bits, load_floats(dtype, data))))
    else:
        narrow = to_bf16_bits if target == "BF16" else to_f16_bits
        out = array.array("H", (narrow(v) for v in load_floats(dtype, data)))
    if sys.byteorder == "big":
        out.byteswap()
    return out.tobytes()


def read_safetensors(path):
    """(header dict, data section bytes), every tensor's range checked."""
    try:
        with open(path, "rb") as f:
            raw = f.read()
    except OSError as e:
        raise InputError(f"cannot read {path}: {e.strerror}") from e
    if len(raw) < 8:
        raise InputError(f"{path}: not a safetensors file (shorter than its 8-byte header length)")
    (n,) = struct.unpack("<Q", raw[:8])
    if n > MAX_HEADER_BYTES or 8 + n > len(raw):
        raise InputError(f"{path}: not a safetensors file (header length {n} exceeds the file)")
    try:
        header = json.loads(raw[8:8 + n].decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise InputError(f"{path}: not a safetensors file (header is not JSON: {e})") from e
    if not isinstance(header, dict):
        raise InputError(f"{path}: not a safetensors file (header is not a JSON object)")
    data = raw[8 + n:]
    for name, info in header.items():
        if name == "__metadata__":
            if not isinstance(info, dict):
                raise InputError(f"{path}: __metadata__ is not an object")
            continue
        if not isinstance(info, dict):
            raise InputError(f"{path}: tensor {name}: entry is not an object")
        dtype, shape, offsets = info.get("dtype"), info.get("shape"), info.get("data_offsets")
        if dtype not in DTYPE_BYTES:
            raise InputError(f"{path}: tensor {name}: unknown dtype {dtype!r}")
        if (not isinstance(shape, list) or
                not all(isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in shape)):
            raise InputError(f"{path}: tensor {name}: bad shape {shape!r}")
        if (not isinstance(offsets, list) or len(offsets) != 2 or
                not all(isinstance(o, int) and not isinstance(o, bool) for o in offsets) or
                not 0 <= offsets[0] <= offsets[1] <= len(data)):
            raise InputError(f"{path}: tensor {name}: byte range {offsets!r} outside the data section")
        count = 1
        for d in shape:
            count *= d
        if count * DTYPE_BYTES[dtype] != offsets[1] - offsets[0]:
            raise InputError(f"{path}: tensor {name}: {offsets[1] - offsets[0]} bytes for shape "
                             f"{shape} of {dtype}")
    return header, data


def write_safetensors(path, header, data, target):
    """Writes the converted file; returns its data section size."""
    tensors = sorted(((k, v) for k, v in header.items() if k != "__metadata__"),
                     key=lambda kv: kv[1]["data_offsets"][0])
    out_header = {}
    if "__metadata__" in header:
        out_header["__metadata__"] = header["__metadata__"]
    chunks = []
    offset = 0
    for name, info in tensors:
        begin, end = info["data_offsets"]
        dtype = info["dtype"]
        payload = data[begin:end]
        if dtype in FLOAT_DTYPES:
            payload = convert_tensor(dtype, payload, target)
            dtype = target
        out_header[name] = {"dtype": dtype, "shape": info["shape"],
                            "data_offsets": [offset, offset + len(payload)]}
        chunks.append(payload)
        offset += len(payload)
    text = json.dumps(out_header, separators=(",", ":")).encode("utf-8")
    text += b" " * (-(8 + len(text)) % 8)  # the data section starts 8-aligned
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)))
        f.write(text)
        for c in chunks:
            f.write(c)
    return offset


def weight_files(src):
    """The safetensors files of the checkpoint (single file or the index's shards)."""
    index_path = os.path.join(src, INDEX_NAME)
    if os.path.isfile(index_path):
        try:
            with open(index_path, encoding="utf-8") as f:
                index = json.load(f)
        except (OSError, ValueError) as e:
            raise InputError(f"{index_path}: not a safetensors index ({e})") from e
        wm = index.get("weight_map") if isinstance(index, dict) else None
        if not isinstance(wm, dict) or not wm:
            raise InputError(f"{index_path}: no weight_map")
        shards = []
        for shard in wm.values():
            if (not isinstance(shard, str) or os.path.basename(shard) != shard or
                    not shard.endswith(".safetensors")):
                raise InputError(f"{index_path}: bad shard name {shard!r}")
            if shard not in shards:
                shards.append(shard)
        return index, shards
    if os.path.isfile(os.path.join(src, SINGLE_NAME)):
        return None, [SINGLE_NAME]
    others = sorted(f for f in os.listdir(src) if f.endswith(WEIGHT_SUFFIXES))
    hint = f" (found {', '.join(others)}; only safetensors is supported)" if others else ""
    raise InputError(f"{src}: no {SINGLE_NAME} or {INDEX_NAME}{hint}")


def convert(src, dst, dtype, force):
    if not os.path.isdir(src):
        raise InputError(f"{src}: no such checkpoint directory")
    config_path = os.path.join(src, "config.json")
    if not os.path.isfile(config_path):
        raise InputError(f"{src}: no config.json (not a Hugging Face checkpoint directory)")
    if os.path.exists(dst):
        if os.path.realpath(dst) == os.path.realpath(src):
            raise InputError(f"{dst}: the output is the input directory")
        if not force:
            raise OutputExists(f"{dst} exists (--force replaces it)")
        if not os.path.isdir(dst):
            raise InputError(f"{dst} exists and is not a directory")
    try:
        with open(config_path, encoding="utf-8") as f:
            config = json.load(f)
    except (OSError, ValueError) as e:
        raise InputError(f"{config_path}: not JSON ({e})") from e
    if not isinstance(config, dict):
        raise InputError(f"{config_path}: not a JSON object")
    index, shards = weight_files(src)
    target, torch_dtype = TARGETS[dtype]

    # Build beside the destination and move it into place at the end, so a
    # failure never leaves a half-written checkpoint under the output name.
    parent = os.path.dirname(os.path.abspath(dst))
    os.makedirs(parent, exist_ok=True)
    work = tempfile.mkdtemp(prefix=".convert-", dir=parent)
    os.chmod(work, 0o755)  # mkdtemp's 0700 would hide the checkpoint from other users
    try:
        total = 0
        for shard in shards:
            header, data = read_safetensors(os.path.join(src, shard))
            total += write_safetensors(os.path.join(work, shard), header, data, target)
        if index is not None:
            index = dict(index)
            meta = dict(index.get("metadata") or {})
            meta["total_size"] = total
            index["metadata"] = meta
            with open(os.path.join(work, INDEX_NAME), "w", encoding="utf-8") as f:
                json.dump(index, f, indent=2)
                f.write("\n")
        config["torch_dtype"] = torch_dtype
        with open(os.path.join(work, "config.json"), "w", encoding="utf-8") as f:
            json.dump(config, f, indent=2)
            f.write("\n")
        for name in sorted(os.listdir(src)):
            path = os.path.join(src, name)
            if (name in ("config.json", INDEX_NAME) or name.endswith(WEIGHT_SUFFIXES) or
                    name.endswith(".index.json") or not os.path.isfile(path)):
                continue
            shutil.copyfile(path, os.path.join(work, name))
        if os.path.exists(dst):
            shutil.rmtree(dst)
        os.rename(work, dst)
    except BaseException:
        shutil.rmtree(work, ignore_errors=True)
        raise
    return total


def main(argv):
    p = Parser(
        prog=PROG,
        description="Convert a Hugging Face safetensors checkpoint directory to bf16 or f16 "
        "(round to nearest even; NaN and infinities kept). Copies config.json with torch_dtype "
        "updated and the tokenizer and other non-weight files.",
        epilog="Exit codes: 0 converted; 1 bad input or I/O error; 2 bad usage; "
        "3 the output exists (use --force).")
    p.add_argument("src", help="checkpoint directory (config.json and model.safetensors or "
                   "model.safetensors.index.json with its shards)")
    p.add_argument("dst", help="output directory (must not exist unless --force)")
    p.add_argument("--dtype", required=True, choices=sorted(TARGETS), help="target dtype")
    p.add_argument("--force", action="store_true", help="replace an existing output directory")
    args = p.parse_args(argv)
    try:
        total = convert(args.src, args.dst, args.dtype, args.force)
    except OutputExists as e:
        sys.stderr.write(f"{PROG}: error: {e}\n")
        return 3
    except InputError as e:
        sys.stderr.write(f"{PROG}: error: {e}\n")
        return 1
    except OSError as e:
        sys.stderr.write(f"{PROG}: error: {e.filename or ''}: {e.strerror}\n")
        return 1
    print(f"{PROG}: wrote {args.dst} ({args.dtype}, {total} weight bytes)")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
