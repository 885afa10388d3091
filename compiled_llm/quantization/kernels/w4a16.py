"""W4A16 Triton kernels over the canonical packed layout (quantization/packing.py). MMA GEMM,
swap-AB (out.T = W @ x.T): 16-bit x: two nibbles a LOP3 into a 16-bit pair, zero off in it
(exact), s ((q - z) . x) per group; float32 x: integers, s (q . x - z sum(x)). GEMV (gemv=True,
up to GEMV_MAX_ROWS rows): CUDA cores, the float exponent trick. Small M may split K (float32
partials); tiles: w4a16_tuning.py."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from compiled_llm.attention.kernels import kernels_interpreted
from compiled_llm.quantization.kernels.w4a16_tuning import (
    GEMV_MAX_ROWS,
    W4A16Config,
    paired_dequant,
    tuned_w4a16_config,
)

# 0xF passed at run time: as an immediate, ptxas re-materialized each shifted mask before every
# LOP3 (a fifth more instructions in the loop); as a value the five masks stay in registers
NIBBLE_MASK = 0xF
SMS = 132  # H200 streaming multiprocessors: the unit of the built-in launches' program counts
__all__ = ["GEMV_MAX_ROWS", "W4A16Config", "gemv_fits", "mma_fits", "w4a16_config",
           "w4a16_gemm_triton", "w4a16_gemv_config"]


@triton.jit
def _unpacked_tile(qweight_ptr, offs_n, col_ok, tile, stride_qn, BLOCK_N: tl.constexpr,
                   BLOCK_K: tl.constexpr, EXPAND: tl.constexpr):
    """The tile's 4-bit values q[n, k] as int32 [BLOCK_N, BLOCK_K] (k = 8 * word + nibble)."""
    row = qweight_ptr + offs_n[:, None] * stride_qn
    if EXPAND:
        offs_k = tl.arange(0, BLOCK_K)
        words = tl.load(row + (tile * BLOCK_K + offs_k)[None, :] // 8, mask=col_ok[:, None],
                        other=0)
        return (words >> ((offs_k % 8) * 4)[None, :]) & 0xF
    offs_w = tile * (BLOCK_K // 8) + tl.arange(0, BLOCK_K // 8)
    words = tl.load(row + offs_w[None, :], mask=col_ok[:, None], other=0)  # [BN, BK / 8]
    nibbles = (words[:, :, None] >> (tl.arange(0, 8) * 4)[None, None, :]) & 0xF
    return tl.reshape(nibbles, (BLOCK_N, BLOCK_K))


# Two nibbles (i, i + 4) of a word as the 16-bit pair (2^e + q) with one LOP3 (2^e: 128 in
# bfloat16, 1024 in float16, whose unit is the mantissa's lowest bit), then 1 * pair - (2^e + z)
# in one FMA: exact (sm_80 has bf16x2 FMA, not bf16x2 subtract). pack=2: $4 holds two
# half-words (nibbles 0-3, 4-7), $5 the pair -(2^e + z).
_PAIRS_ASM = """{{
.reg .b32 t<3>, o<4>, one;
mov.b32 one, {one};
lop3.b32 o0, $4, 0x000f000f, {magic}, 0xea;
shr.u32 t0, $4, 4;
lop3.b32 o1, t0, 0x000f000f, {magic}, 0xea;
shr.u32 t1, $4, 8;
lop3.b32 o2, t1, 0x000f000f, {magic}, 0xea;
shr.u32 t2, $4, 12;
lop3.b32 o3, t2, 0x000f000f, {magic}, 0xea;
fma.rn.{kind}x2 $0, o0, one, $5;
fma.rn.{kind}x2 $1, o1, one, $5;
fma.rn.{kind}x2 $2, o2, one, $5;
fma.rn.{kind}x2 $3, o3, one, $5;
}}"""
_BF16_PAIRS = tl.constexpr(_PAIRS_ASM.format(magic="0x43004300", one="0x3f803f80", kind="bf16"))
_FP16_PAIRS = tl.constexpr(_PAIRS_ASM.format(magic="0x64006400", one="0x3c003c00", kind="f16"))


@triton.jit
def _nibble(half_words, zero_neg, INDEX: tl.constexpr, MAGIC: tl.constexpr):
    """The interpreter's spelling of one asm output: nibble INDEX of each half-word, minus z."""
    biased = (((half_words >> (4 * INDEX)) & 0xF) | MAGIC).to(tl.int16)
    biased = biased.to(zero_neg.dtype, bitcast=True)
    return (biased.to(tl.float32) + zero_neg.to(tl.float32)).to(zero_neg.dtype)


@triton.jit
def _paired_tile(half_words, zero_neg, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                 ASM: tl.constexpr):
    """int16 [BN, BK / 4] half-words, -(2^e + z) [BN, BK / 4] -> q - z [BN, BK] in the x dtype,
    position 2i + h of each word's 8 holding its nibble i + 4h."""
    bf16: tl.constexpr = zero_neg.dtype == tl.bfloat16
    if ASM:
        q0, q1, q2, q3 = tl.inline_asm_elementwise(
            _BF16_PAIRS if bf16 else _FP16_PAIRS, "=r,=r,=r,=r,r,r", [half_words, zero_neg],
            dtype=(zero_neg.dtype,) * 4, is_pure=True, pack=2)
    else:
        magic: tl.constexpr = 0x4300 if bf16 else 0x6400
        q0 = _nibble(half_words, zero_neg, 0, magic)
        q1 = _nibble(half_words, zero_neg, 1, magic)
        q2 = _nibble(half_words, zero_neg, 2, magic)
        q3 = _nibble(half_words, zero_neg, 3, magic)
    pairs: tl.constexpr = (BLOCK_N, BLOCK_K // 8, 2)  # [BN, words, h]
    tile = tl.join(tl.join(tl.reshape(q0, pairs), tl.reshape(q2, pairs)),
                   tl.join(tl.reshape(q1, pairs), tl.reshape(q3, pairs)))  # [.., h, i // 2, i % 2]
    return tl.reshape(tl.permute(tile, (0, 1, 3, 4, 2)), (BLOCK_N, BLOCK_K))


@triton.jit
def _paired_x(x, BLOCK_M: tl.constexpr, BLOCK_K: tl.constexpr):
    """x [BM, BK] in _paired_tile's order: position 2i + h of each 8 holds k = i + 4h."""
    split = tl.reshape(x, (BLOCK_M, BLOCK_K // 8, 2, 4))  # [BM, words, h, i]
    return tl.reshape(tl.permute(split, (0, 1, 3, 2)), (BLOCK_M, BLOCK_K))


@triton.jit
def _paired_dot(qweight_ptr, x_ptr, zero, offs_n, offs_m, col_ok, row_ok, tile, stride_qn,
                stride_xm, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                ASM: tl.constexpr):
    """(q - z) . x of one tile [BN, BM] in float32, q - z exact in x's 16-bit dtype."""
    half_ptr = qweight_ptr.to(tl.pointer_type(tl.int16))
    halves = tl.load(half_ptr + offs_n[:, None] * (2 * stride_qn) + tile * (BLOCK_K // 4)
                     + tl.arange(0, BLOCK_K // 4)[None, :], mask=col_ok[:, None], other=0)
    x = tl.load(x_ptr + offs_m[:, None] * stride_xm + tile * BLOCK_K
                + tl.arange(0, BLOCK_K)[None, :], mask=row_ok[:, None], other=0.0)  # [BM, BK]
    zero_neg = -(zero.to(tl.float32) + (128.0 if x.dtype == tl.bfloat16 else 1024.0))
    zero_neg = tl.broadcast_to(zero_neg.to(x.dtype)[:, None], (BLOCK_N, BLOCK_K // 4))
    values = _paired_tile(halves, zero_neg, BLOCK_N, BLOCK_K, ASM)
    x_t = tl.trans(_paired_x(x, BLOCK_M, BLOCK_K))
    if ASM:
        return tl.dot(values, x_t)
    return tl.dot(values.to(tl.float32), x_t.to(tl.float32))  # the interpreter's 16-bit dot errs


@triton.jit
def _w4a16_kernel(x_ptr, qweight_ptr, scales_ptr, zeros_ptr, out_ptr, M, N, K,
                  stride_xm, stride_qn, stride_sn, stride_zn, stride_os, stride_om,
                  GROUP: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                  BLOCK_K: tl.constexpr, SPLIT_K: tl.constexpr, EXPAND: tl.constexpr,
                  PRECISION: tl.constexpr, PAIRED: tl.constexpr, ASM: tl.constexpr):
    pid_n, pid_k, pid_m = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    col_ok, row_ok = offs_n < N, offs_m < M
    per_split = tl.cdiv(K // BLOCK_K, SPLIT_K)
    first = pid_k * per_split
    end = tl.minimum(first + per_split, K // BLOCK_K)
    acc = tl.zeros((BLOCK_N, BLOCK_M), dtype=tl.float32)
    for tile in range(first, end):
        group = (tile * BLOCK_K) // GROUP  # BLOCK_K divides GROUP: one group per tile
        scale = tl.load(scales_ptr + offs_n * stride_sn + group, mask=col_ok, other=0.0)
        zero = tl.load(zeros_ptr + offs_n * stride_zn + group, mask=col_ok, other=0)
        if PAIRED:
            dot = _paired_dot(qweight_ptr, x_ptr, zero, offs_n, offs_m, col_ok, row_ok, tile,
                              stride_qn, stride_xm, BLOCK_M, BLOCK_N, BLOCK_K, ASM)
        else:
            values = _unpacked_tile(qweight_ptr, offs_n, col_ok, tile, stride_qn, BLOCK_N,
                                    BLOCK_K, EXPAND)
            k = tile * BLOCK_K + tl.arange(0, BLOCK_K)
            x_t = tl.load(x_ptr + offs_m[None, :] * stride_xm + k[:, None],
                          mask=row_ok[None, :], other=0.0)  # [BK, BM]
            dot = tl.dot(values.to(x_t.dtype), x_t, input_precision=PRECISION)  # [BN, BM]
            x_sum = tl.sum(x_t.to(tl.float32), axis=0)  # [BM]
            dot -= zero.to(tl.float32)[:, None] * x_sum[None, :]
        acc += dot * scale.to(tl.float32)[:, None]
    out = out_ptr + pid_k * stride_os + offs_m[None, :] * stride_om + offs_n[:, None]
    tl.store(out, acc.to(out_ptr.dtype.element_ty), mask=col_ok[:, None] & row_ok[None, :])


@triton.jit
def _biased(bits, P: tl.constexpr):
    """2^(23 - 4P) + v, exactly, as float32 for `bits` holding only v (0..15) at [4P, 4P + 4):
    with that exponent the nibble's lowest bit is the mantissa's unit (no shift, no I2F)."""
    return (bits | ((150 - 4 * P) << 23)).to(tl.float32, bitcast=True)


@triton.jit
def _dequant(words, zeros, nibble_mask, J: tl.constexpr):
    """q - z of nibble J of every word as exact float32, one LOP3 and one FADD: nibbles 0-4 read in
    place (bits 0-19 fit the 23-bit mantissa), 5-7 from one words >> 12; (2^e + q) - (2^e + z)
    rounds nothing (Sterbenz), and no 2^e-sized value is ever accumulated."""
    if J < 5:
        bits = words & (nibble_mask << (4 * J))
        P: tl.constexpr = J
    else:
        bits = (words >> 12) & (nibble_mask << (4 * (J - 3)))
        P: tl.constexpr = J - 3
    return _biased(bits, P) - _biased(zeros << (4 * P), P)


@triton.jit
def _x_nibbles(x, GT: tl.constexpr, WG: tl.constexpr):
    """x [GT, WG, 8] -> 8 float32 tensors [1, GT, WG], the j-th holding x[8 w + j] (Triton moves
    the small x tile once through shared memory to the words' layout; the splits move nothing)."""
    even, odd = tl.split(tl.reshape(x.to(tl.float32), (GT, WG, 2, 2, 2)))
    even0, even1 = tl.split(even)
    odd0, odd1 = tl.split(odd)
    x0, x4 = tl.split(even0)
    x2, x6 = tl.split(even1)
    x1, x5 = tl.split(odd0)
    x3, x7 = tl.split(odd1)
    return (x0[None], x1[None], x2[None], x3[None], x4[None], x5[None], x6[None], x7[None])


@triton.jit
def _tile_fma(accs, words, scale, zero, xs, nibble_mask, ROWS: tl.constexpr, GT: tl.constexpr,
              WG: tl.constexpr):
    """accs[r] [BN, GT, WG] += scale * sum_j (q_j - z) x_r[8 w + j] for one tile: each nibble is
    dequantized once for all ROWS rows, the scale applied once per word and row."""
    q = (_dequant(words, zero, nibble_mask, 0), _dequant(words, zero, nibble_mask, 1),
         _dequant(words, zero, nibble_mask, 2), _dequant(words, zero, nibble_mask, 3),
         _dequant(words, zero, nibble_mask, 4), _dequant(words, zero, nibble_mask, 5),
         _dequant(words, zero, nibble_mask, 6), _dequant(words, zero, nibble_mask, 7))
    out = ()
    for row in tl.static_range(ROWS):
        x_j = _x_nibbles(xs[row], GT, WG)
        dot = q[0] * x_j[0]
        for j in tl.static_range(1, 8):
            dot += q[j] * x_j[j]
        out = out + (accs[row] + dot * scale,)
    return out


@triton.jit
def _gemv_loads(w_ptrs, s_ptrs, z_ptrs, x_ptrs, tile, end, col_ok, stride_xm,
                GROUP: tl.constexpr, ROWS: tl.constexpr, BLOCK_K: tl.constexpr):
    """Tile `tile`'s packed words [BN, GT, WG] (16 bytes a thread, streamed past L2), scales
    (float32) and zeros (int32) [BN, GT, 1] and the ROWS x tiles [GT, WG, 8]; zeros from `end`
    on. (`ok` is a [1] tensor: the interpreter makes a scalar comparison int32, no load mask.)"""
    ok = tl.zeros((1,), dtype=tl.int32) + tile < end
    w_ok = ok & col_ok[:, None, None]
    words = tl.load(w_ptrs + tile * (BLOCK_K // 8), mask=w_ok, other=0,
                    eviction_policy="evict_first")
    group = (tile * BLOCK_K) // GROUP
    s_ok = ok & col_ok[:, None]
    scale = tl.load(s_ptrs + group, mask=s_ok, other=0.0).to(tl.float32)[:, :, None]
    zero = tl.load(z_ptrs + group, mask=s_ok, other=0).to(tl.int32)[:, :, None]
    xs = ()
    for row in tl.static_range(ROWS):
        xs = xs + (tl.load(x_ptrs + row * stride_xm + tile * BLOCK_K, mask=ok, other=0.0),)
    return words, scale, zero, xs


@triton.jit
def _w4a16_gemv_kernel(x_ptr, qweight_ptr, scales_ptr, zeros_ptr, out_ptr, N, K, nibble_mask,
                       stride_xm, stride_qn, stride_sn, stride_zn, stride_os, stride_om,
                       GROUP: tl.constexpr, ROWS: tl.constexpr, BLOCK_N: tl.constexpr,
                       BLOCK_K: tl.constexpr, SPLIT_K: tl.constexpr):
    # a tile: BLOCK_N weight rows x GT groups x WG words (GT = 1 when BLOCK_K divides the group)
    GT: tl.constexpr = BLOCK_K // GROUP if BLOCK_K > GROUP else 1
    WG: tl.constexpr = (GROUP if BLOCK_K > GROUP else BLOCK_K) // 8
    pid_n, pid_k = tl.program_id(0), tl.program_id(1)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    col_ok, groups = offs_n < N, tl.arange(0, GT)
    word = groups[:, None] * WG + tl.arange(0, WG)[None, :]  # [GT, WG]
    w_ptrs = qweight_ptr + offs_n[:, None, None] * stride_qn + word[None]
    s_ptrs = scales_ptr + offs_n[:, None] * stride_sn + groups[None, :]
    z_ptrs = zeros_ptr + offs_n[:, None] * stride_zn + groups[None, :]
    x_ptrs = x_ptr + word[:, :, None] * 8 + tl.arange(0, 8)[None, None, :]
    per_split = tl.cdiv(K // BLOCK_K, SPLIT_K)
    first = pid_k * per_split
    end = tl.minimum(first + per_split, K // BLOCK_K)
    accs = (tl.zeros((BLOCK_N, GT, WG), dtype=tl.float32),) * ROWS
    loads = _gemv_loads(w_ptrs, s_ptrs, z_ptrs, x_ptrs, first, end, col_ok, stride_xm, GROUP,
                        ROWS, BLOCK_K)
    for tile in range(first, end):
        # the next tile's loads go out before this one's math (Triton pipelines only dot loads)
        ahead = _gemv_loads(w_ptrs, s_ptrs, z_ptrs, x_ptrs, tile + 1, end, col_ok, stride_xm,
                            GROUP, ROWS, BLOCK_K)
        words, scale, zero, xs = loads
        accs = _tile_fma(accs, words, scale, zero, xs, nibble_mask, ROWS, GT, WG)
        loads = ahead
    out = out_ptr + pid_k * stride_os + offs_n
    for row in tl.static_range(ROWS):
        total = tl.sum(tl.sum(accs[row], axis=2), axis=1)
        tl.store(out + row * stride_om, total.to(out_ptr.dtype.element_ty), mask=col_ok)


def _launch_gemv(x, qweight, scales, zeros, out, group_size: int, config: W4A16Config):
    (m, k), n = x.shape, qweight.shape[0]
    grid = (triton.cdiv(n, config.block_n), config.split_k)
    _w4a16_gemv_kernel[grid](x, qweight, scales, zeros, out, n, k, NIBBLE_MASK, x.stride(0),
                             qweight.stride(0), scales.stride(0), zeros.stride(0),
                             out.stride(0), out.stride(1), GROUP=group_size, ROWS=m,
                             BLOCK_N=config.block_n, BLOCK_K=config.block_k,
                             SPLIT_K=config.split_k, num_warps=config.num_warps,
                             num_stages=config.num_stages)


def w4a16_config(m: int, n: int, k: int, group_size: int) -> W4A16Config:
    """The built-in MMA launch for an [m, k] x [k, n] product (no tuned file for the shape): a
    narrow token side for decode, K split until the programs cover the GPU twice."""
    block_k = min(group_size, 128)
    block_m = 16 if m <= 16 else 32 if m <= 32 else 64
    block_n = 32 if m <= 64 else 128
    programs = triton.cdiv(n, block_n) * triton.cdiv(m, block_m)
    split = 1
    while m <= 64 and programs * split < 2 * SMS and split < 8 and k // block_k >= 4 * split:
        split *= 2
    return W4A16Config(block_m, block_n, block_k, split, num_stages=3 if m <= 64 else 2)


def _power_of_two(value: int) -> bool:
    return value > 0 and value & (value - 1) == 0


def gemv_fits(config: W4A16Config, m: int, k: int, group_size: int) -> bool:
    """Whether the GEMV kernel runs `config` for m rows: powers of two for block_n, block_k and
    the group, one of block_k and the group dividing the other (a tile never straddles a group
    it does not hold whole), K a multiple of block_k."""
    block_k = config.block_k
    return (config.gemv and 1 <= m <= GEMV_MAX_ROWS and _power_of_two(config.block_n)
            and _power_of_two(block_k) and _power_of_two(group_size) and block_k >= 8
            and k % block_k == 0 and (block_k % group_size == 0 or group_size % block_k == 0))


def mma_fits(config: W4A16Config, group_size: int) -> bool:
    """Whether the MMA kernel runs `config`: an MMA config whose K tile (16 or more, for the
    dot) divides the group, so that each tile reads one group's scale and zero."""
    return not config.gemv and config.block_k >= 16 and group_size % config.block_k == 0


def w4a16_gemv_config(m: int, n: int, k: int, group_size: int) -> W4A16Config | None:
    """The built-in GEMV launch (no tuned one): 256-wide K tiles, 32 rows (eight words a thread,
    no spills at 4 tokens) where that makes two programs per SM, else 16; K split only below one
    program per SM (the partials' sum is a second kernel); None if no tile fits the group."""
    block_k = next((bk for bk in (256, 128, group_size)
                    if gemv_fits(W4A16Config(m, 16, bk, 1, gemv=True), m, k, group_size)), None)
    if block_k is None:
        return None
    block_n = 32 if triton.cdiv(n, 32) >= 2 * SMS else 16
    split = 1
    while triton.cdiv(n, block_n) * split < SMS and split < 8 and k // block_k >= 4 * split:
        split *= 2
    return W4A16Config(m, block_n, block_k, split, num_stages=1, gemv=True)


def check_w4a16_inputs(x: torch.Tensor, qweight: torch.Tensor, group_size: int) -> None:
    """ValueError unless x [M, K] matches qweight [N, K / 8] and the group size tiles K."""
    if x.device.type != "cuda" and not kernels_interpreted():
        raise ValueError("the W4A16 Triton kernel needs CUDA tensors (or TRITON_INTERPRET=1)")
    if x.dim() != 2 or qweight.shape[1] * 8 != x.shape[1]:
        raise ValueError(f"x {tuple(x.shape)} does not match qweight {tuple(qweight.shape)}")
    if group_size % 16 or x.shape[1] % group_size:
        raise ValueError(f"group_size {group_size} must be a multiple of 16 dividing K")


def w4a16_gemm_triton(x: torch.Tensor, qweight: torch.Tensor, scales: torch.Tensor,
                      zeros: torch.Tensor, group_size: int,
                      config: W4A16Config | None = None) -> torch.Tensor:
    """x [M, K] @ dequant(qweight, scales, zeros).T -> [M, N] in x's dtype: the GEMV kernel for a
    gemv config it fits, the MMA kernel for an MMA config whose K tile divides the group, else
    the built-in MMA tiles (tiles are tuned per shape, not per group size). SPLIT_K 1 writes
    x's dtype in one launch; more add float32 partials after."""
    check_w4a16_inputs(x, qweight, group_size)
    x = x.contiguous()
    (m, k), n = x.shape, qweight.shape[0]
    config = config or tuned_w4a16_config(m, n, k, x)
    gemv = config is not None and gemv_fits(config, m, k, group_size)
    if config is None or not (gemv or mma_fits(config, group_size)):
        config = w4a16_config(m, n, k, group_size)
    split = config.split_k
    out = x.new_empty((split, m, n), dtype=torch.float32 if split > 1 else x.dtype)
    if gemv:
        _launch_gemv(x, qweight, scales, zeros, out, group_size, config)
    else:
        _launch_mma(x, qweight, scales, zeros, out, group_size, config)
    return out[0] if split == 1 else out.sum(0).to(x.dtype)


def _launch_mma(x, qweight, scales, zeros, out, group_size: int, config: W4A16Config):
    (m, k), n = x.shape, qweight.shape[0]
    grid = (triton.cdiv(n, config.block_n), config.split_k, triton.cdiv(m, config.block_m))
    precision = "ieee" if x.dtype == torch.float32 else "tf32"
    _w4a16_kernel[grid](x, qweight, scales, zeros, out, m, n, k, x.stride(0), qweight.stride(0),
                        scales.stride(0), zeros.stride(0), out.stride(0), out.stride(1),
                        GROUP=group_size, BLOCK_M=config.block_m, BLOCK_N=config.block_n,
                        BLOCK_K=config.block_k, SPLIT_K=config.split_k, EXPAND=config.expand,
                        PRECISION=precision, PAIRED=paired_dequant(x),
                        ASM=not kernels_interpreted(), num_warps=config.num_warps,
                        num_stages=config.num_stages)
