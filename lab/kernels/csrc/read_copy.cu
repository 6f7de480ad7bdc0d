// Ring decode with a low-precision read copy (GDN and KDA) in CUDA, as two passes.
//
// Function: sglang_replayssm/kernels/read_copy_ref.py (module docstring). The non-flush pass
// (one warp per (decode row, value head)) is ring_read.cu's non-flush pass with the checkpoint
// rows read from the copy (bf16, or e4m3 times a per-row fp32 scale applied after the row sum),
// each lane's 8 rows x 4 columns of a chunk prefetched RC_DEPTH chunks ahead in registers; it also
// appends the raw records the exact flush replays (v in the io dtype, beta fp32). The flush pass
// replays the fp32 recurrence from the fp32 checkpoint one record at a time (every d_j against the
// exact state), 16 rows at a time in registers with the decay deferred (state = c . St), then this
// token, and writes the checkpoint and its copy (fp8: amax / 448 per row). Each pass
// leaves the other's rows alone, so the wrapper runs them concurrently. RC_FLUSH_ROWS builds the
// flush pass in the row layout instead (flush_rows_item: two threads per state row, per-column
// key tables in shared memory), RC_FLUSH_PIPE the same pipelined (flush_pipe_kernel); both measured
// beside the warp layout (notes/read-copy.md).
//
// Layout: lane owns K columns 4*lane .. 4*lane+3 of every row (ring_read.cu's helpers, included
// without its passes: RR_HELPERS_ONLY).
// Requirements (checked by read_copy_cuda.py): K = V = 128, L <= 16, checkpoint / ring / copy
// contiguous within a slot, k / g / beta rings fp32, d~ and v rings in the io dtype.

#include <cuda_fp8.h>

#include <type_traits>

#define RR_HELPERS_ONLY
#include "ring_read.cu"

#ifndef RC_DEPTH  // non-flush pass: chunks in flight ahead of the one being computed
#define RC_DEPTH 3
#endif
#ifndef RC_MIN_BLOCKS  // non-flush pass register budget, blocks of 4 warps per SM
#define RC_MIN_BLOCKS 4
#endif
#ifndef RC_READ_WARPS  // non-flush pass: warps per block (1, 2 or 4; the register budget stays RC_MIN_BLOCKS x 4
#define RC_READ_WARPS 4  // warps per SM): one-warp blocks free an SM's slot as soon as their pair is done
#endif
#ifndef RC_TC_FLUSH  // GDN flush pass: 1 = the Gram form on tensor cores (flush_item_tc), 0 = sequential
#define RC_TC_FLUSH 0
#endif
#ifndef RC_FLUSH_PREFETCH  // flush pass: 1 = the next 16-row block's state rows loaded into registers
#define RC_FLUSH_PREFETCH 0  // while the current block computes (the flush warps have registers to spare)
#endif
#ifndef RC_FP8_RECIP  // fp8 copy: 1 = x * (448 / amax) per element, 0 = x / (amax / 448) (IEEE division)
#define RC_FP8_RECIP 0
#endif
#ifndef RC_STAGES  // non-flush pass: 0 = RC_DEPTH chunks in registers (chunk loop unrolled); >= 2 = a
#define RC_STAGES 0  // cp.async ring of that many chunks per warp in shared memory (rows, d~ tile, scales)
#endif
#ifndef RC_FLUSH_ROWS  // flush pass: 0 = 16 state rows per warp, lanes own columns (flush_item); N >= 1 = one
#define RC_FLUSH_ROWS 0  // 256-thread block per (row, head), two threads per state row (flush_rows_item), N blocks per SM
#endif
#ifndef RC_FLUSH_PAIR  // warp-layout flush pass: 1 = two 16-row blocks replayed together (two chains per
#define RC_FLUSH_PAIR 0  // step: half the item's serial steps; excludes RC_FLUSH_PREFETCH, whose registers they take)
#endif
#ifndef RC_FLUSH_MIN_BLOCKS  // warp-layout flush pass: 0 = no register cap; N = at least N one-warp
#define RC_FLUSH_MIN_BLOCKS 0  // blocks per SM (65536 / (32 N) registers per thread), more room for the non-flush pass
#endif
#ifndef RC_TC_READ  // non-flush pass, staged (RC_STAGES >= 2): 1 = each chunk's row sums on tensor cores
#define RC_TC_READ 0  // (mma.m16n8k16, the read-out vectors split into f16 / bf16 terms; tc_read_setup)
#endif
#ifndef RC_READ_ROWS  // non-flush pass, staged (RC_STAGES >= 2): 1 = eight lanes per copy row of a chunk, each 16
#define RC_READ_ROWS 0  // of its columns (of two rows; the read-out vectors there in registers): one shuffle round
#endif                  // before the records' two instead of a reduce-scatter of 8 rows over 32 lanes
#ifndef RC_FLUSH_TILE  // warp-layout flush pass: 1 = lanes own 4 rows x 16 columns of a 16-row block (row sums
#define RC_FLUSH_TILE 0  // over 8 lanes: 7 shuffles a step instead of 32) against key tables built once per item;
#endif                   // 2 = the same with two blocks replayed together (no prefetch)
#ifndef RC_DTILE  // non-flush pass, register path (RC_STAGES 0): 1 = the live d~ records copied to shared
#define RC_DTILE 0  // memory once per (row, head) by cp.async (their latency under the setup's), else loaded per chunk
#endif
static_assert(RC_DEPTH >= 1 && RC_DEPTH <= 6, "RC_DEPTH is 1..6");
static_assert(RC_FLUSH_ROWS >= 0 && RC_FLUSH_ROWS <= 4, "RC_FLUSH_ROWS is 0..4");
static_assert(RC_READ_WARPS == 1 || RC_READ_WARPS == 2 || RC_READ_WARPS == 4, "RC_READ_WARPS is 1, 2 or 4");
static_assert(!(RC_FLUSH_PAIR && RC_FLUSH_PREFETCH), "RC_FLUSH_PAIR replaces RC_FLUSH_PREFETCH");
static_assert(!(RC_FLUSH_TILE && RC_FLUSH_PAIR), "RC_FLUSH_TILE 2 is the tile layout's paired replay");
static_assert(RC_FLUSH_TILE >= 0 && RC_FLUSH_TILE <= 2, "RC_FLUSH_TILE is 0..2");
static_assert(!(RC_FLUSH_TILE == 2 && RC_FLUSH_PREFETCH), "RC_FLUSH_TILE 2 takes the registers of RC_FLUSH_PREFETCH");
static_assert(RC_FLUSH_MIN_BLOCKS >= 0 && RC_FLUSH_MIN_BLOCKS <= 32, "RC_FLUSH_MIN_BLOCKS is 0..32");
static_assert(RC_STAGES == 0 || (RC_STAGES >= 2 && RC_STAGES <= 8), "RC_STAGES is 0 or 2..8");
static_assert(!RC_TC_READ || RC_STAGES >= 2, "RC_TC_READ reads staged chunks (RC_STAGES >= 2)");
static_assert(!RC_READ_ROWS || (RC_STAGES >= 2 && !RC_TC_READ), "RC_READ_ROWS reads staged chunks, not with RC_TC_READ");

// Internal linkage for everything below: the launchers' function-local statics (the flush grid's
// resident count, the dynamic shared-memory attribute) would otherwise be STB_GNU_UNIQUE symbols,
// one instance per process across every read_copy .so loaded (ctypes' RTLD_LOCAL does not separate
// them), so a second build would launch with the first build's grid and without its own attribute.
namespace {
namespace rc {

constexpr int NCH = V / ROWS;  // 16 chunks of 8 rows

// one chunk's raw copy values of one lane: 8 rows x 4 columns
template <int CF> struct Raw;
template <> struct Raw<1> { uint2 r[ROWS]; };     // bf16
template <> struct Raw<2> { uint32_t r[ROWS]; };  // e4m3

__device__ __forceinline__ float4 bf16x4(uint2 r) {
  return make_float4(__uint_as_float(r.x << 16), __uint_as_float(r.x & 0xffff0000u), __uint_as_float(r.y << 16),
                     __uint_as_float(r.y & 0xffff0000u));
}
__device__ __forceinline__ float4 e4m3x4(uint32_t r) {
  const __half2_raw lo = __nv_cvt_fp8x2_to_halfraw2(static_cast<__nv_fp8x2_storage_t>(r & 0xffffu), __NV_E4M3);
  const __half2_raw hi = __nv_cvt_fp8x2_to_halfraw2(static_cast<__nv_fp8x2_storage_t>(r >> 16), __NV_E4M3);
  const float2 a = __half22float2(*reinterpret_cast<const __half2*>(&lo));
  const float2 b = __half22float2(*reinterpret_cast<const __half2*>(&hi));
  return make_float4(a.x, a.y, b.x, b.y);
}
__device__ __forceinline__ uint2 pack_bf16(float4 x) {
  __nv_bfloat162 lo = __floats2bfloat162_rn(x.x, x.y), hi = __floats2bfloat162_rn(x.z, x.w);
  return make_uint2(*reinterpret_cast<uint32_t*>(&lo), *reinterpret_cast<uint32_t*>(&hi));
}
__device__ __forceinline__ uint32_t pack_e4m3(float4 x) {
  const uint32_t lo = __nv_cvt_float2_to_fp8x2(make_float2(x.x, x.y), __NV_SATFINITE, __NV_E4M3);
  const uint32_t hi = __nv_cvt_float2_to_fp8x2(make_float2(x.z, x.w), __NV_SATFINITE, __NV_E4M3);
  return lo | (hi << 16);
}
__device__ __forceinline__ int64_t slot_of(const void* slots, bool idx64, int n) {
  return idx64 ? static_cast<const int64_t*>(slots)[n] : static_cast<int64_t>(static_cast<const int32_t*>(slots)[n]);
}
__device__ __forceinline__ bool flush_of(const int32_t* write_pos, const int32_t* force_flush, int n, int L) {
  return write_pos[n] == L - 1 || (force_flush != nullptr && force_flush[n] != 0);
}
// x in units of a row's fp8 scale s = amax / 448 (inv = 448 / amax); pack_e4m3's satfinite
// conversion saturates it to +-448 (the reference's clamp: a finite x rounds to the same e4m3 value)
__device__ __forceinline__ float fp8_units(float x, float s, float inv) {
#if RC_FP8_RECIP
  (void)s;
  return x * inv;
#else
  (void)inv;
  return __fdiv_rn(x, s);
#endif
}
// acc + a . b as one chain (dot4's order, from acc)
__device__ __forceinline__ float dot4acc(float4 a, float4 b, float acc) {
  return fmaf(a.w, b.w, fmaf(a.z, b.z, fmaf(a.y, b.y, fmaf(a.x, b.x, acc))));
}
__device__ __forceinline__ float4 fma4(float s, float4 a, float4 c) {
  return make_float4(fmaf(s, a.x, c.x), fmaf(s, a.y, c.y), fmaf(s, a.z, c.z), fmaf(s, a.w, c.w));
}

// Reduce-scatter rounds over lanes whose register slots are pre-permuted: slot i of lane l holds
// row i ^ r(l), r(l) being the row the lane ends with (the bits of `mask` over the rounds), so a
// lane always keeps slots [0, HALF) and sends [HALF, 2 HALF) and no per-lane select is needed.
template <int HALF>
__device__ __forceinline__ void rs_perm(float* v, int mask) {
#pragma unroll
  for (int i = 0; i < HALF; ++i) v[i] += __shfl_xor_sync(FULL, v[i + HALF], mask);
}
// 16 slots (slot i = row i ^ (lane >> 1)) -> the warp total of row lane >> 1.
__device__ __forceinline__ float rs_perm16(float (&v)[16]) {
  rs_perm<8>(v, 16);
  rs_perm<4>(v, 8);
  rs_perm<2>(v, 4);
  rs_perm<1>(v, 2);
  return v[0] + __shfl_xor_sync(FULL, v[0], 1);
}
template <int HALF>
__device__ __forceinline__ void rs_perm_max(float* v, int mask) {
#pragma unroll
  for (int i = 0; i < HALF; ++i) v[i] = fmaxf(v[i], __shfl_xor_sync(FULL, v[i + HALF], mask));
}
__device__ __forceinline__ float rs_perm_max16(float (&v)[16]) {
  rs_perm_max<8>(v, 16);
  rs_perm_max<4>(v, 8);
  rs_perm_max<2>(v, 4);
  rs_perm_max<1>(v, 2);
  return fmaxf(v[0], __shfl_xor_sync(FULL, v[0], 1));
}
// RC_FLUSH_TILE, within each 8-lane group (c = lane & 7): 4 slots (slot i = row i ^ ((c >> 1) & 3))
// -> the group's total of row (c >> 1) & 3 (in lanes c and c ^ 1); rs_perm_max4 the same for max.
__device__ __forceinline__ float rs_perm4(float (&v)[4]) {
  rs_perm<2>(v, 4);
  rs_perm<1>(v, 2);
  return v[0] + __shfl_xor_sync(FULL, v[0], 1);
}
__device__ __forceinline__ float rs_perm_max4(float (&v)[4]) {
  rs_perm_max<2>(v, 4);
  rs_perm_max<1>(v, 2);
  return fmaxf(v[0], __shfl_xor_sync(FULL, v[0], 1));
}
// the inverse: x of this lane's row (c >> 1) & 3 -> o[i] = slot i's row's x, from the lanes holding it
__device__ __forceinline__ void bc_perm4(float x, float (&o)[4]) {
  o[0] = x;
  o[1] = __shfl_xor_sync(FULL, x, 2);
  o[2] = __shfl_xor_sync(FULL, x, 4);
  o[3] = __shfl_xor_sync(FULL, o[1], 4);
}

struct Args {
  const void *qkv, *a, *b;
  const float *A_log, *dt_bias;
  void* out;
  float* state;
  void* copy;
  float* scales;
  void* d_ring;  // the io dtype T: d~ is read only by later non-flush folds (approximate anyway)
  float *k_ring, *g_ring;
  void* v_ring;
  float* beta_ring;
  const void* slots;
  const int32_t *write_pos, *force_flush;
  float scale;
  int64_t s_qkv, s_a, s_b, s_state, s_d, s_k, s_g, s_copy, s_scales, s_v, s_beta;
  int B, H, HV, L, parts;
  bool idx64, l2n;
};

// 16-byte global -> shared copy of any element type (both 16-byte aligned)
__device__ __forceinline__ void cp_async16v(void* smem, const void* gmem) {
  cp_async16(static_cast<float4*>(smem), static_cast<const float*>(gmem));
}

// RC_STAGES > 0: one staged chunk of one warp, in float4: the chunk's 8 copy rows (as in memory),
// its d~ tile (record j's 8 rows at j * ROWS, io dtype T; dead records not copied, never read),
// the fp8 rows' scales
template <typename T, int CF> struct Stage {
  static constexpr int ROWS_F4 = ROWS * K * (CF == 1 ? 2 : 1) / 16;
  static constexpr int TILE_F4 = 16 * ROWS * static_cast<int>(sizeof(T)) / 16;
  static constexpr int F4 = ROWS_F4 + TILE_F4 + (CF == 2 ? ROWS / 4 : 0);
};
// RC_DTILE: a warp's d~ records [16][DT_STRIDE] in the io dtype (padded: lanes reading records 4 s + t
// at once fall into two bank groups, not one)
template <typename T> struct DTile {
  static constexpr int STRIDE = V + 16 / static_cast<int>(sizeof(T));
  static constexpr int F4 = 16 * STRIDE * static_cast<int>(sizeof(T)) / 16;
};
// RC_TC_READ, RC_READ_ROWS: the read-out vectors, once per pair
constexpr int TC_SCRATCH_F4 = RC_TC_READ || RC_READ_ROWS ? 2 * K / 4 : 0;
__host__ __device__ constexpr int read_smem_f4(int io_bytes, int cf) {
  return RC_STAGES > 0 ? RC_STAGES * (ROWS * K * (cf == 1 ? 2 : 1) / 16 + 16 * ROWS * io_bytes / 16 + (cf == 2 ? ROWS / 4 : 0)) + TC_SCRATCH_F4
         : RC_DTILE ? 16 * (V + 16 / io_bytes) * io_bytes / 16 : 0;
}

// ---- RC_TC_READ: a chunk's row sums S_r . qv and S_r . kv (8 copy rows r) as mma.m16n8k16 products
// D[16 x 8] = A[16 x 16] B[16 x 8] over 8 k-slices of 16 columns: B = the chunk's rows (n = row; the
// copy values as they are: bf16, or e4m3 widened exactly to f16), A = the read-out vectors split into
// terms, one per A row (bf16 copy: rows 0 / 1 = hi of qv / kv, 2 / 3 = mid, 4 / 5 = lo, 24 bits; fp8
// copy, f16 operands: rows 0 / 1 = hi, 2 / 3 = lo of each vector scaled by a power of two that puts its
// largest element in [2**14, 2**15), ~22 bits). Lane (g, t) = (lane >> 2, lane & 3) holds B values of
// row g and A values of term row g at its 4 logical k {2t, 2t+1, 2t+8, 2t+9} of every slice, which are
// 4 adjacent columns (a product's k order is free): slice s, value j at column tc_col(s, t) + j, so a
// lane's columns of a row are 2 (e4m3) or 4 (bf16) whole 16-byte pieces, t + 4 h. Rows are staged with
// their pieces swizzled (piece ^ 4 on odd rows) so the 8 lanes of a 16-byte load phase hit 8 bank groups.
template <int CF>
__device__ __forceinline__ int tc_col(int s, int t) {
  return CF == 1 ? 8 * (t + 4 * (s >> 1)) + 4 * (s & 1) : 16 * (t + 4 * (s >> 2)) + 4 * (s & 3);
}
// staged chunk, float4 index f of its rows -> where it is kept (pieces per row: 16 bf16, 8 e4m3)
template <int CF>
__device__ __forceinline__ int tc_swz(int f) {
  return RC_TC_READ ? f ^ ((f >> (CF == 1 ? 4 : 3)) & 1) << 2 : f;
}
__device__ __forceinline__ void mma_bf16(float (&c)[4], uint32_t a0, uint32_t a2, uint32_t b0, uint32_t b1) {
  asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
               : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
               : "r"(a0), "r"(0u), "r"(a2), "r"(0u), "r"(b0), "r"(b1));
}
__device__ __forceinline__ void mma_f16(float (&c)[4], uint32_t a0, uint32_t a2, uint32_t b0, uint32_t b1) {
  asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
               : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
               : "r"(a0), "r"(0u), "r"(a2), "r"(0u), "r"(b0), "r"(b1));
}
__device__ __forceinline__ uint32_t e4m3x2_f16x2(uint32_t r) {
  const __half2_raw h = __nv_cvt_fp8x2_to_halfraw2(static_cast<__nv_fp8x2_storage_t>(r & 0xffffu), __NV_E4M3);
  return static_cast<uint32_t>(h.x) | (static_cast<uint32_t>(h.y) << 16);
}
// 2**e with e in [-126, 126] putting the largest magnitude m in [2**14, 2**15) (1 for m = 0)
__device__ __forceinline__ float f16_prescale(float m) {
  if (!(m > 0.f)) return 1.f;
  const int e = min(max(141 - static_cast<int>((__float_as_uint(m) >> 23) & 0xff), -126), 126);
  return __uint_as_float(static_cast<uint32_t>(127 + e) << 23);
}
// term `part` of x: bf16 (CF 1) hi / mid / lo (parts 0..2), f16 (CF 2) hi / lo (parts 0..1), else 0
template <int CF>
__device__ __forceinline__ uint16_t tc_term(float x, int part) {
  if constexpr (CF == 1) {
    const __nv_bfloat16 hi = __float2bfloat16_rn(x);
    const float r1 = x - __bfloat162float(hi);
    const __nv_bfloat16 mid = __float2bfloat16_rn(r1);
    const __nv_bfloat16 lo = __float2bfloat16_rn(r1 - __bfloat162float(mid));
    const __nv_bfloat16 v = part == 0 ? hi : part == 1 ? mid : part == 2 ? lo : __float2bfloat16_rn(0.f);
    return *reinterpret_cast<const uint16_t*>(&v);
  } else {
    const __half hi = __float2half_rn(x);
    const __half lo = __float2half_rn(x - __half2float(hi));
    const __half v = part == 0 ? hi : part == 1 ? lo : __float2half_rn(0.f);
    return *reinterpret_cast<const uint16_t*>(&v);
  }
}
// A fragments (rows g, k {2t, 2t+1} and {2t+8, 2t+9} of every slice; rows g+8 are zero) of this
// lane's term of qv (g even) or kv (g odd); inv_q / inv_k undo the fp8 path's prescale (exact).
template <int CF>
__device__ __forceinline__ void tc_read_setup(float4 qv, float4 kv, float4* scratch, int lane, uint32_t (&afr)[8][2],
                                              float& inv_q, float& inv_k) {
  float sq = 1.f, sk = 1.f;
  if constexpr (CF == 2) {
    float mq = fmaxf(fmaxf(fabsf(qv.x), fabsf(qv.y)), fmaxf(fabsf(qv.z), fabsf(qv.w)));
    float mk = fmaxf(fmaxf(fabsf(kv.x), fabsf(kv.y)), fmaxf(fabsf(kv.z), fabsf(kv.w)));
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
      mq = fmaxf(mq, __shfl_xor_sync(FULL, mq, o));
      mk = fmaxf(mk, __shfl_xor_sync(FULL, mk, o));
    }
    sq = f16_prescale(mq);
    sk = f16_prescale(mk);
  }
  inv_q = 1.f / sq;  // powers of two: exact
  inv_k = 1.f / sk;
  __syncwarp();  // the previous pair's lanes are done with the scratch
  scratch[lane] = mul4(qv, sq);
  scratch[32 + lane] = mul4(kv, sk);
  __syncwarp();
  const int g = lane >> 2, t = lane & 3, part = g >> 1;
  const float4* vec = scratch + 32 * (g & 1);
