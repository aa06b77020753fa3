"""safetensors files by hand for the CLI tests: a reader that needs no numpy type for a dtype
(F8_E4M3, F8_E8M0, ...) and a writer of arbitrary headers (malformed files on purpose)."""
import json
import struct


def read_st(path):
    """{name: (dtype, shape, bytes)}, metadata."""
    with open(path, "rb") as f:
        data = f.read()
    n = struct.unpack("<Q", data[:8])[0]
    hdr = json.loads(data[8:8 + n])
    meta = hdr.pop("__metadata__", {}) or {}
    buf = data[8 + n:]
    out = {}
    for k, v in hdr.items():
        s, e = v["data_offsets"]
        out[k] = (v["dtype"], list(v["shape"]), buf[s:e])
    return out, meta


def raw_file(header, data=b""):
    """The bytes of a file with this header (a dict, dumped as given) and data buffer."""
    h = json.dumps(header).encode()
    return struct.pack("<Q", len(h)) + h + data
