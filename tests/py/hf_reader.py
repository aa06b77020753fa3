"""Readers of quantized Hugging Face checkpoints, written from each format's published
description, not from lockstep's code:

- ModelOpt unified HF checkpoint, NVFP4 (quant_algo NVFP4 / W4A16_NVFP4): per linear module
  `weight` U8 [N, K/2] holding two E2M1 codes per byte, element 2j in the low nibble;
  `weight_scale` F8_E4M3 [N, K/16], one scale per 16 consecutive elements of a row;
  `weight_scale_2` F32 scalar = amax / (6 * 448), the per-tensor decode scale; optional
  `input_scale`. A value is e2m1 * weight_scale * weight_scale_2. hf_quant_config.json names the
  algorithm and the excluded (bf16) modules.
- compressed-tensors `nvfp4-pack-quantized`: `weight_packed` (as above), `weight_scale`
  (as above), `weight_global_scale` F32 [1] = 6 * 448 / amax, the encode scale: a value is
  e2m1 * (weight_scale / weight_global_scale).
- ModelOpt MXFP8: `weight` F8_E4M3 [N, K], `weight_scale` U8 [N, K/32] holding E8M0 exponents
  (2^(e - 127)) of 32 consecutive elements of a row.
- DeepSeek-V3 FP8 (`quant_method: fp8`, `weight_block_size: [128, 128]`): `weight` F8_E4M3
  [N, K], `weight_scale_inv` F32 [ceil(N/128), ceil(K/128)], the dequantization multiplier of
  each 128 x 128 block.

The E2M1 table and the E4M3 / E8M0 decodings follow the OCP Microscaling spec (ml_dtypes for
E4M3). Everything is NumPy float32.
"""
import json
import os

import ml_dtypes
import numpy as np

from st_files import read_st

E2M1 = np.array([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0], dtype=np.float32)

_NP = {
    "U8": np.uint8,
    "F32": np.float32,
    "BF16": ml_dtypes.bfloat16,
    "F16": np.float16,
    "F8_E4M3": ml_dtypes.float8_e4m3fn,
    "I32": np.int32,
    "I64": np.int64,
}


def load_dir(d):
    """(tensors {name: ndarray}, dtypes {name: safetensors dtype}, config, hf_quant_config, files)."""
    idx = os.path.join(d, "model.safetensors.index.json")
    if os.path.exists(idx):
        with open(idx) as f:
            files = sorted(set(json.load(f)["weight_map"].values()))
    else:
        files = ["model.safetensors"]
    tensors, dtypes = {}, {}
    for fn in files:
        raw, _ = read_st(os.path.join(d, fn))
        for name, (dt, shape, b) in raw.items():
            assert name not in tensors, name
            tensors[name] = np.frombuffer(b, dtype=_NP[dt]).reshape(shape)
            dtypes[name] = dt
    with open(os.path.join(d, "config.json")) as f:
        config = json.load(f)
    hq = None
    if os.path.exists(os.path.join(d, "hf_quant_config.json")):
        with open(os.path.join(d, "hf_quant_config.json")) as f:
            hq = json.load(f)
    return tensors, dtypes, config, hq, files


def unpack_e2m1(packed):
    """U8 [N, K/2] -> codes [N, K]: element 2j in the low nibble of byte j, 2j+1 in the high."""
    p = np.asarray(packed, dtype=np.uint8)
    codes = np.empty((p.shape[0], p.shape[1] * 2), dtype=np.uint8)
    codes[:, 0::2] = p & 0x0F
    codes[:, 1::2] = p >> 4
    return codes


def e2m1_values(codes):
    v = E2M1[codes & 0x7]
    return np.where((codes & 0x8) != 0, -v, v).astype(np.float32)


def e4m3_values(a):
    return np.asarray(a).astype(np.float32)


def e8m0_values(e):
    e = np.asarray(e, dtype=np.uint32)
    out = (e << 23).view(np.float32).copy()
    out[e == 0] = np.float32(2.0 ** -127)
    out[e == 255] = np.nan
    return out


def expand_cols(s, block):
    return np.repeat(np.asarray(s, dtype=np.float32), block, axis=1)


def nvfp4_module(t, prefix, fmt):
    """(codes [N, K], block scale values [N, K/16] f32, global f32, data bytes, scale bytes)."""
    if fmt == "modelopt-nvfp4":
        data, g = t[prefix + ".weight"], t[prefix + ".weight_scale_2"]
        assert g.shape == (), g.shape
    else:
        data, g = t[prefix + ".weight_packed"], t[prefix + ".weight_global_scale"]
        assert g.shape == (1,), g.shape
    sc = t[prefix + ".weight_scale"]
    assert sc.dtype == ml_dtypes.float8_e4m3fn and data.dtype == np.uint8
    return unpack_e2m1(data), e4m3_values(sc), np.float32(g.reshape(())), data, sc


def dequant_modelopt(codes, scale, g_dec):
    """ModelOpt's reading: e2m1 x (weight_scale x weight_scale_2), the block factor first."""
    return e2m1_values(codes) * expand_cols(scale * np.float32(g_dec), 16)


def dequant_ct(codes, scale, g_enc):
    """compressed-tensors' reading: e2m1 x (weight_scale / weight_global_scale)."""
    return e2m1_values(codes) * expand_cols(scale / np.float32(g_enc), 16)


def dequant_inner_first(codes, scale, g_dec):
    """The contract's order (CONTRACT.md section 2): (e2m1 x e4m3), exact, then x the decode
    scale."""
    return (e2m1_values(codes) * expand_cols(scale, 16)) * np.float32(g_dec)


def dequant_mxfp8(q, e):
    return e4m3_values(q) * expand_cols(e8m0_values(e), 32)


def dequant_fp8_block(q, scale_inv):
    n, k = q.shape
    s = np.repeat(np.repeat(np.asarray(scale_inv, dtype=np.float32), 128, axis=0), 128, axis=1)
    return e4m3_values(q) * s[:n, :k]


def quantized_prefixes(t, dtypes, fmt):
    if fmt == "compressed-tensors-nvfp4":
        return sorted(n[: -len(".weight_packed")] for n in t if n.endswith(".weight_packed"))
    want = "U8" if fmt == "modelopt-nvfp4" else "F8_E4M3"
    return sorted(n[: -len(".weight")] for n in t if n.endswith(".weight") and dtypes[n] == want)