#pragma unroll
  for (int s = 0; s < 8; ++s) {
    const float4 x = vec[tc_col<CF>(s, t) / 4];
    afr[s][0] = static_cast<uint32_t>(tc_term<CF>(x.x, part)) | (static_cast<uint32_t>(tc_term<CF>(x.y, part)) << 16);
    afr[s][1] = static_cast<uint32_t>(tc_term<CF>(x.z, part)) | (static_cast<uint32_t>(tc_term<CF>(x.w, part)) << 16);
  }
}
// One staged chunk's row sums: returns (S_sigma . qv, S_sigma . kv) of row sigma = (lane >> 2) & 7 in
// every lane, in copy units (before the fp8 row scale).
template <int CF>
__device__ __forceinline__ float2 tc_chunk(const float4* rows, int lane, const uint32_t (&afr)[8][2], float inv_q,
                                           float inv_k) {
  const int g = lane >> 2, t = lane & 3, sw = 4 * (g & 1);
  float c0[4] = {0.f, 0.f, 0.f, 0.f}, c1[4] = {0.f, 0.f, 0.f, 0.f};  // even / odd slices (two chains)
  if constexpr (CF == 1) {
    const uint4* rp = reinterpret_cast<const uint4*>(rows) + 16 * g;
#pragma unroll
    for (int h = 0; h < 4; ++h) {
      const uint4 r = rp[(t + 4 * h) ^ sw];
      mma_bf16(c0, afr[2 * h][0], afr[2 * h][1], r.x, r.y);
      mma_bf16(c1, afr[2 * h + 1][0], afr[2 * h + 1][1], r.z, r.w);
    }
  } else {
    const uint4* rp = reinterpret_cast<const uint4*>(rows) + 8 * g;
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const uint4 r = rp[(t + 4 * h) ^ sw];
      const uint32_t w[4] = {r.x, r.y, r.z, r.w};
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const int s = 4 * h + i;
        mma_f16((i & 1) ? c1 : c0, afr[s][0], afr[s][1], e4m3x2_f16x2(w[i]), e4m3x2_f16x2(w[i] >> 16));
      }
    }
  }
  // D[term g][rows 2t, 2t+1]: sum a vector's terms (rows g, g ^ 2 and, for bf16, g ^ 4)
  float d0 = c0[0] + c1[0], d1 = c0[1] + c1[1];
  d0 += __shfl_xor_sync(FULL, d0, 8);
  d1 += __shfl_xor_sync(FULL, d1, 8);
  if constexpr (CF == 1) {
    d0 += __shfl_xor_sync(FULL, d0, 16);
    d1 += __shfl_xor_sync(FULL, d1, 16);
  }
  // lanes 0..3 hold qv . rows (2t, 2t+1), lanes 4..7 kv . rows (2t, 2t+1)
  const int sigma = g & 7, src = sigma >> 1;
  const float q0 = __shfl_sync(FULL, d0, src), q1 = __shfl_sync(FULL, d1, src);
  const float k0 = __shfl_sync(FULL, d0, 4 + src), k1 = __shfl_sync(FULL, d1, 4 + src);
  return make_float2(((sigma & 1) ? q1 : q0) * inv_q, ((sigma & 1) ? k1 : k0) * inv_k);
}

// ---- non-flush pass: one warp per (row, value head)
template <typename T, bool KDA, int CF>
__global__ void __launch_bounds__(32 * RC_READ_WARPS, RC_MIN_BLOCKS * 4 / RC_READ_WARPS) read_kernel(const Args p) {
  const int lane = threadIdx.x & 31;
  const int pair = blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
  if (pair >= p.B * p.HV) return;
  const int HV = p.HV, H = p.H, L = p.L;
  const int n = pair / HV, hv = pair - n * HV, i_h = hv / (HV / H);
  const int64_t slot = slot_of(p.slots, p.idx64, n);
  T* outp = static_cast<T*>(p.out) + (static_cast<int64_t>(n) * HV + hv) * V;
  if (slot < 0) {
#pragma unroll
    for (int c = 0; c < 4; ++c) outp[4 * lane + c] = from_f<T>(0.f);
    return;
  }
  if (flush_of(p.write_pos, p.force_flush, n, L)) return;
  const int m = p.write_pos[n];  // < L - 1: records 0..m-1 live, this step's record goes to m
  const int s = lane & 3, sigma = (lane >> 2) & 7;
  const T* row = static_cast<const T*>(p.qkv) + n * p.s_qkv;
  using CT = typename std::conditional<CF == 1, __nv_bfloat16, uint8_t>::type;
  const CT* cbase = static_cast<const CT*>(p.copy) + slot * p.s_copy + static_cast<int64_t>(hv) * V * K + 4 * lane;
  const float* scp = p.scales + slot * p.s_scales + static_cast<int64_t>(hv) * V + sigma;
  const T* dptr = static_cast<const T*>(p.d_ring) + slot * p.s_d + static_cast<int64_t>(hv) * L * V + (4 * s) * V + sigma;
  const T* vptr = row + 2 * H * K + hv * V + sigma;
  const int jt = m - 4 * s;  // records t < jt of this lane's four are live

  constexpr int ST = RC_STAGES, DP = RC_STAGES > 0 ? 1 : RC_DEPTH;
  using SG = Stage<T, CF>;
  extern __shared__ float4 rc_read_smem[];
  float4* stage = rc_read_smem + (threadIdx.x >> 5) * (ST > 0 ? ST * SG::F4 + TC_SCRATCH_F4 : DTile<T>::F4);  // this warp's
  constexpr bool DT = ST == 0 && RC_DTILE;  // (staged chunks, or its d~ records)
  T* dtile = reinterpret_cast<T*>(stage);
  if constexpr (DT) {  // every live record, 16-byte pieces (16 per record in bf16, 32 in fp32)
    constexpr int PER = V * static_cast<int>(sizeof(T)) / 16, EL = 16 / static_cast<int>(sizeof(T));
    for (int q = lane; q < m * PER; q += 32) {
      const int j = q / PER, e = (q - j * PER) * EL;
      cp_async16v(dtile + j * DTile<T>::STRIDE + e, static_cast<const T*>(p.d_ring) + slot * p.s_d +
                  (static_cast<int64_t>(hv) * L + j) * V + e);
    }
    cp_async_commit();
  }
  const CT* chead = static_cast<const CT*>(p.copy) + slot * p.s_copy + static_cast<int64_t>(hv) * V * K;
  const T* dhead = static_cast<const T*>(p.d_ring) + slot * p.s_d + static_cast<int64_t>(hv) * L * V;
  const float* shead = p.scales + slot * p.s_scales + static_cast<int64_t>(hv) * V;
  // ST > 0: this lane's sources of the next chunk to stage (rows, d~ piece, fp8 scales), advanced by
  // one chunk per issue (chunks are issued in order, each once)
  const float4* isrc = reinterpret_cast<const float4*>(chead) + lane;
  const T* idsrc = sizeof(T) == 2 ? dhead + lane * V : dhead + (lane >> 1) * V + 4 * (lane & 1);
  const float* issrc = shead + 4 * lane;
  const bool dlive = (sizeof(T) == 2 ? lane : lane >> 1) < m;
  auto issue = [&](int c) {  // stage chunk c (rows 8c .. 8c + 7 of this head)
    float4* buf = stage + (c % ST) * SG::F4;
#pragma unroll
    for (int i = 0; i < SG::ROWS_F4 / 32; ++i) cp_async16v(buf + tc_swz<CF>(32 * i + lane), isrc + 32 * i);
    if (dlive) cp_async16v(buf + SG::ROWS_F4 + lane, idsrc);
    if (CF == 2 && lane < ROWS / 4) cp_async16v(buf + SG::ROWS_F4 + SG::TILE_F4 + lane, issrc);
    isrc += SG::ROWS_F4;
    idsrc += ROWS;
    issrc += ROWS;
  };
  if constexpr (ST > 0) {
    // the d~ pieces of dead records, never copied, are zeros in every slot (read as such below)
    if (!dlive && lane < SG::TILE_F4) {
#pragma unroll
      for (int c = 0; c < ST; ++c) stage[c * SG::F4 + SG::ROWS_F4 + lane] = make_float4(0.f, 0.f, 0.f, 0.f);
    }
#pragma unroll
    for (int c = 0; c < ST - 1; ++c) {
      issue(c);
      cp_async_commit();
    }
  }

  Raw<CF> raw[DP];
  float dd[DP][4], vv[DP], sc[DP];
  auto load = [&](int b, int c) {
    const int v0 = c * ROWS;
#pragma unroll
    for (int i = 0; i < ROWS; ++i) {
      if constexpr (CF == 1)
        raw[b].r[i] = __ldcs(reinterpret_cast<const uint2*>(cbase + static_cast<int64_t>(v0 + i) * K));
      else
        raw[b].r[i] = __ldcs(reinterpret_cast<const unsigned int*>(cbase + static_cast<int64_t>(v0 + i) * K));
    }
    if constexpr (!DT) {
#pragma unroll
      for (int t = 0; t < 4; ++t) dd[b][t] = (t < jt) ? to_f(dptr[t * V + v0]) : 0.f;
    }
    vv[b] = to_f(vptr[v0]);
    sc[b] = CF == 2 ? scp[v0] : 1.f;
  };
  if constexpr (ST == 0) {
#pragma unroll
    for (int c = 0; c < RC_DEPTH; ++c) load(c, c);
  }

  Head h;
  if (p.l2n)
    head_setup<T, KDA, true, false>(h, row, static_cast<const T*>(p.a), static_cast<const T*>(p.b), p.A_log,
                                    p.dt_bias, p.k_ring, p.g_ring, slot, n, hv, i_h, m, lane, p.scale, p.s_a, p.s_b,
                                    p.s_k, p.s_g, H, L);
  else
    head_setup<T, KDA, false, false>(h, row, static_cast<const T*>(p.a), static_cast<const T*>(p.b), p.A_log,
                                     p.dt_bias, p.k_ring, p.g_ring, slot, n, hv, i_h, m, lane, p.scale, p.s_a, p.s_b,
                                     p.s_k, p.s_g, H, L);

#if RC_TC_READ
  uint32_t afr[8][2];
  float inv_q, inv_k;
  tc_read_setup<CF>(h.qv, h.kv, stage + ST * SG::F4, lane, afr, inv_q, inv_k);
#endif
#if RC_READ_ROWS
  // lane (g, c) = (lane >> 3, lane & 7) reads chunk rows 2g, 2g + 1 at 16 columns, float4 columns
  // rcol(u): e4m3 piece c (4c + u), bf16 pieces c, c + 8 (2c + u, 2c + 14 + u); the read-out vectors there
  const int rhk = (lane >> 2) & 1;  // the row of the two it keeps: 2g + rhk = sigma
  float4 rq4[4], rk4[4];
  {
    float4* rv = stage + ST * SG::F4;  // qv at [0, 32), kv at [32, 64) (float4 column f at f)
    rv[lane] = h.qv;
    rv[32 + lane] = h.kv;
    __syncwarp();
    const int c = lane & 7;
#pragma unroll
    for (int u = 0; u < 4; ++u) {
      const int f = CF == 1 ? 2 * c + u + (u >= 2 ? 14 : 0) : 4 * c + u;
      rq4[u] = rv[f];
      rk4[u] = rv[32 + f];
    }
  }
#endif

  // this step's records: gate, key (one value head per key head), v, beta (slot m: nothing reads it now)
  if (!KDA) {
    if (lane == 0) p.g_ring[slot * p.s_g + hv * L + m] = h.g_cur_s;
  } else {
    *reinterpret_cast<float4*>(p.g_ring + slot * p.s_g + (static_cast<int64_t>(hv) * L + m) * K + 4 * lane) = h.g_cur4;
  }
  if (hv % (HV / H) == 0)
    *reinterpret_cast<float4*>(p.k_ring + slot * p.s_k + (static_cast<int64_t>(i_h) * L + m) * K + 4 * lane) = h.k;
  {
    T* vr = static_cast<T*>(p.v_ring) + slot * p.s_v + (static_cast<int64_t>(hv) * L + m) * V + 4 * lane;
    const T* vs = row + 2 * H * K + hv * V + 4 * lane;
#pragma unroll
    for (int c = 0; c < 4; ++c) vr[c] = vs[c];
    if (lane == 0) p.beta_ring[slot * p.s_beta + hv * L + m] = h.beta;
  }

  T* optr = outp + sigma;
  T* wptr = static_cast<T*>(p.d_ring) + slot * p.s_d + (static_cast<int64_t>(hv) * L + m) * V + sigma;
  // one chunk: rows v0 .. v0 + 7 (sr: this lane's columns), d[t]: record 4 s + t at row v0 + sigma
  // (zero when dead), v: this step's value at that row, scl: its fp8 scale
  // row v0 + sigma's output and d~ record from its sums sq = S . qv, sk = S . kv (records included)
  auto finish = [&](float sq, float sk, float v, int v0) {
    const float dcur = h.beta * (v - sk);
    if (s == 0) {
      optr[v0] = from_f<T>(fmaf(dcur, h.kq, sq));
      wptr[v0] = from_f<T>(dcur);
    }
  };
  // this lane's partial sums pq, pk of row v0 + sigma (the copy rows' part; over the 4 lanes of the
  // row's group, lane & 3) completed with the live records 4 s + t and finished
  auto tail = [&](float pq, float pk, const float (&d)[4], float v, float scl, int v0) {
    float rq = h.cqs[0] * d[0], rk = h.cks[0] * d[0];
#pragma unroll
    for (int t = 1; t < 4; ++t) {
      rq = fmaf(h.cqs[t], d[t], rq);
      rk = fmaf(h.cks[t], d[t], rk);
    }
    float sq = CF == 2 ? fmaf(pq, scl, rq) : pq + rq;
    float sk = CF == 2 ? fmaf(pk, scl, rk) : pk + rk;
    sq += __shfl_xor_sync(FULL, sq, 2);
    sk += __shfl_xor_sync(FULL, sk, 2);
    sq += __shfl_xor_sync(FULL, sq, 1);
    sk += __shfl_xor_sync(FULL, sk, 1);
    finish(sq, sk, v, v0);
  };
  auto chunk = [&](const float4 (&sr)[ROWS], const float (&d)[4], float v, float scl, int v0) {
    float pq[ROWS], pk[ROWS];
#pragma unroll
    for (int i = 0; i < ROWS; ++i) {
      pq[i] = dot4(sr[i], h.qv);
      pk[i] = dot4(sr[i], h.kv);
    }
    // (pre-permuted rows, as in the flush pass, measured slower here: the per-row addresses cost
    // registers (spills) and as many instructions as the selects they save)
    rs_round<4>(pq, lane, 16);
    rs_round<4>(pk, lane, 16);
    rs_round<2>(pq, lane, 8);
    rs_round<2>(pk, lane, 8);
    rs_round<1>(pq, lane, 4);
    rs_round<1>(pk, lane, 4);
    tail(pq[0], pk[0], d, v, scl, v0);
  };
  // RC_TC_READ: the same with the rows' sums st (complete in every lane of the row) from tc_chunk
  auto chunk_tc = [&](float2 st, const float (&d)[4], float v, float scl, int v0) {
    float rq = h.cqs[0] * d[0], rk = h.cks[0] * d[0];
#pragma unroll
    for (int t = 1; t < 4; ++t) {
      rq = fmaf(h.cqs[t], d[t], rq);
      rk = fmaf(h.cks[t], d[t], rk);
    }
    rq += __shfl_xor_sync(FULL, rq, 2);
    rk += __shfl_xor_sync(FULL, rk, 2);
    rq += __shfl_xor_sync(FULL, rq, 1);
    rk += __shfl_xor_sync(FULL, rk, 1);
    finish(CF == 2 ? fmaf(st.x, scl, rq) : st.x + rq, CF == 2 ? fmaf(st.y, scl, rk) : st.y + rk, v, v0);
  };
  (void)chunk_tc;
  if constexpr (ST > 0) {
    // this step's v, element 32 r + lane in vr[r]; row v0 + sigma's is lane (v0 & 31) + sigma's vr[v0 >> 5]
    float vr[4];
#pragma unroll
    for (int r = 0; r < 4; ++r) vr[r] = to_f(row[2 * H * K + hv * V + 32 * r + lane]);
#pragma unroll 1
    for (int c = 0; c < NCH; ++c) {
      __syncwarp();  // every lane is done with chunk c - 1's stage, which chunk c + ST - 1 refills
      if (c + ST - 1 < NCH) issue(c + ST - 1);
      cp_async_commit();
      cp_async_wait<ST - 1>();  // chunk c has landed (this lane's copies) ...
      __syncwarp();             // ... and every lane's
      const float4* buf = stage + (c % ST) * SG::F4;
#if RC_TC_READ
      const float2 st = tc_chunk<CF>(buf, lane, afr, inv_q, inv_k);
#elif RC_READ_ROWS
      // rows 2g + (i ^ hk), i = 0, 1 (slot 0: the row this lane keeps); then one round over lane ^ 4
      float pq[2], pk[2];
      {
        const uint4* rows = reinterpret_cast<const uint4*>(buf);
        constexpr int PIECES = CF == 1 ? 16 : 8;  // 16-byte pieces per row
#pragma unroll
        for (int i = 0; i < 2; ++i) {
          const int r = 2 * (lane >> 3) + (i ^ rhk);
          float4 x[4];  // this lane's 16 columns, float4 columns rcol(u)
          if constexpr (CF == 1) {
            const uint4 w0 = rows[r * PIECES + (lane & 7)], w1 = rows[r * PIECES + (lane & 7) + 8];
            x[0] = bf16x4(make_uint2(w0.x, w0.y));
            x[1] = bf16x4(make_uint2(w0.z, w0.w));
            x[2] = bf16x4(make_uint2(w1.x, w1.y));
            x[3] = bf16x4(make_uint2(w1.z, w1.w));
          } else {
            const uint4 w = rows[r * PIECES + (lane & 7)];
            x[0] = e4m3x4(w.x);
            x[1] = e4m3x4(w.y);
            x[2] = e4m3x4(w.z);
            x[3] = e4m3x4(w.w);
          }
          float aq = dot4(x[0], rq4[0]), ak = dot4(x[0], rk4[0]);
#pragma unroll
          for (int u = 1; u < 4; ++u) {
            aq = dot4acc(x[u], rq4[u], aq);
            ak = dot4acc(x[u], rk4[u], ak);
          }
          pq[i] = aq;
          pk[i] = ak;
        }
        pq[0] += __shfl_xor_sync(FULL, pq[1], 4);
        pk[0] += __shfl_xor_sync(FULL, pk[1], 4);
      }
#else
      float4 sr[ROWS];
#pragma unroll
      for (int i = 0; i < ROWS; ++i) {
        if constexpr (CF == 1)
          sr[i] = bf16x4(reinterpret_cast<const uint2*>(buf)[32 * i + lane]);
        else
          sr[i] = e4m3x4(reinterpret_cast<const uint32_t*>(buf)[32 * i + lane]);
      }
#endif
      const T* tile = reinterpret_cast<const T*>(buf + SG::ROWS_F4);
      float d[4];
#pragma unroll
      for (int t = 0; t < 4; ++t) d[t] = to_f(tile[(4 * s + t) * ROWS + sigma]);  // dead: zeros
      const float scl = CF == 2 ? reinterpret_cast<const float*>(buf + SG::ROWS_F4 + SG::TILE_F4)[sigma] : 1.f;
      const int v0 = c * ROWS, vreg = v0 >> 5;
      const float vsel = vreg == 0 ? vr[0] : vreg == 1 ? vr[1] : vreg == 2 ? vr[2] : vr[3];
#if RC_TC_READ
      chunk_tc(st, d, __shfl_sync(FULL, vsel, (v0 & 31) + sigma), scl, 0);
#elif RC_READ_ROWS
      tail(pq[0], pk[0], d, __shfl_sync(FULL, vsel, (v0 & 31) + sigma), scl, 0);
#else
      chunk(sr, d, __shfl_sync(FULL, vsel, (v0 & 31) + sigma), scl, 0);
#endif
      optr += ROWS;  // (finish writes row 0 + sigma of these: chunk c's)
      wptr += ROWS;
    }
  } else {
    if constexpr (DT) {
      cp_async_wait<0>();  // this lane's pieces of the d~ records ...
      __syncwarp();        // ... and every lane's
    }
#pragma unroll
    for (int c = 0; c < NCH; ++c) {
      constexpr int D = RC_DEPTH;
      const int b = c % D;
      float4 sr[ROWS];
#pragma unroll
      for (int i = 0; i < ROWS; ++i) {
        if constexpr (CF == 1)
          sr[i] = bf16x4(raw[b].r[i]);
        else
          sr[i] = e4m3x4(raw[b].r[i]);
      }
      float d[4];
#pragma unroll
      for (int t = 0; t < 4; ++t)
        d[t] = !DT ? dd[b][t] : t < jt ? to_f(dtile[(4 * s + t) * DTile<T>::STRIDE + c * ROWS + sigma]) : 0.f;
      const float v = vv[b], scl = sc[b];
      if (c + D < NCH) load(b, c + D);
      chunk(sr, d, v, scl, c * ROWS);
    }
  }
}

// ---- flush pass: grid capped at the resident blocks (one warp each), items (row, head, part) by ballot
// shared memory per warp: keys [16][32] float4, KDA decays [16][32] float4, v [16][V] fp32
// (RC_FLUSH_TILE: keys [16][32] float4 -> kt, decays -> kh (GDN too), this token's qt and the end decay
// [32] float4 each, then v)
__host__ __device__ constexpr int flush_smem_f4_seq(bool kda) {
  return (RC_FLUSH_TILE ? 2 * 16 * 32 + 2 * 32 : (kda ? 2 : 1) * 16 * 32) + 16 * V / 4;
}

// What a flush item's block replay reads: the window's records in this warp's shared memory (keys,
// KDA decays, v rows), this token's scaled q and k.q, the lane-held beta_j / alpha_j (lane j),
// and where the item's state rows, copy rows, fp8 scales and outputs go.
template <typename T, int CF>
struct FlushRows {
  using CT = typename std::conditional<CF == 1, __nv_bfloat16, uint8_t>::type;
  const Args& p;
  int m;
  float4 q;
  float kq;
  const float4* ksm;
  const float4* asm_;
  const float* vsm;
  float beta_reg, alpha_reg;
  float* sbase;
  CT* cbase;
  T* outp;
  float* scales;
  int lane;
};

// Replays NB consecutive 16-row blocks (rows r0 .. r0 + 16 NB - 1, lane slot i of block b holding
// row r0 + 16 b + (i ^ lr)) over steps 0..m from the fp32 rows in S, then writes the rows, their copy
// and (fp8) scales. The NB chains share the step's key, decay and renormalisation (the decay is per
// head or per column, the same for every row), so NB > 1 interleaves independent row sums.
// The decay is deferred: the state is c . St (c: GDN one scalar, KDA this lane's 4 columns), so a
// step costs one FMA per element for the row sums and one for the update; c is folded back into St
// (St <- c . St, c <- 1) before any product would fall under 2**-40.
template <typename T, bool KDA, int CF, int NB>
__device__ __forceinline__ void replay_blocks(const FlushRows<T, CF>& f, int r0, float4 (&S)[NB][16]) {
  constexpr float RENORM = 9.094947e-13f;  // 2**-40
  const int lane = f.lane, lr = lane >> 1, m = f.m;
  float cg = 1.f;                                // GDN
  float4 c4 = make_float4(1.f, 1.f, 1.f, 1.f);  // KDA
  // steps 0..m-1 replay the records, step m is this token (and its output)
#pragma unroll 1
  for (int j = 0; j <= m; ++j) {
    const float4 kj = f.ksm[j * 32 + lane];
    const float bj = __shfl_sync(FULL, f.beta_reg, j);
    float4 kt, kh;  // KDA: row sums use c o k_j, the update k_j / c
    if (KDA) {
      const float4 aj = f.asm_[j * 32 + lane];
      c4 = mul4(c4, aj);
      const bool low = fminf(fminf(c4.x, c4.y), fminf(c4.z, c4.w)) < RENORM;
      if (__any_sync(FULL, low)) {
#pragma unroll
        for (int b = 0; b < NB; ++b)
#pragma unroll
          for (int i = 0; i < 16; ++i) S[b][i] = mul4(S[b][i], c4);
        c4 = make_float4(1.f, 1.f, 1.f, 1.f);
      }
      kt = mul4(c4, kj);
      // c4 in [2**-40, 1]: the fast reciprocal (2 ulp) is enough for the update's scale
      kh = make_float4(__fdividef(kj.x, c4.x), __fdividef(kj.y, c4.y), __fdividef(kj.z, c4.z), __fdividef(kj.w, c4.w));
    } else {
      cg *= __shfl_sync(FULL, f.alpha_reg, j);
      if (cg < RENORM) {  // warp-uniform
#pragma unroll
        for (int b = 0; b < NB; ++b)
#pragma unroll
          for (int i = 0; i < 16; ++i) S[b][i] = mul4(S[b][i], cg);
        cg = 1.f;
      }
      kt = kj;
      kh = kj;
    }
    float pr[NB][16], dj[NB];
#pragma unroll
    for (int b = 0; b < NB; ++b)
#pragma unroll
      for (int i = 0; i < 16; ++i) pr[b][i] = dot4(S[b][i], kt);
#pragma unroll
    for (int b = 0; b < NB; ++b) {
      const float r = KDA ? rs_perm16(pr[b]) : cg * rs_perm16(pr[b]);
      dj[b] = bj * (f.vsm[j * V + r0 + 16 * b + lr] - r);
    }
    if (j == m) {  // warp-uniform: this token's output from the decayed state
      const float4 qt = KDA ? mul4(c4, f.q) : f.q;
#pragma unroll
      for (int b = 0; b < NB; ++b)
#pragma unroll
        for (int i = 0; i < 16; ++i) pr[b][i] = dot4(S[b][i], qt);
#pragma unroll
      for (int b = 0; b < NB; ++b) {
        const float oq = KDA ? rs_perm16(pr[b]) : cg * rs_perm16(pr[b]);
        if ((lane & 1) == 0) f.outp[r0 + 16 * b + lr] = from_f<T>(fmaf(dj[b], f.kq, oq));
      }
    }
#pragma unroll
    for (int b = 0; b < NB; ++b) {
      const float du = KDA ? dj[b] : __fdividef(dj[b], cg);  // the update in St's scale (cg in [2**-40, 1])
#pragma unroll
      for (int i = 0; i < 16; ++i) S[b][i] = fma4(__shfl_sync(FULL, du, 2 * (i ^ lr)), kh, S[b][i]);
    }
  }
#pragma unroll
  for (int b = 0; b < NB; ++b) {
    const int rb = r0 + 16 * b;
#pragma unroll
    for (int i = 0; i < 16; ++i) S[b][i] = KDA ? mul4(S[b][i], c4) : mul4(S[b][i], cg);
#pragma unroll
    for (int i = 0; i < 16; ++i)
      __stcs(reinterpret_cast<float4*>(f.sbase + static_cast<int64_t>(rb + (i ^ lr)) * K), S[b][i]);
    if constexpr (CF == 1) {
#pragma unroll
      for (int i = 0; i < 16; ++i)
        *reinterpret_cast<uint2*>(f.cbase + static_cast<int64_t>(rb + (i ^ lr)) * K) = pack_bf16(S[b][i]);
    } else {
      float am[16];
#pragma unroll
      for (int i = 0; i < 16; ++i)
        am[i] = fmaxf(fmaxf(fabsf(S[b][i].x), fabsf(S[b][i].y)), fmaxf(fabsf(S[b][i].z), fabsf(S[b][i].w)));
      const float amax = rs_perm_max16(am);
      const float scl = amax > 0.f ? amax / 448.f : 1.f, inv = amax > 0.f ? 448.f / amax : 1.f;
      if ((lane & 1) == 0) f.scales[rb + lr] = scl;
#pragma unroll
      for (int i = 0; i < 16; ++i) {
        const float si = __shfl_sync(FULL, scl, 2 * (i ^ lr)), ii = __shfl_sync(FULL, inv, 2 * (i ^ lr));
        const float4 x = make_float4(fp8_units(S[b][i].x, si, ii), fp8_units(S[b][i].y, si, ii),
                                     fp8_units(S[b][i].z, si, ii), fp8_units(S[b][i].w, si, ii));
        *reinterpret_cast<uint32_t*>(f.cbase + static_cast<int64_t>(rb + (i ^ lr)) * K) = pack_e4m3(x);
      }
    }
  }
}

// An item's rows [rbeg, rend) in 16-row blocks: load(S, r0) fills one block's registers, replay(S, r0)
// replays S[NB][16] from row r0. PAIR: two blocks per replay (one left over at 16 rows per part);
// else one, with PREFETCH the next block's rows requested before the current one's replay.
template <bool PAIR, bool PREFETCH, typename Load, typename Replay>
__device__ __forceinline__ void replay_item_blocks(int rbeg, int rend, Load&& load, Replay&& replay) {
  if constexpr (PAIR) {
    int r0 = rbeg;
#pragma unroll 1
    for (; r0 + 32 <= rend; r0 += 32) {
      float4 S[2][16];
      load(S[0], r0);
      load(S[1], r0 + 16);
      replay(S, r0);
    }
    if (r0 < rend) {
      float4 S[1][16];
      load(S[0], r0);
      replay(S, r0);
    }
  } else {
    float4 SN[16];  // PREFETCH: the next block's rows
    if constexpr (PREFETCH) load(SN, rbeg);
#pragma unroll 1
    for (int r0 = rbeg; r0 < rend; r0 += 16) {
      float4 S[1][16];
      if constexpr (PREFETCH) {
#pragma unroll
        for (int i = 0; i < 16; ++i) S[0][i] = SN[i];
        if (r0 + 16 < rend) load(SN, r0 + 16);
      } else {
        load(S[0], r0);
      }
      replay(S, r0);
    }
  }
}

// RC_FLUSH_TILE: what replay_tile reads. Tables (float4 column c4 at [j * 32 + c4], steps j = 0..m):
// kt_j = c_j o k_j (the row sums' key) and kh_j = k_j / c_j (the update's), c_j the deferred decay
// (state = c_j o St; GDN: one scalar); at a renormalisation step (bit j of renorm, item-uniform:
// some c_j fell under 2**-40) the state is scaled by kh_j, c restarts at 1 and the update's key is
// kt_j = k_j. qt = c_m o q, ce = c_m (folded into the rows before they are written).
template <typename T, int CF>
struct FlushTile {
  using CT = typename std::conditional<CF == 1, __nv_bfloat16, uint8_t>::type;
  const float4 *kt, *kh, *qt, *ce;
  const float* vsm;
  float beta_reg, kq;
  unsigned renorm;
  int m, lane;
  float* sbase;  // the item's state rows, float4 column lane & 7
  CT* cbase;     // its copy rows, the same column
  T* outp;
  float* scales;
};

// Replays NB consecutive 16-row blocks (rows r0 .. r0 + 16 NB - 1; NB > 1: independent chains sharing
// the step's keys) over steps 0..m, then writes their rows, copy and (fp8) scales. Lane (g, c) =
// (lane >> 3, lane & 7) holds in S[b][4 i + t] row r0 + 16 b + 4 g + (i ^ rr),
// rr = (c >> 1) & 3, at float4 column c + 8 t: a row's sum is over the 8 lanes of group g (3
// shuffle rounds) and its d_j goes back to them in 3 shuffles.
template <typename T, int CF, int NB>
__device__ __forceinline__ void replay_tile(const FlushTile<T, CF>& f, int r0, float4 (&S)[NB][16]) {
  const int lane = f.lane, c = lane & 7, rr = (c >> 1) & 3, rg = lane >> 3, m = f.m;
  // two chains of 8 per row sum over this lane's 16 columns
  auto dot16 = [](const float4* s, const float4 (&x)[4]) {
    return dot4acc(s[1], x[1], dot4(s[0], x[0])) + dot4acc(s[3], x[3], dot4(s[2], x[2]));
  };
#pragma unroll 1
  for (int j = 0; j <= m; ++j) {
    float4 kt[4], kh[4];
#pragma unroll
    for (int t = 0; t < 4; ++t) {
      kt[t] = f.kt[j * 32 + c + 8 * t];
      kh[t] = f.kh[j * 32 + c + 8 * t];
    }
    if ((f.renorm >> j) & 1u) {  // item-uniform
#pragma unroll
      for (int t = 0; t < 4; ++t) {
#pragma unroll
        for (int b = 0; b < NB; ++b)
#pragma unroll
          for (int i = 0; i < 4; ++i) S[b][4 * i + t] = mul4(S[b][4 * i + t], kh[t]);
        kh[t] = kt[t];
      }
    }
    float pr[NB][4], dj[NB];
#pragma unroll
    for (int b = 0; b < NB; ++b)
#pragma unroll
      for (int i = 0; i < 4; ++i) pr[b][i] = dot16(S[b] + 4 * i, kt);
    const float bj = __shfl_sync(FULL, f.beta_reg, j);
#pragma unroll
    for (int b = 0; b < NB; ++b) dj[b] = bj * (f.vsm[j * V + r0 + 16 * b + 4 * rg + rr] - rs_perm4(pr[b]));
    if (j == m) {  // item-uniform: this token's output from the decayed state
      float4 qt[4];
#pragma unroll
      for (int t = 0; t < 4; ++t) qt[t] = f.qt[c + 8 * t];
#pragma unroll
      for (int b = 0; b < NB; ++b) {
#pragma unroll
        for (int i = 0; i < 4; ++i) pr[b][i] = dot16(S[b] + 4 * i, qt);
        const float oq = rs_perm4(pr[b]);
        if ((c & 1) == 0) f.outp[r0 + 16 * b + 4 * rg + rr] = from_f<T>(fmaf(dj[b], f.kq, oq));
      }
    }
#pragma unroll
    for (int b = 0; b < NB; ++b) {
      float d[4];
      bc_perm4(dj[b], d);
#pragma unroll
      for (int i = 0; i < 4; ++i)
#pragma unroll
        for (int t = 0; t < 4; ++t) S[b][4 * i + t] = fma4(d[i], kh[t], S[b][4 * i + t]);
    }
  }
#pragma unroll
  for (int t = 0; t < 4; ++t) {
    const float4 ce = f.ce[c + 8 * t];
#pragma unroll
    for (int b = 0; b < NB; ++b)
#pragma unroll
      for (int i = 0; i < 4; ++i) S[b][4 * i + t] = mul4(S[b][4 * i + t], ce);
  }
#pragma unroll
  for (int b = 0; b < NB; ++b) {
    const int rb = r0 + 16 * b + 4 * rg;  // slot i: row rb + (i ^ rr)
#pragma unroll
    for (int i = 0; i < 4; ++i)
#pragma unroll
      for (int t = 0; t < 4; ++t)
        __stcs(reinterpret_cast<float4*>(f.sbase + static_cast<int64_t>(rb + (i ^ rr)) * K + 32 * t), S[b][4 * i + t]);
    if constexpr (CF == 1) {
#pragma unroll
      for (int i = 0; i < 4; ++i)
#pragma unroll
        for (int t = 0; t < 4; ++t)
          *reinterpret_cast<uint2*>(f.cbase + static_cast<int64_t>(rb + (i ^ rr)) * K + 32 * t) = pack_bf16(S[b][4 * i + t]);
    } else {
      float am[4];
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        am[i] = 0.f;
#pragma unroll
        for (int t = 0; t < 4; ++t) {
          const float4 x = S[b][4 * i + t];
          am[i] = fmaxf(am[i], fmaxf(fmaxf(fabsf(x.x), fabsf(x.y)), fmaxf(fabsf(x.z), fabsf(x.w))));
        }
      }
      const float amax = rs_perm_max4(am);
      const float scl = amax > 0.f ? amax / 448.f : 1.f, inv = amax > 0.f ? 448.f / amax : 1.f;
      if ((c & 1) == 0) f.scales[rb + rr] = scl;
      float u[4];  // the one fp8_units reads (RC_FP8_RECIP: inv, else scl), per slot
      bc_perm4(RC_FP8_RECIP ? inv : scl, u);
#pragma unroll
      for (int i = 0; i < 4; ++i)
#pragma unroll
        for (int t = 0; t < 4; ++t) {
          const float4 x = S[b][4 * i + t];
          *reinterpret_cast<uint32_t*>(f.cbase + static_cast<int64_t>(rb + (i ^ rr)) * K + 32 * t) =
              pack_e4m3(make_float4(fp8_units(x.x, u[i], u[i]), fp8_units(x.y, u[i], u[i]), fp8_units(x.z, u[i], u[i]),
                                    fp8_units(x.w, u[i], u[i])));
        }
    }
  }
}

template <typename T, bool KDA, int CF>
__device__ __forceinline__ void flush_item(const Args& p, int item, float4* smem, int lane) {
  const int HV = p.HV, H = p.H, L = p.L;
  const int pair = item / p.parts, part = item - pair * p.parts;
  const int n = pair / HV, hv = pair - n * HV, i_h = hv / (HV / H);
  const int64_t slot = slot_of(p.slots, p.idx64, n);
  const int m = p.write_pos[n];  // records 0..m-1 live (m <= L - 1); this token is step m
  float4* ksm = smem;
  float4* asm_ = smem + 16 * 32;
  float* vsm = reinterpret_cast<float*>(smem + (RC_FLUSH_TILE ? 2 * 16 * 32 + 2 * 32 : (KDA ? 2 : 1) * 16 * 32));
  const T* row = static_cast<const T*>(p.qkv) + n * p.s_qkv;

  // this token: normalised q (scaled), k, kq, beta, decay
  float4 q = ld4(row + i_h * K + 4 * lane);
  float4 k = ld4(row + H * K + i_h * K + 4 * lane);
  float q_fac = p.scale, k_fac = 1.f;
  if (p.l2n) {
    q_fac = p.scale / sqrtf(warp_sum(dot4(q, q)) + 1e-6f);
    k_fac = 1.f / sqrtf(warp_sum(dot4(k, k)) + 1e-6f);
  }
  q = mul4(q, q_fac);
  k = mul4(k, k_fac);
  const float kq = warp_sum(dot4(k, q));
  const float a_decay = expf(p.A_log[hv]);
  const T* bp = static_cast<const T*>(p.b);
  const float beta = to_f(from_f<T>(1.f / (1.f + expf(-to_f(bp[n * p.s_b + hv])))));
  const T* ap = static_cast<const T*>(p.a);
  const float* kr = p.k_ring + slot * p.s_k + static_cast<int64_t>(i_h) * L * K + 4 * lane;
  float alpha_reg = 0.f;
  if (!KDA) {
    const float x = to_f(ap[n * p.s_a + hv]) + p.dt_bias[hv];
    const float alpha = expf(-a_decay * softplus(x));
    alpha_reg = lane < m ? expf(p.g_ring[slot * p.s_g + hv * L + lane]) : (lane == m ? alpha : 0.f);
  } else {
    const float4 av = ld4(ap + n * p.s_a + static_cast<int64_t>(hv) * K + 4 * lane);
    const float4 dv = ld4(p.dt_bias + static_cast<int64_t>(hv) * K + 4 * lane);
    asm_[m * 32 + lane] = make_float4(expf(-a_decay * softplus(av.x + dv.x)), expf(-a_decay * softplus(av.y + dv.y)),
                                      expf(-a_decay * softplus(av.z + dv.z)), expf(-a_decay * softplus(av.w + dv.w)));
    const float* gp = p.g_ring + slot * p.s_g + static_cast<int64_t>(hv) * L * K + 4 * lane;
    // records in two batches of 8, each batch's loads issued together (a loop over m would wait
    // out one load latency per record)
#pragma unroll
    for (int jb = 0; jb < 16; jb += 8) {
      float4 g[8];
#pragma unroll
      for (int t = 0; t < 8; ++t) g[t] = jb + t < m ? ld4(gp + (jb + t) * K) : make_float4(0.f, 0.f, 0.f, 0.f);
#pragma unroll
      for (int t = 0; t < 8; ++t)
        if (jb + t < m) asm_[(jb + t) * 32 + lane] = make_float4(expf(g[t].x), expf(g[t].y), expf(g[t].z), expf(g[t].w));
    }
  }
  const float beta_reg =
      lane < m ? p.beta_ring[slot * p.s_beta + hv * L + lane] : (lane == m ? beta : 0.f);
  const T* vr = static_cast<const T*>(p.v_ring) + slot * p.s_v + static_cast<int64_t>(hv) * L * V + 4 * lane;
#pragma unroll
  for (int jb = 0; jb < 16; jb += 8) {
    float4 kk[8], vv[8];
#pragma unroll
    for (int t = 0; t < 8; ++t) {
      const bool live = jb + t < m;
      kk[t] = live ? ld4(kr + (jb + t) * K) : make_float4(0.f, 0.f, 0.f, 0.f);
      vv[t] = live ? ld4(vr + (jb + t) * V) : make_float4(0.f, 0.f, 0.f, 0.f);
    }
#pragma unroll
    for (int t = 0; t < 8; ++t) {
      if (jb + t < m) {
        ksm[(jb + t) * 32 + lane] = kk[t];
        *reinterpret_cast<float4*>(vsm + (jb + t) * V + 4 * lane) = vv[t];
      }
    }
  }
  ksm[m * 32 + lane] = k;
  *reinterpret_cast<float4*>(vsm + m * V + 4 * lane) = ld4(row + 2 * H * K + hv * V + 4 * lane);
  __syncwarp();

  float* sbase = p.state + slot * p.s_state + static_cast<int64_t>(hv) * V * K + 4 * lane;
  using CT = typename std::conditional<CF == 1, __nv_bfloat16, uint8_t>::type;
  CT* cbase = static_cast<CT*>(p.copy) + slot * p.s_copy + static_cast<int64_t>(hv) * V * K + 4 * lane;
  T* outp = static_cast<T*>(p.out) + (static_cast<int64_t>(n) * HV + hv) * V;
  const int rows_per_part = V / p.parts;
#if !RC_FLUSH_TILE
  const int lr = lane >> 1;  // the row (of 16) this lane's reduce-scatters end with; slot i holds row i ^ lr
  const FlushRows<T, CF> fx{p, m, q, kq, ksm, asm_, vsm, beta_reg, alpha_reg, sbase, cbase, outp,
                            p.scales + slot * p.s_scales + static_cast<int64_t>(hv) * V, lane};
#endif
  // (staging the next 16 rows by cp.async during the replay measured slower: 8 KiB more shared
  // memory per warp, fewer resident flush warps; notes/read-copy.md)
  const int rbeg = part * rows_per_part, rend = rbeg + rows_per_part;
#if RC_FLUSH_TILE
  // the tables in place of the keys and decays (each lane its own float4 column: no barrier within)
  float4* kh_tab = smem + 16 * 32;
  float4* qt_tab = smem + 2 * 16 * 32;
  unsigned renorm = 0u;
  {
    constexpr float RENORM = 9.094947e-13f;  // 2**-40, as replay_blocks
    float4 c4 = make_float4(1.f, 1.f, 1.f, 1.f);
    float cg = 1.f;
#pragma unroll 1
    for (int j = 0; j <= m; ++j) {
      const float4 kj = ksm[j * 32 + lane];
      bool low;
      if (KDA) {
        c4 = mul4(c4, asm_[j * 32 + lane]);
        low = __any_sync(FULL, fminf(fminf(c4.x, c4.y), fminf(c4.z, c4.w)) < RENORM);
      } else {
        cg *= __shfl_sync(FULL, alpha_reg, j);
        low = cg < RENORM;
        c4 = make_float4(cg, cg, cg, cg);
      }
      if (low) {  // warp-uniform: kt_j stays k_j, kh_j is the factor
        renorm |= 1u << j;
        kh_tab[j * 32 + lane] = c4;
        c4 = make_float4(1.f, 1.f, 1.f, 1.f);
        cg = 1.f;
      } else {
        ksm[j * 32 + lane] = mul4(c4, kj);
        // c4 in [2**-40, 1]: the fast reciprocal (2 ulp) is enough for the update's scale
        kh_tab[j * 32 + lane] = make_float4(__fdividef(kj.x, c4.x), __fdividef(kj.y, c4.y), __fdividef(kj.z, c4.z),
                                            __fdividef(kj.w, c4.w));
      }
    }
    qt_tab[lane] = mul4(c4, q);
    qt_tab[32 + lane] = c4;
  }
  __syncwarp();
  const int c8 = lane & 7, rg = lane >> 3, rr = (c8 >> 1) & 3;
  const FlushTile<T, CF> ft{ksm, kh_tab, qt_tab, qt_tab + 32, vsm, beta_reg, kq, renorm, m, lane,
                            sbase + 4 * (c8 - lane), cbase + 4 * (c8 - lane), outp,
                            p.scales + slot * p.s_scales + static_cast<int64_t>(hv) * V};
  auto tile_rows = [&](float4 (&S)[16], int r0) {
#pragma unroll
    for (int i = 0; i < 4; ++i)
#pragma unroll
      for (int t = 0; t < 4; ++t) S[4 * i + t] = ld4_cs(ft.sbase + static_cast<int64_t>(r0 + 4 * rg + (i ^ rr)) * K + 32 * t);
  };
  replay_item_blocks<RC_FLUSH_TILE == 2, RC_FLUSH_PREFETCH>(rbeg, rend, tile_rows, [&](auto& S, int r0) {
    replay_tile<T, CF, static_cast<int>(sizeof(S) / sizeof(S[0]))>(ft, r0, S);
  });
#else
  // (two blocks together under RC_FLUSH_PAIR: no prefetch, whose registers they take)
  auto rows = [&](float4 (&S)[16], int r0) {
#pragma unroll
    for (int i = 0; i < 16; ++i) S[i] = ld4_cs(sbase + static_cast<int64_t>(r0 + (i ^ lr)) * K);
  };
  replay_item_blocks<RC_FLUSH_PAIR, RC_FLUSH_PREFETCH>(rbeg, rend, rows, [&](auto& S, int r0) {
    replay_blocks<T, KDA, CF, static_cast<int>(sizeof(S) / sizeof(S[0]))>(fx, r0, S);
  });
#endif
  __syncwarp();  // the next item rewrites this warp's shared memory
}


// ---- GDN flush on tensor cores: the Gram (WY) form of the exact replay, per 16-row block three
// products on mma.sync.m16n8k8 in 3xTF32 (hi*hi + hi*lo + lo*hi: fp32 accuracy). Function and
// index math: tests/support/read_copy_tc_emulator.py (module docstring; the CPU test
// tests/test_read_copy_tc_emulator.py runs the same index formulas against the sequential replay).
// With G_j the cumulative log decay of steps 0..j (step m = this token), A_j = exp(G_j):
//   X = S0 K^T, d = M (beta o (v - A o X)) with M = (I + B)^-1, B[j][i] = beta_j e^{G_j - G_i} k_i.k_j (i < j),
//   o = A_m S0 q + sum_j cq_j d_j, S_new = A_m S0 + sum_j e^{G_m - G_j} d_j k_j^T.
// Lane (g = lane >> 2, t = lane & 3) holds state rows g, g+8 of a block at columns 16p + 4t .. +3
// (p = 0..7): its A values of X's k-steps 2p, 2p+1 and its C values of the fold's n-tiles 2p, 2p+1.
namespace tc {
constexpr int XS = 144;  // key table row stride (floats): conflict-free float4 reads of rows g, g+8
constexpr int O_KN = 0, O_FBH = 16 * XS, O_FBL = O_FBH + 2048, O_QS = O_FBL + 2048, O_BL = O_QS + 128,
              O_MS = O_BL + 16 * 20, FLOATS = O_MS + 16 * 17;  // 28.5 KB per warp
static_assert(FLOATS - O_BL >= 16 * 36, "the fp8 copy's staging rows fit in the B / M tables");
static_assert(FLOATS % 4 == 0, "float4 tables");
}  // namespace tc

__device__ __forceinline__ uint32_t tf32_rna(float x) {
  uint32_t r;
  asm("cvt.rna.tf32.f32 %0, %1;\n" : "=r"(r) : "f"(x));
  return r;
}
__device__ __forceinline__ void split_tf32(float x, uint32_t& hi, uint32_t& lo) {
  hi = tf32_rna(x);
  lo = tf32_rna(x - __uint_as_float(hi));
}
__device__ __forceinline__ void mma_tf32(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  asm volatile("mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
               : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}
// c += a b in 3xTF32 from fp32 a (4 values, A fragment order) and pre-split b (hi, lo pairs)
__device__ __forceinline__ void mma3(float (&c)[4], float a0, float a1, float a2, float a3, uint32_t bh0, uint32_t bh1,
                                     uint32_t bl0, uint32_t bl1) {
  uint32_t ah[4], al[4];
  split_tf32(a0, ah[0], al[0]);
  split_tf32(a1, ah[1], al[1]);
  split_tf32(a2, ah[2], al[2]);
  split_tf32(a3, ah[3], al[3]);
  mma_tf32(c, al, bh0, bh1);
  mma_tf32(c, ah, bl0, bl1);
  mma_tf32(c, ah, bh0, bh1);
}
__device__ __forceinline__ uint32_t fbits(float x) { return __float_as_uint(x); }
// 3xTF32 with the hi*hi and the cross products in separate accumulators (two shorter chains)
__device__ __forceinline__ void mma3s(float (&hh)[4], float (&cr)[4], const uint32_t (&ah)[4], const uint32_t (&al)[4],
                                      uint32_t bh0, uint32_t bh1, uint32_t bl0, uint32_t bl1) {
  mma_tf32(cr, al, bh0, bh1);
  mma_tf32(cr, ah, bl0, bl1);
  mma_tf32(hh, ah, bh0, bh1);
}
__device__ __forceinline__ void split4(float a0, float a1, float a2, float a3, uint32_t (&h)[4], uint32_t (&l)[4]) {
  split_tf32(a0, h[0], l[0]);
  split_tf32(a1, h[1], l[1]);
  split_tf32(a2, h[2], l[2]);
  split_tf32(a3, h[3], l[3]);
}

template <typename T, int CF>
__device__ __forceinline__ void flush_item_tc(const Args& p, int item, float* sm, int lane) {
  const int HV = p.HV, H = p.H, L = p.L;
  const int pair = item / p.parts, part = item - pair * p.parts;
  const int n = pair / HV, hv = pair - n * HV, i_h = hv / (HV / H);
  const int64_t slot = slot_of(p.slots, p.idx64, n);
  const int m = p.write_pos[n];  // records 0..m-1 live (m <= L - 1); this token is step m
  const int g = lane >> 2, t = lane & 3;
  float* KN = sm + tc::O_KN;  // keys of steps 0..15 (fp32, zero past m)
  float4* FBH = reinterpret_cast<float4*>(sm + tc::O_FBH);
  float4* FBL = reinterpret_cast<float4*>(sm + tc::O_FBL);
  float* QS = sm + tc::O_QS;
  float* BLs = sm + tc::O_BL;
  float* MS = sm + tc::O_MS;
  const T* row = static_cast<const T*>(p.qkv) + n * p.s_qkv;

  // this token: normalised q (scaled), k, beta, log decay (as flush_item)
  float4 q = ld4(row + i_h * K + 4 * lane);
  float4 k = ld4(row + H * K + i_h * K + 4 * lane);
  float q_fac = p.scale, k_fac = 1.f;
  if (p.l2n) {
    q_fac = p.scale / sqrtf(warp_sum(dot4(q, q)) + 1e-6f);
    k_fac = 1.f / sqrtf(warp_sum(dot4(k, k)) + 1e-6f);
  }
  q = mul4(q, q_fac);
  k = mul4(k, k_fac);
  const float a_decay = expf(p.A_log[hv]);
  const T* bp = static_cast<const T*>(p.b);
  const float beta = to_f(from_f<T>(1.f / (1.f + expf(-to_f(bp[n * p.s_b + hv])))));
  const T* ap = static_cast<const T*>(p.a);
  const float g_cur = -a_decay * softplus(to_f(ap[n * p.s_a + hv]) + p.dt_bias[hv]);
  // lane j < 16: step j's log decay and beta (zero past m: the rings hold garbage there)
  const float gl = lane < m ? p.g_ring[slot * p.s_g + hv * L + lane] : (lane == m ? g_cur : 0.f);
  const float bl = lane < m ? p.beta_ring[slot * p.s_beta + hv * L + lane] : (lane == m ? beta : 0.f);
  float gc = gl;  // inclusive scan over lanes 0..15 (dead steps add 0)
#pragma unroll
  for (int d = 1; d < 16; d <<= 1) {
    const float up = __shfl_up_sync(FULL, gc, d);
    if (lane >= d) gc += up;
  }
  const float Gm = __shfl_sync(FULL, gc, m);
  const float Am = expf(Gm);

  // key table (hi, lo; rows j = 0..15, zero past m), value table, q; k_j . q partials
  const float* kr = p.k_ring + slot * p.s_k + static_cast<int64_t>(i_h) * L * K + 4 * lane;
  const float4 zero = make_float4(0.f, 0.f, 0.f, 0.f);
  float kqp[16];
#pragma unroll
  for (int jb = 0; jb < 16; jb += 8) {
    float4 kk[8];
#pragma unroll
    for (int u = 0; u < 8; ++u) {
      const int j = jb + u;
      kk[u] = j < m ? ld4(kr + j * K) : (j == m ? k : zero);
    }
#pragma unroll
    for (int u = 0; u < 8; ++u) {
      const int j = jb + u;
      kqp[j] = dot4(kk[u], q);
      *reinterpret_cast<float4*>(KN + j * tc::XS + 4 * lane) = kk[u];
    }
  }
  *reinterpret_cast<float4*>(QS + 4 * lane) = q;
  const float kq_red = reduce_scatter16(kqp, lane);          // lane l: k_{l >> 1} . q
  const float kq_lane = __shfl_sync(FULL, kq_red, 2 * (lane & 15));  // lane j < 16: k_j . q
  __syncwarp();

  // the fold's B fragments, pre-arranged per lane (hi, lo): for (ks, p) the keys of steps 8ks + 2t,
  // +1 at columns 16p + 4(g >> 1) + (g & 1) + {0, 2} (the fold's column order, emulator fold_col)
#pragma unroll
  for (int ks = 0; ks < 2; ++ks) {
    const int j0 = 8 * ks + 2 * t;
#pragma unroll
    for (int pp = 0; pp < 8; ++pp) {
      const int c0 = 16 * pp + 4 * (g >> 1) + (g & 1);
      uint32_t h[4], l[4];
      split4(KN[j0 * tc::XS + c0], KN[(j0 + 1) * tc::XS + c0], KN[j0 * tc::XS + c0 + 2], KN[(j0 + 1) * tc::XS + c0 + 2],
             h, l);
      FBH[(ks * 8 + pp) * 32 + lane] =
          make_float4(__uint_as_float(h[0]), __uint_as_float(h[1]), __uint_as_float(h[2]), __uint_as_float(h[3]));
      FBL[(ks * 8 + pp) * 32 + lane] =
          make_float4(__uint_as_float(l[0]), __uint_as_float(l[1]), __uint_as_float(l[2]), __uint_as_float(l[3]));
    }
  }
  // Gram k_i . k_j on tensor cores: A (rows i = g, g+8) and B (keys j = g, 8+g) from the same float4s
  const float4* KN4 = reinterpret_cast<const float4*>(KN);
  float gram[2][4] = {{0.f, 0.f, 0.f, 0.f}, {0.f, 0.f, 0.f, 0.f}};
  {
    float gx[2][4] = {{0.f, 0.f, 0.f, 0.f}, {0.f, 0.f, 0.f, 0.f}};  // cross products
#pragma unroll
    for (int pp = 0; pp < 8; ++pp) {
      const float4 k0 = KN4[g * (tc::XS / 4) + 4 * pp + t], k1 = KN4[(g + 8) * (tc::XS / 4) + 4 * pp + t];
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        uint32_t ah[4], al[4];
        split4(e ? k0.z : k0.x, e ? k1.z : k1.x, e ? k0.w : k0.y, e ? k1.w : k1.y, ah, al);
        mma3s(gram[0], gx[0], ah, al, ah[0], ah[2], al[0], al[2]);  // B of tile 0: key row g
        mma3s(gram[1], gx[1], ah, al, ah[1], ah[3], al[1], al[3]);  // B of tile 1: key row 8 + g
      }
    }
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      gram[0][i] += gx[0][i];
      gram[1][i] += gx[1][i];
    }
  }
  // B[j][i] = beta_j e^{G_j - G_i} gram[i][j] for i < j, from the C fragments (every (i, j) once)
  const float gci0 = __shfl_sync(FULL, gc, g), gci1 = __shfl_sync(FULL, gc, g + 8);
#pragma unroll
  for (int nt = 0; nt < 2; ++nt) {
#pragma unroll
    for (int bit = 0; bit < 2; ++bit) {
      const int j = 8 * nt + 2 * t + bit;
      const float gcj = __shfl_sync(FULL, gc, j), bj = __shfl_sync(FULL, bl, j);
      BLs[j * 20 + g] = g < j ? bj * expf(gcj - gci0) * gram[nt][bit] : 0.f;
      BLs[j * 20 + g + 8] = g + 8 < j ? bj * expf(gcj - gci1) * gram[nt][2 + bit] : 0.f;
    }
  }
  __syncwarp();
  // M = (I + B)^-1 by forward substitution, column `lane` (lanes 16..31 compute zeros)
  {
    float mc[16];
#pragma unroll
    for (int i = 0; i < 16; ++i) {
      float acc = i == lane ? 1.f : 0.f;
#pragma unroll
      for (int kk = 0; kk < i; ++kk) acc = fmaf(-BLs[i * 20 + kk], mc[kk], acc);
      mc[i] = acc;
    }
    if (lane < 16) {
#pragma unroll
      for (int i = 0; i < 16; ++i) MS[i * 17 + lane] = mc[i];
    }
  }
  __syncwarp();
  // the solve's B fragments: M[8nt + g][8ks + 2t (+1)] for (nt, ks) = (0, 0), (1, 0), (1, 1)
  uint32_t mbh[3][2], mbl[3][2];
#pragma unroll
  for (int f = 0; f < 3; ++f) {
    const int nt = f == 0 ? 0 : 1, ks = f == 2 ? 1 : 0;
    split_tf32(MS[(8 * nt + g) * 17 + 8 * ks + 2 * t], mbh[f][0], mbl[f][0]);
    split_tf32(MS[(8 * nt + g) * 17 + 8 * ks + 2 * t + 1], mbh[f][1], mbl[f][1]);
  }
  // this lane's four steps j = 2t, 2t+1, 8+2t, 9+2t (C fragment columns of tiles 0, 0, 1, 1)
  float Aj[4], bj[4], rm[4], cq[4];
  int jj[4];
#pragma unroll
  for (int c = 0; c < 4; ++c) {
    const int j = 8 * (c >> 1) + 2 * t + (c & 1);
    jj[c] = j;
    const float gcj = __shfl_sync(FULL, gc, j);
    bj[c] = __shfl_sync(FULL, bl, j);
    const float kqj = __shfl_sync(FULL, kq_lane, j);
    Aj[c] = expf(gcj);
    rm[c] = expf(Gm - gcj);
    cq[c] = j < m ? rm[c] * kqj : (j == m ? kqj : 0.f);
  }

  // the v of this lane's four steps at the block's rows: the ring (steps < m), this token (m), none
  const T* vring = static_cast<const T*>(p.v_ring) + slot * p.s_v + static_cast<int64_t>(hv) * L * V;
  const T* vsrc[4];
#pragma unroll
  for (int c = 0; c < 4; ++c)
    vsrc[c] = jj[c] < m ? vring + jj[c] * V : (jj[c] == m ? row + 2 * H * K + hv * V : nullptr);
  float* sbase = p.state + slot * p.s_state + static_cast<int64_t>(hv) * V * K;
  using CT = typename std::conditional<CF == 1, __nv_bfloat16, uint8_t>::type;
  CT* cbase = static_cast<CT*>(p.copy) + slot * p.s_copy + static_cast<int64_t>(hv) * V * K;
  T* outp = static_cast<T*>(p.out) + (static_cast<int64_t>(n) * HV + hv) * V;
  const float4* QS4 = reinterpret_cast<const float4*>(QS);
  const int rows_per_part = V / p.parts;
  const int rbeg = part * rows_per_part, rend = rbeg + rows_per_part;
  // a block's state rows g, g + 8 (this lane's columns) and its v of the lane's four steps
  auto load_block = [&](int r0, float4 (&A0)[8], float4 (&A1)[8], float (&w0)[4], float (&w1)[4]) {
    const float* a0 = sbase + static_cast<int64_t>(r0 + g) * K + 4 * t;
#pragma unroll
    for (int pp = 0; pp < 8; ++pp) {
      A0[pp] = ld4_cs(a0 + 16 * pp);
      A1[pp] = ld4_cs(a0 + 8 * K + 16 * pp);
    }
#pragma unroll
    for (int c = 0; c < 4; ++c) {
      w0[c] = vsrc[c] != nullptr ? to_f(vsrc[c][r0 + g]) : 0.f;
      w1[c] = vsrc[c] != nullptr ? to_f(vsrc[c][r0 + g + 8]) : 0.f;
    }
  };
#if RC_FLUSH_PREFETCH
  float4 N0[8], N1[8];  // the next block, requested before this block computes
  float nv0[4], nv1[4];
  load_block(rbeg, N0, N1, nv0, nv1);
#endif
#pragma unroll 1
  for (int r0 = rbeg; r0 < rend; r0 += 16) {
    float* s0 = sbase + static_cast<int64_t>(r0 + g) * K + 4 * t;
    float* s1 = s0 + 8 * K;
    float4 F0[8], F1[8];
    float vv0[4], vv1[4];  // this block's v of the lane's four steps, rows g and g + 8
#if RC_FLUSH_PREFETCH
#pragma unroll
    for (int pp = 0; pp < 8; ++pp) {
      F0[pp] = N0[pp];
      F1[pp] = N1[pp];
    }
#pragma unroll
    for (int c = 0; c < 4; ++c) {
      vv0[c] = nv0[c];
      vv1[c] = nv1[c];
    }
    if (r0 + 16 < rend) load_block(r0 + 16, N0, N1, nv0, nv1);
#else
    load_block(r0, F0, F1, vv0, vv1);
#endif
    // X = S0 K^T (tiles: steps 0..7, 8..15; accumulators by k-step parity and hi*hi / cross) and x_q
    float Xa[2][2][4], Xc[2][2][4];
#pragma unroll
    for (int a = 0; a < 2; ++a)
#pragma unroll
      for (int nt = 0; nt < 2; ++nt)
#pragma unroll
        for (int i = 0; i < 4; ++i) Xa[a][nt][i] = Xc[a][nt][i] = 0.f;
    float xq0 = 0.f, xq1 = 0.f;
#pragma unroll
    for (int pp = 0; pp < 8; ++pp) {
      const float4 k0 = KN4[g * (tc::XS / 4) + 4 * pp + t], k1 = KN4[(g + 8) * (tc::XS / 4) + 4 * pp + t];
      const float4 qq = QS4[4 * pp + t];
      xq0 += dot4(F0[pp], qq);
      xq1 += dot4(F1[pp], qq);
      uint32_t b0h[4], b0l[4], b1h[4], b1l[4];  // keys g and 8 + g at this lane's 4 columns
      split4(k0.x, k0.y, k0.z, k0.w, b0h, b0l);
      split4(k1.x, k1.y, k1.z, k1.w, b1h, b1l);
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        uint32_t ah[4], al[4];
        split4(e ? F0[pp].z : F0[pp].x, e ? F1[pp].z : F1[pp].x, e ? F0[pp].w : F0[pp].y, e ? F1[pp].w : F1[pp].y, ah, al);
        mma3s(Xa[e][0], Xc[e][0], ah, al, b0h[2 * e], b0h[2 * e + 1], b0l[2 * e], b0l[2 * e + 1]);
        mma3s(Xa[e][1], Xc[e][1], ah, al, b1h[2 * e], b1h[2 * e + 1], b1l[2 * e], b1l[2 * e + 1]);
      }
    }
    float X[2][4];
#pragma unroll
    for (int nt = 0; nt < 2; ++nt)
#pragma unroll
      for (int i = 0; i < 4; ++i) X[nt][i] = (Xc[0][nt][i] + Xc[1][nt][i]) + (Xa[0][nt][i] + Xa[1][nt][i]);
    // U = beta (v - A o X), C layout; d = U M^T
    float U[2][4];
#pragma unroll
    for (int c = 0; c < 4; ++c) {
      const int nt = c >> 1, bit = c & 1;
      U[nt][bit] = bj[c] * (vv0[c] - Aj[c] * X[nt][bit]);
      U[nt][2 + bit] = bj[c] * (vv1[c] - Aj[c] * X[nt][2 + bit]);
    }
    float D[2][4] = {{0.f, 0.f, 0.f, 0.f}, {0.f, 0.f, 0.f, 0.f}};
    mma3(D[0], U[0][0], U[0][2], U[0][1], U[0][3], mbh[0][0], mbh[0][1], mbl[0][0], mbl[0][1]);
    mma3(D[1], U[0][0], U[0][2], U[0][1], U[0][3], mbh[1][0], mbh[1][1], mbl[1][0], mbl[1][1]);
    mma3(D[1], U[1][0], U[1][2], U[1][1], U[1][3], mbh[2][0], mbh[2][1], mbl[2][0], mbl[2][1]);
    // this token's output, rows g and g + 8 (the quad's four lanes hold a row's 128 columns)
    float o0 = Am * xq0, o1 = Am * xq1;
#pragma unroll
    for (int c = 0; c < 4; ++c) {
      o0 = fmaf(cq[c], D[c >> 1][c & 1], o0);
      o1 = fmaf(cq[c], D[c >> 1][2 + (c & 1)], o1);
    }
    o0 += __shfl_xor_sync(FULL, o0, 1);
    o1 += __shfl_xor_sync(FULL, o1, 1);
    o0 += __shfl_xor_sync(FULL, o0, 2);
    o1 += __shfl_xor_sync(FULL, o1, 2);
    if (t == 0) {
      outp[r0 + g] = from_f<T>(o0);
      outp[r0 + g + 8] = from_f<T>(o1);
    }
    // fold: S_new = A_m S0 + d' K, d' = d e^{G_m - G_j}; new rows overwrite F0 / F1
    float Dp[2][4];
#pragma unroll
    for (int c = 0; c < 4; ++c) {
      Dp[c >> 1][c & 1] = D[c >> 1][c & 1] * rm[c];
      Dp[c >> 1][2 + (c & 1)] = D[c >> 1][2 + (c & 1)] * rm[c];
    }
#pragma unroll
    for (int pp = 0; pp < 8; ++pp) {
      const float4 bh0 = FBH[pp * 32 + lane], bl0 = FBL[pp * 32 + lane];
      const float4 bh1 = FBH[(8 + pp) * 32 + lane], bl1 = FBL[(8 + pp) * 32 + lane];
      float C0[4] = {Am * F0[pp].x, Am * F0[pp].y, Am * F1[pp].x, Am * F1[pp].y};  // n-tile 2pp
      float C1[4] = {Am * F0[pp].z, Am * F0[pp].w, Am * F1[pp].z, Am * F1[pp].w};  // n-tile 2pp + 1
      mma3(C0, Dp[0][0], Dp[0][2], Dp[0][1], Dp[0][3], fbits(bh0.x), fbits(bh0.y), fbits(bl0.x), fbits(bl0.y));
      mma3(C0, Dp[1][0], Dp[1][2], Dp[1][1], Dp[1][3], fbits(bh1.x), fbits(bh1.y), fbits(bl1.x), fbits(bl1.y));
      mma3(C1, Dp[0][0], Dp[0][2], Dp[0][1], Dp[0][3], fbits(bh0.z), fbits(bh0.w), fbits(bl0.z), fbits(bl0.w));
      mma3(C1, Dp[1][0], Dp[1][2], Dp[1][1], Dp[1][3], fbits(bh1.z), fbits(bh1.w), fbits(bl1.z), fbits(bl1.w));
      F0[pp] = make_float4(C0[0], C0[1], C1[0], C1[1]);
      F1[pp] = make_float4(C0[2], C0[3], C1[2], C1[3]);
      __stcs(reinterpret_cast<float4*>(s0 + 16 * pp), F0[pp]);
      __stcs(reinterpret_cast<float4*>(s1 + 16 * pp), F1[pp]);
    }
    CT* c0p = cbase + static_cast<int64_t>(r0 + g) * K + 4 * t;
    CT* c1p = c0p + 8 * K;
    if constexpr (CF == 1) {
#pragma unroll
      for (int pp = 0; pp < 8; ++pp) {
        *reinterpret_cast<uint2*>(c0p + 16 * pp) = pack_bf16(F0[pp]);
        *reinterpret_cast<uint2*>(c1p + 16 * pp) = pack_bf16(F1[pp]);
      }
    } else {
      float am0 = 0.f, am1 = 0.f;
#pragma unroll
      for (int pp = 0; pp < 8; ++pp) {
        am0 = fmaxf(am0, fmaxf(fmaxf(fabsf(F0[pp].x), fabsf(F0[pp].y)), fmaxf(fabsf(F0[pp].z), fabsf(F0[pp].w))));
        am1 = fmaxf(am1, fmaxf(fmaxf(fabsf(F1[pp].x), fabsf(F1[pp].y)), fmaxf(fabsf(F1[pp].z), fabsf(F1[pp].w))));
      }
      am0 = fmaxf(am0, __shfl_xor_sync(FULL, am0, 1));
      am1 = fmaxf(am1, __shfl_xor_sync(FULL, am1, 1));
      am0 = fmaxf(am0, __shfl_xor_sync(FULL, am0, 2));
      am1 = fmaxf(am1, __shfl_xor_sync(FULL, am1, 2));
      const float sc0 = am0 > 0.f ? am0 / 448.f : 1.f, sc1 = am1 > 0.f ? am1 / 448.f : 1.f;
      const float in0 = am0 > 0.f ? 448.f / am0 : 1.f, in1 = am1 > 0.f ? 448.f / am1 : 1.f;
      if (t == 0) {
        p.scales[slot * p.s_scales + static_cast<int64_t>(hv) * V + r0 + g] = sc0;
        p.scales[slot * p.s_scales + static_cast<int64_t>(hv) * V + r0 + g + 8] = sc1;
      }
      auto q8 = [](float4 x, float s, float inv) {
        return pack_e4m3(make_float4(fp8_units(x.x, s, inv), fp8_units(x.y, s, inv), fp8_units(x.z, s, inv),
                                     fp8_units(x.w, s, inv)));
      };
      // rows staged in shared memory (B / M tables: dead after the setup; 16 rows x 36 words) so that
      // the copy leaves as full 128-byte rows, 16 bytes per lane (4 bytes per lane here would write
      // half sectors: 8 rows x 16 bytes per store)
      uint32_t* stg = reinterpret_cast<uint32_t*>(sm + tc::O_BL);
#pragma unroll
      for (int pp = 0; pp < 8; ++pp) {
        stg[g * 36 + 4 * pp + t] = q8(F0[pp], sc0, in0);
        stg[(g + 8) * 36 + 4 * pp + t] = q8(F1[pp], sc1, in1);
      }
      __syncwarp();
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const int c = 32 * i + lane, r = c >> 3, ch = c & 7;  // row r of the block, 16-byte chunk ch
        *reinterpret_cast<uint4*>(cbase + static_cast<int64_t>(r0 + r) * K + 16 * ch) =
            *reinterpret_cast<const uint4*>(stg + r * 36 + 4 * ch);
      }
      __syncwarp();
      (void)c0p;
      (void)c1p;
    }
  }
  __syncwarp();  // the next item rewrites this warp's shared memory
}

__host__ __device__ constexpr int flush_smem_f4(bool kda) {
  return (!kda && RC_TC_FLUSH) ? tc::FLOATS / 4 : flush_smem_f4_seq(kda);
}

constexpr int ROW_WINDOW = 512;  // rows whose flush items one round of the flush pass lists

// One warp lists the flush rows of [w0, wend) into rows[] (B / 32 ballots); returns their count to
// every lane.
__device__ __forceinline__ int list_flush_rows(const Args& p, int w0, int wend, int* rows) {
  const int lane = threadIdx.x & 31;
  int count = 0;
  for (int r0 = w0; r0 < wend; r0 += 32) {
    const int n = r0 + lane;
    const bool fl = n < wend && slot_of(p.slots, p.idx64, n) >= 0 && flush_of(p.write_pos, p.force_flush, n, p.L);
    const unsigned mask = __ballot_sync(FULL, fl);
    if (fl) rows[count + __popc(mask & ((1u << lane) - 1u))] = n;
    count += __popc(mask);
  }
  return count;
}

// Every warp lists the flush rows of a window of ROW_WINDOW rows in its shared memory (B / 32
// ballots), then takes items it = warp, warp + warps, ... of that list's (row, head, part) items,
// so every warp gets the same number of flush items to within one (a stride over all items put
// all of a row's items, or every row of one stagger residue, on a few warps).
template <typename T, bool KDA, int CF>
#if RC_FLUSH_MIN_BLOCKS > 0
#define RC_FLUSH_BOUNDS __launch_bounds__(32, RC_FLUSH_MIN_BLOCKS)
#else
#define RC_FLUSH_BOUNDS __launch_bounds__(32)
#endif
__global__ void RC_FLUSH_BOUNDS flush_kernel(const Args p) {
  extern __shared__ float4 rc_smem[];
  __shared__ int rows[ROW_WINDOW];
  const int lane = threadIdx.x;
  const int tw = gridDim.x, per_row = p.HV * p.parts;
  for (int w0 = 0; w0 < p.B; w0 += ROW_WINDOW) {
    const int count = list_flush_rows(p, w0, min(p.B, w0 + ROW_WINDOW), rows);
    __syncwarp();
    for (int it = blockIdx.x; it < count * per_row; it += tw) {
      const int r = it / per_row, rest = it - r * per_row;
      if constexpr (!KDA && RC_TC_FLUSH)
        flush_item_tc<T, CF>(p, rows[r] * per_row + rest, reinterpret_cast<float*>(rc_smem), lane);
      else
        flush_item<T, KDA, CF>(p, rows[r] * per_row + rest, rc_smem, lane);
    }
    __syncwarp();  // the next window rewrites the row list
  }
}

// ---- flush pass, row layout (RC_FLUSH_ROWS, RC_FLUSH_PIPE): one item (row, value head) per block.
// Setup: 128 threads are the key columns; column c writes the window's per-column tables, the
// decay deferred per column (state = St . diag(C_j), C_j the running product of the decays since
// column c last renormalised): kt_j = C_j o k_j (the row sums' key), kh_j = k_j / C_j (the update's
// key), rn_j = the factor column c is renormalised by at step j (1 where it is not; a column
// renormalises when C_j < 2**-40), this token's qt = C_m o q, and C_m; and 128 threads (the same
// ones under RC_FLUSH_PIPE) are the state rows and write v_j of their row and beta. Replay: 256
// threads, 2r and 2r+1 owning state row r (thread 2r+h the float4 chunks 2i+h, so a pair's loads
// and stores cover whole 32-byte sectors), 64 fp32 in registers; a step is a half-row sum, one
// shuffle, and an update, on keys read by broadcast from shared memory.
// RC_FLUSH_ROWS N: 256-thread blocks (N per SM) that set up, then replay, each item.
// RC_FLUSH_PIPE: 384-thread blocks, one per SM: 4 setup warps build item i+1's tables and copy its
// state rows into shared memory (cp.async) while 8 replay warps run item i (two buffers of each).
#ifndef RC_FLUSH_PIPE
#define RC_FLUSH_PIPE 0
#endif
namespace fr {
constexpr int NREP = 256;      // replay threads: 2 per state row
constexpr int NSET = 128;      // setup threads: 1 per key column (and per state row)
constexpr int NCHUNK = K / 8;  // float4 chunks per replay thread (half a row)
struct Tables {
  float4 kt[16][K / 4];
  float4 kh[16][K / 4];
  float4 rn[16][K / 4];
  float4 qt[K / 4];
  float4 cend[K / 4];
  float v[16][V];  // v_j of every row
  float beta[16];
  unsigned renorm[4];  // per setup warp, bit j: some column of the warp renormalises at step j
  int64_t slot;
  float kq;
  int m;
};
struct Smem {  // RC_FLUSH_ROWS
  Tables tb;
  int count;
  int rows[ROW_WINDOW];
};
struct PipeSmem {  // RC_FLUSH_PIPE
  Tables tb[2];
  float4 st[2][V][K / 4];  // the items' state rows, chunk c of row r at c ^ swz(r)
  int count;
  int rows[ROW_WINDOW];
};
__device__ __forceinline__ int swz(int r) { return (r & 3) << 1; }  // 4 wavefronts for the replay's reads
__device__ __forceinline__ void fma4acc(float4& acc, float4 a, float4 b) {
  acc.x = fmaf(a.x, b.x, acc.x);
  acc.y = fmaf(a.y, b.y, acc.y);
  acc.z = fmaf(a.z, b.z, acc.z);
  acc.w = fmaf(a.w, b.w, acc.w);
}
// sum over this thread's half row of S[c] x[c] (x: a table row, chunk 2i+h), 8 independent chains
__device__ __forceinline__ float half_dot(const float4 (&S)[NCHUNK], const float4* x, int h) {
  float4 a0 = make_float4(0.f, 0.f, 0.f, 0.f), a1 = a0;
#pragma unroll
  for (int i = 0; i < NCHUNK; i += 2) {
    fma4acc(a0, S[i], x[2 * i + h]);
    fma4acc(a1, S[i + 1], x[2 * i + 2 + h]);
  }
  return ((a0.x + a1.x) + (a0.y + a1.y)) + ((a0.z + a1.z) + (a0.w + a1.w));
}
// an item's row n, value head, key head
struct Item {
  int n, hv, i_h;
};
__device__ __forceinline__ Item item_of(const Args& p, int pair) {
  const int n = pair / p.HV, hv = pair - n * p.HV;
  return {n, hv, hv / (p.HV / p.H)};
}
// this token's (q_fac, k_fac, k . q): every warp for itself (no barrier)
template <typename T>
__device__ __forceinline__ float3 token_norms(const Args& p, const T* qkv, int i_h, int lane) {
  const float4 q4 = ld4(qkv + i_h * K + 4 * lane), k4 = ld4(qkv + p.H * K + i_h * K + 4 * lane);
  const float qq = warp_sum(dot4(q4, q4)), kk = warp_sum(dot4(k4, k4)), qk = warp_sum(dot4(q4, k4));
  float q_fac = p.scale, k_fac = 1.f;
  if (p.l2n) {
    q_fac = p.scale / sqrtf(qq + 1e-6f);
    k_fac = 1.f / sqrtf(kk + 1e-6f);
  }
  return make_float3(q_fac, k_fac, qk * q_fac * k_fac);
}

// key column c's tables (a whole warp of columns calls it: the renormalisation mask is a warp OR)
template <typename T, bool KDA>
__device__ __forceinline__ void fill_column(const Args& p, Item it, int64_t slot, int m, int c, const T* qkv,
                                            float q_fac, float k_fac, Tables& tb) {
  constexpr float RENORM = 9.094947e-13f;  // 2**-40
  const int L = p.L;
  const float* kr = p.k_ring + slot * p.s_k + static_cast<int64_t>(it.i_h) * L * K + c;
  const float* gr = p.g_ring + slot * p.s_g + (KDA ? static_cast<int64_t>(it.hv) * L * K + c : it.hv * L);
  float kk[16], gg[16];
#pragma unroll
  for (int j = 0; j < 16; ++j) {  // every load issued before the first use
    kk[j] = j < m ? kr[j * K] : 0.f;
    gg[j] = j < m ? gr[KDA ? j * K : j] : 0.f;
  }
  const T* ap = static_cast<const T*>(p.a);
  const float x_m = KDA ? to_f(ap[it.n * p.s_a + static_cast<int64_t>(it.hv) * K + c]) + p.dt_bias[it.hv * K + c]
                        : to_f(ap[it.n * p.s_a + it.hv]) + p.dt_bias[it.hv];
  const float q = to_f(qkv[it.i_h * K + c]) * q_fac, k = to_f(qkv[p.H * K + it.i_h * K + c]) * k_fac;
  const float a_m = expf(-expf(p.A_log[it.hv]) * softplus(x_m));  // this token's decay of column c
  float* kt = reinterpret_cast<float*>(tb.kt);
  float* kh = reinterpret_cast<float*>(tb.kh);
  float* rn = reinterpret_cast<float*>(tb.rn);
  float C = 1.f;
  unsigned mask = 0u;
#pragma unroll
  for (int j = 0; j < 16; ++j) {
    if (j <= m) {
      const float kj = j < m ? kk[j] : k;
      C *= j < m ? expf(gg[j]) : a_m;
      float r = 1.f;
      if (C < RENORM) {
        r = C;
        C = 1.f;
        mask |= 1u << j;
      }
      rn[j * K + c] = r;
      kt[j * K + c] = C * kj;
      kh[j * K + c] = __fdividef(kj, C);  // C in [2**-40, 1]: the fast reciprocal (2 ulp) is enough
    }
  }
  reinterpret_cast<float*>(tb.qt)[c] = C * q;
  reinterpret_cast<float*>(tb.cend)[c] = C;
  mask = __reduce_or_sync(FULL, mask);
  if ((c & 31) == 0) tb.renorm[c >> 5] = mask;
}

// state row r's v_j and (r < 16) beta_r
template <typename T>
__device__ __forceinline__ void fill_row(const Args& p, Item it, int64_t slot, int m, int r, const T* qkv, Tables& tb) {
  const int L = p.L;
  const T* vr = static_cast<const T*>(p.v_ring) + slot * p.s_v + static_cast<int64_t>(it.hv) * L * V + r;
  float vv[16];
#pragma unroll
  for (int j = 0; j < 16; ++j) vv[j] = j < m ? to_f(vr[j * V]) : 0.f;
  const float v_m = to_f(qkv[2 * p.H * K + it.hv * V + r]);
  if (r <= m) {
    const T* bp = static_cast<const T*>(p.b);
    tb.beta[r] = r < m ? p.beta_ring[slot * p.s_beta + it.hv * L + r]
                       : to_f(from_f<T>(1.f / (1.f + expf(-to_f(bp[it.n * p.s_b + it.hv])))));
  }
#pragma unroll
  for (int j = 0; j < 16; ++j)
    if (j <= m) tb.v[j][r] = j < m ? vv[j] : v_m;
}

// steps 0..m-1 the records, step m this token (and its output), then the checkpoint row and its copy
template <typename T, int CF>
__device__ __forceinline__ void replay_row(const Args& p, const Tables& tb, float4 (&S)[NCHUNK], Item it,
                                           int64_t slot, int m, float kq, int row, int h) {
  const unsigned renorm = tb.renorm[0] | tb.renorm[1] | tb.renorm[2] | tb.renorm[3];
#pragma unroll 1
  for (int j = 0; j <= m; ++j) {
    if ((renorm >> j) & 1u) {  // block-uniform
#pragma unroll
      for (int i = 0; i < NCHUNK; ++i) S[i] = mul4(S[i], tb.rn[j][2 * i + h]);
    }
    float d = half_dot(S, tb.kt[j], h);
    d += __shfl_xor_sync(FULL, d, 1);
    const float dj = tb.beta[j] * (tb.v[j][row] - d);
    if (j == m) {  // block-uniform: this token's output from the decayed state
      float oq = half_dot(S, tb.qt, h);
      oq += __shfl_xor_sync(FULL, oq, 1);
      if (h == 0) static_cast<T*>(p.out)[(static_cast<int64_t>(it.n) * p.HV + it.hv) * V + row] = from_f<T>(fmaf(dj, kq, oq));
    }
#pragma unroll
    for (int i = 0; i < NCHUNK; ++i) S[i] = fma4(dj, tb.kh[j][2 * i + h], S[i]);
  }
  float* srow = p.state + slot * p.s_state + (static_cast<int64_t>(it.hv) * V + row) * K;
#pragma unroll
  for (int i = 0; i < NCHUNK; ++i) {
    S[i] = mul4(S[i], tb.cend[2 * i + h]);
    __stcs(reinterpret_cast<float4*>(srow + 4 * (2 * i + h)), S[i]);
  }
  using CT = typename std::conditional<CF == 1, __nv_bfloat16, uint8_t>::type;
  CT* crow = static_cast<CT*>(p.copy) + slot * p.s_copy + (static_cast<int64_t>(it.hv) * V + row) * K;
  if constexpr (CF == 1) {
#pragma unroll
    for (int i = 0; i < NCHUNK; ++i) *reinterpret_cast<uint2*>(crow + 4 * (2 * i + h)) = pack_bf16(S[i]);
  } else {
    float amax = 0.f;
#pragma unroll
    for (int i = 0; i < NCHUNK; ++i)
      amax = fmaxf(amax, fmaxf(fmaxf(fabsf(S[i].x), fabsf(S[i].y)), fmaxf(fabsf(S[i].z), fabsf(S[i].w))));
    amax = fmaxf(amax, __shfl_xor_sync(FULL, amax, 1));
    const float scl = amax > 0.f ? amax / 448.f : 1.f, inv = amax > 0.f ? 448.f / amax : 1.f;
    if (h == 0) p.scales[slot * p.s_scales + static_cast<int64_t>(it.hv) * V + row] = scl;
#pragma unroll
    for (int i = 0; i < NCHUNK; ++i)
      *reinterpret_cast<uint32_t*>(crow + 4 * (2 * i + h)) =
          pack_e4m3(make_float4(fp8_units(S[i].x, scl, inv), fp8_units(S[i].y, scl, inv),
                                fp8_units(S[i].z, scl, inv), fp8_units(S[i].w, scl, inv)));
  }
}

}  // namespace fr

// RC_FLUSH_ROWS: 256 threads set up (threads < 128 the columns, the others the rows), then replay
template <typename T, bool KDA, int CF>
__device__ __forceinline__ void flush_rows_item(const Args& p, int pair, fr::Smem& sm) {
  const int t = threadIdx.x, row = t >> 1, h = t & 1;
  const fr::Item it = fr::item_of(p, pair);
  const int64_t slot = slot_of(p.slots, p.idx64, it.n);
  const int m = p.write_pos[it.n];  // records 0..m-1 live (m <= L - 1); this token is step m
  // this thread's half of its state row, requested first: its latency under the setup
  const float* srow = p.state + slot * p.s_state + (static_cast<int64_t>(it.hv) * V + row) * K;
  float4 S[fr::NCHUNK];
#pragma unroll
  for (int i = 0; i < fr::NCHUNK; ++i) S[i] = ld4_cs(srow + 4 * (2 * i + h));
  const T* qkv = static_cast<const T*>(p.qkv) + it.n * p.s_qkv;
  const float3 nf = fr::token_norms(p, qkv, it.i_h, t & 31);
  if (t < K)
    fr::fill_column<T, KDA>(p, it, slot, m, t, qkv, nf.x, nf.y, sm.tb);
  else
    fr::fill_row(p, it, slot, m, t - K, qkv, sm.tb);
  __syncthreads();
  fr::replay_row<T, CF>(p, sm.tb, S, it, slot, m, nf.z, row, h);
  __syncthreads();  // the next item rewrites the tables
}

// The row layout's pass: grid capped at the resident blocks; warp 0 lists a window's flush rows,
// then the block takes items (row, head) it = block, block + blocks, ...
template <typename T, bool KDA, int CF>
__global__ void __launch_bounds__(fr::NREP, RC_FLUSH_ROWS > 0 ? RC_FLUSH_ROWS : 1) flush_rows_kernel(const Args p) {
  __shared__ fr::Smem sm;
  for (int w0 = 0; w0 < p.B; w0 += ROW_WINDOW) {
    if (threadIdx.x < 32) {
      const int count = list_flush_rows(p, w0, min(p.B, w0 + ROW_WINDOW), sm.rows);
      if (threadIdx.x == 0) sm.count = count;
    }
    __syncthreads();
    const int items = sm.count * p.HV;
    for (int it = blockIdx.x; it < items; it += gridDim.x) {
      const int r = it / p.HV;
      flush_rows_item<T, KDA, CF>(p, sm.rows[r] * p.HV + (it - r * p.HV), sm);
    }
    __syncthreads();  // the next window rewrites the row list
  }
}

// RC_FLUSH_PIPE: round k, setup warps (threads < 128) prepare the block's item k into buffer k & 1
// (tables, and its state rows by cp.async) while the replay warps run item k - 1 from the other
// buffer; one barrier per round.
template <typename T, bool KDA, int CF>
__global__ void __launch_bounds__(fr::NSET + fr::NREP, 1) flush_pipe_kernel(const Args p) {
  extern __shared__ float4 rc_smem[];
  fr::PipeSmem& sm = *reinterpret_cast<fr::PipeSmem*>(rc_smem);
  const int t = threadIdx.x;
  for (int w0 = 0; w0 < p.B; w0 += ROW_WINDOW) {
    if (t < 32) {
      const int count = list_flush_rows(p, w0, min(p.B, w0 + ROW_WINDOW), sm.rows);
      if (threadIdx.x == 0) sm.count = count;
    }
    __syncthreads();
    const int items = sm.count * p.HV;
    const int mine = items > static_cast<int>(blockIdx.x) ? (items - blockIdx.x + gridDim.x - 1) / gridDim.x : 0;
    for (int k = 0; k <= mine; ++k) {
      if (t < fr::NSET) {
        if (k < mine) {
          const int idx = blockIdx.x + k * gridDim.x, r = idx / p.HV;
          const fr::Item it = fr::item_of(p, sm.rows[r] * p.HV + (idx - r * p.HV));
          const int64_t slot = slot_of(p.slots, p.idx64, it.n);
          const int m = p.write_pos[it.n];
          fr::Tables& tb = sm.tb[k & 1];
          const float* sbase = p.state + slot * p.s_state + static_cast<int64_t>(it.hv) * V * K;
#pragma unroll 4
          for (int u = 0; u < V * K / 4 / fr::NSET; ++u) {  // one row (32 chunks) per warp and u
            const int f = u * fr::NSET + t, row = f >> 5, c = f & 31;
            cp_async16(&sm.st[k & 1][row][c ^ fr::swz(row)], sbase + row * K + 4 * c);
          }
          cp_async_commit();
          const T* qkv = static_cast<const T*>(p.qkv) + it.n * p.s_qkv;
          const float3 nf = fr::token_norms(p, qkv, it.i_h, t & 31);
          fr::fill_column<T, KDA>(p, it, slot, m, t, qkv, nf.x, nf.y, tb);
          fr::fill_row(p, it, slot, m, t, qkv, tb);
          if (t == 0) {
            tb.slot = slot;
            tb.kq = nf.z;
            tb.m = m;
          }
          cp_async_wait<0>();
        }
      } else if (k > 0) {
        const int rt = t - fr::NSET, row = rt >> 1, h = rt & 1;
        const int idx = blockIdx.x + (k - 1) * gridDim.x, r = idx / p.HV;
        const fr::Item it = fr::item_of(p, sm.rows[r] * p.HV + (idx - r * p.HV));
        const fr::Tables& tb = sm.tb[(k - 1) & 1];
        float4 S[fr::NCHUNK];
#pragma unroll
        for (int i = 0; i < fr::NCHUNK; ++i) S[i] = sm.st[(k - 1) & 1][row][(2 * i + h) ^ fr::swz(row)];
        fr::replay_row<T, CF>(p, tb, S, it, tb.slot, tb.m, tb.kq, row, h);
      }
      __syncthreads();  // buffer k & 1 complete; buffer (k - 1) & 1 free
    }
  }
}

// the flush pass this build compiles (only that one is instantiated)
template <typename T, bool KDA, int CF>
constexpr auto flush_kernel_of() {
  if constexpr (RC_FLUSH_PIPE)
    return flush_pipe_kernel<T, KDA, CF>;
  else if constexpr (RC_FLUSH_ROWS > 0)
    return flush_rows_kernel<T, KDA, CF>;
  else
    return flush_kernel<T, KDA, CF>;
}

template <typename T, bool KDA, int CF>
cudaError_t launch(const Args& p, bool flush, int waves, cudaStream_t stream) {
  if (!flush) {
    const int pairs = p.B * p.HV;
    const size_t smem = RC_READ_WARPS * read_smem_f4(static_cast<int>(sizeof(T)), CF) * sizeof(float4);
    static bool smem_set = false;  // per instantiation (host call only: safe under capture)
    if (smem > 48 * 1024 && !smem_set) {
      const cudaError_t e = cudaFuncSetAttribute(read_kernel<T, KDA, CF>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                                 static_cast<int>(smem));
      if (e != cudaSuccess) return e;
      smem_set = true;
    }
    read_kernel<T, KDA, CF><<<(pairs + RC_READ_WARPS - 1) / RC_READ_WARPS, 32 * RC_READ_WARPS, smem, stream>>>(p);
    return cudaGetLastError();
  }
  constexpr bool ROWS = RC_FLUSH_ROWS > 0 || RC_FLUSH_PIPE;
  auto kern = flush_kernel_of<T, KDA, CF>();
  const int threads = RC_FLUSH_PIPE ? fr::NSET + fr::NREP : RC_FLUSH_ROWS ? fr::NREP : 32;
  // dynamic shared memory: the warp layout's (flush_smem_f4: after flush_item_tc), the pipelined row
  // layout's buffers; the row layout's is static
  const size_t smem = RC_FLUSH_PIPE ? sizeof(fr::PipeSmem) : RC_FLUSH_ROWS ? 0 : flush_smem_f4(KDA) * sizeof(float4);
  static int resident = 0, sm_count = 0;  // per instantiation, computed once (host queries only: safe under capture)
  if (resident == 0) {
    cudaError_t e = smem == 0 ? cudaSuccess
                              : cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                                     static_cast<int>(smem));
    int dev = 0, sms = 0, per_sm = 0;
    if (e == cudaSuccess) e = cudaGetDevice(&dev);
    if (e == cudaSuccess) e = cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev);
    if (e == cudaSuccess) e = cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kern, threads, smem);
    if (e != cudaSuccess) return e;
    resident = sms * (per_sm > 0 ? per_sm : 1);
    sm_count = sms;
  }
  const int64_t items = static_cast<int64_t>(p.B) * p.HV * (ROWS ? 1 : p.parts);
  // waves >= 1: that many resident sets; waves <= -1: -waves blocks per SM (fewer flush warps at
  // once, each taking several items, so the non-flush pass keeps the rest of the register file)
  int64_t grid = waves < 0 ? static_cast<int64_t>(-waves) * sm_count : static_cast<int64_t>(waves > 0 ? waves : 1) * resident;
  if (grid > items) grid = items;
  kern<<<static_cast<int>(grid), threads, smem, stream>>>(p);
  return cudaGetLastError();
}

template <typename T>
cudaError_t launch_t(const Args& p, bool kda, int fmt, bool flush, int waves, cudaStream_t st) {
  if (kda) return fmt == 2 ? launch<T, true, 2>(p, flush, waves, st) : launch<T, true, 1>(p, flush, waves, st);
  return fmt == 2 ? launch<T, false, 2>(p, flush, waves, st) : launch<T, false, 1>(p, flush, waves, st);
}

}  // namespace rc
}  // namespace

// One pass of a read-copy decode step. strides: leading (slot / row) strides of qkv, a, b, state, d,
// k, g, copy, scales, v, beta. copy_fmt: 1 = bf16, 2 = e4m3 with per-row scales. io_dtype: 0 fp32,
// 1 bf16. flush: 0 = non-flush rows (+ padded rows zeroed), 1 = flush rows. parts: warps per flush
// (row, head) (1, 2, 4 or 8), waves: the flush grid in resident sets (>= 1) or, when negative, in
// blocks per SM. Returns a cudaError_t code.
extern "C" int read_copy_launch(const void* qkv, const void* a, const void* b, const float* A_log,
                                const float* dt_bias, void* out, float* state, void* copy, float* scales,
                                void* d_ring, float* k_ring, float* g_ring, void* v_ring, float* beta_ring,
                                const void* slots, const int32_t* write_pos, const int32_t* force_flush, float scale,
                                const int64_t* strides, int B, int H, int HV, int L, int is_kda, int use_l2norm,
                                int io_dtype, int idx64, int copy_fmt, int flush, int parts, int waves, void* stream) {
  rc::Args p{qkv, a, b, A_log, dt_bias, out, state, copy, scales, d_ring, k_ring, g_ring, v_ring, beta_ring, slots,
             write_pos, force_flush, scale, strides[0], strides[1], strides[2], strides[3], strides[4], strides[5],
             strides[6], strides[7], strides[8], strides[9], strides[10], B, H, HV, L, parts, idx64 != 0,
             use_l2norm != 0};
  cudaStream_t st = static_cast<cudaStream_t>(stream);
  cudaError_t e = io_dtype == 1 ? rc::launch_t<__nv_bfloat16>(p, is_kda != 0, copy_fmt, flush != 0, waves, st)
                                : rc::launch_t<float>(p, is_kda != 0, copy_fmt, flush != 0, waves, st);
  return static_cast<int>(e);
}
