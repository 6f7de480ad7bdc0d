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
// leaves the other's rows alone, so the wrapper runs them concurrently. This source compiles the
// builds read_copy_cuda.default_config picks; the research builds (tensor-core read and flush, row
// layouts, paired replays, register caps) are lab/kernels/csrc/read_copy.cu.
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
#ifndef RC_FLUSH_PREFETCH  // flush pass: 1 = the next 16-row block's state rows loaded into registers
#define RC_FLUSH_PREFETCH 0  // while the current block computes (the flush warps have registers to spare)
#endif
#ifndef RC_FP8_RECIP  // fp8 copy: 1 = x * (448 / amax) per element, 0 = x / (amax / 448) (IEEE division)
#define RC_FP8_RECIP 0
#endif
#ifndef RC_STAGES  // non-flush pass: 0 = RC_DEPTH chunks in registers (chunk loop unrolled); >= 2 = a
#define RC_STAGES 0  // cp.async ring of that many chunks per warp in shared memory (rows, d~ tile, scales)
#endif
#ifndef RC_READ_ROWS  // non-flush pass, staged (RC_STAGES >= 2): 1 = eight lanes per copy row of a chunk, each 16
#define RC_READ_ROWS 0  // of its columns (of two rows; the read-out vectors there in registers): one shuffle round
#endif                  // before the records' two instead of a reduce-scatter of 8 rows over 32 lanes
#ifndef RC_FLUSH_TILE  // warp-layout flush pass: 1 = lanes own 4 rows x 16 columns of a 16-row block (row sums
#define RC_FLUSH_TILE 0  // over 8 lanes: 7 shuffles a step instead of 32) against key tables built once per item
#endif
static_assert(RC_DEPTH >= 1 && RC_DEPTH <= 6, "RC_DEPTH is 1..6");
static_assert(RC_READ_WARPS == 1 || RC_READ_WARPS == 2 || RC_READ_WARPS == 4, "RC_READ_WARPS is 1, 2 or 4");
static_assert(RC_FLUSH_TILE == 0 || RC_FLUSH_TILE == 1, "RC_FLUSH_TILE is 0 or 1");
static_assert(RC_STAGES == 0 || (RC_STAGES >= 2 && RC_STAGES <= 8), "RC_STAGES is 0 or 2..8");
static_assert(!RC_READ_ROWS || RC_STAGES >= 2, "RC_READ_ROWS reads staged chunks (RC_STAGES >= 2)");

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
// RC_READ_ROWS: the read-out vectors, once per pair
constexpr int TC_SCRATCH_F4 = RC_READ_ROWS ? 2 * K / 4 : 0;
__host__ __device__ constexpr int read_smem_f4(int io_bytes, int cf) {
  return RC_STAGES > 0 ? RC_STAGES * (ROWS * K * (cf == 1 ? 2 : 1) / 16 + 16 * ROWS * io_bytes / 16 + (cf == 2 ? ROWS / 4 : 0)) + TC_SCRATCH_F4
         : 0;
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
  float4* stage = rc_read_smem + (threadIdx.x >> 5) * (ST * SG::F4 + TC_SCRATCH_F4);  // this warp's
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
    for (int i = 0; i < SG::ROWS_F4 / 32; ++i) cp_async16v(buf + 32 * i + lane, isrc + 32 * i);
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
#pragma unroll
    for (int t = 0; t < 4; ++t) dd[b][t] = (t < jt) ? to_f(dptr[t * V + v0]) : 0.f;
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
#if RC_READ_ROWS
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
#if RC_READ_ROWS
      tail(pq[0], pk[0], d, __shfl_sync(FULL, vsel, (v0 & 31) + sigma), scl, 0);
#else
      chunk(sr, d, __shfl_sync(FULL, vsel, (v0 & 31) + sigma), scl, 0);
#endif
      optr += ROWS;  // (finish writes row 0 + sigma of these: chunk c's)
      wptr += ROWS;
    }
  } else {
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
      for (int t = 0; t < 4; ++t) d[t] = dd[b][t];
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
__host__ __device__ constexpr int flush_smem_f4(bool kda) {
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

// Replays one 16-row block (rows r0 .. r0 + 15, lane slot i holding row r0 + (i ^ lr)) over steps
// 0..m from the fp32 rows in S, then writes the rows, their copy and (fp8) scales.
// The decay is deferred: the state is c . St (c: GDN one scalar, KDA this lane's 4 columns), so a
// step costs one FMA per element for the row sums and one for the update; c is folded back into St
// (St <- c . St, c <- 1) before any product would fall under 2**-40.
template <typename T, bool KDA, int CF>
__device__ __forceinline__ void replay_blocks(const FlushRows<T, CF>& f, int r0, float4 (&S)[16]) {
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
        for (int i = 0; i < 16; ++i) S[i] = mul4(S[i], c4);
        c4 = make_float4(1.f, 1.f, 1.f, 1.f);
      }
      kt = mul4(c4, kj);
      // c4 in [2**-40, 1]: the fast reciprocal (2 ulp) is enough for the update's scale
      kh = make_float4(__fdividef(kj.x, c4.x), __fdividef(kj.y, c4.y), __fdividef(kj.z, c4.z), __fdividef(kj.w, c4.w));
    } else {
      cg *= __shfl_sync(FULL, f.alpha_reg, j);
      if (cg < RENORM) {  // warp-uniform
#pragma unroll
        for (int i = 0; i < 16; ++i) S[i] = mul4(S[i], cg);
        cg = 1.f;
      }
      kt = kj;
      kh = kj;
    }
    float pr[16];
#pragma unroll
    for (int i = 0; i < 16; ++i) pr[i] = dot4(S[i], kt);
    const float r = KDA ? rs_perm16(pr) : cg * rs_perm16(pr);
    const float dj = bj * (f.vsm[j * V + r0 + lr] - r);
    if (j == m) {  // warp-uniform: this token's output from the decayed state
      const float4 qt = KDA ? mul4(c4, f.q) : f.q;
#pragma unroll
      for (int i = 0; i < 16; ++i) pr[i] = dot4(S[i], qt);
      const float oq = KDA ? rs_perm16(pr) : cg * rs_perm16(pr);
      if ((lane & 1) == 0) f.outp[r0 + lr] = from_f<T>(fmaf(dj, f.kq, oq));
    }
    const float du = KDA ? dj : __fdividef(dj, cg);  // the update in St's scale (cg in [2**-40, 1])
#pragma unroll
    for (int i = 0; i < 16; ++i) S[i] = fma4(__shfl_sync(FULL, du, 2 * (i ^ lr)), kh, S[i]);
  }
#pragma unroll
  for (int i = 0; i < 16; ++i) S[i] = KDA ? mul4(S[i], c4) : mul4(S[i], cg);
#pragma unroll
  for (int i = 0; i < 16; ++i)
    __stcs(reinterpret_cast<float4*>(f.sbase + static_cast<int64_t>(r0 + (i ^ lr)) * K), S[i]);
  if constexpr (CF == 1) {
#pragma unroll
    for (int i = 0; i < 16; ++i)
      *reinterpret_cast<uint2*>(f.cbase + static_cast<int64_t>(r0 + (i ^ lr)) * K) = pack_bf16(S[i]);
  } else {
    float am[16];
#pragma unroll
    for (int i = 0; i < 16; ++i)
      am[i] = fmaxf(fmaxf(fabsf(S[i].x), fabsf(S[i].y)), fmaxf(fabsf(S[i].z), fabsf(S[i].w)));
    const float amax = rs_perm_max16(am);
    const float scl = amax > 0.f ? amax / 448.f : 1.f, inv = amax > 0.f ? 448.f / amax : 1.f;
    if ((lane & 1) == 0) f.scales[r0 + lr] = scl;
#pragma unroll
    for (int i = 0; i < 16; ++i) {
      const float si = __shfl_sync(FULL, scl, 2 * (i ^ lr)), ii = __shfl_sync(FULL, inv, 2 * (i ^ lr));
      const float4 x = make_float4(fp8_units(S[i].x, si, ii), fp8_units(S[i].y, si, ii),
                                   fp8_units(S[i].z, si, ii), fp8_units(S[i].w, si, ii));
      *reinterpret_cast<uint32_t*>(f.cbase + static_cast<int64_t>(r0 + (i ^ lr)) * K) = pack_e4m3(x);
    }
  }
}

// An item's rows [rbeg, rend) in 16-row blocks: load(S, r0) fills one block's registers, replay(S, r0)
// replays S[16] from row r0; with PREFETCH the next block's rows requested before the current one's replay.
template <bool PREFETCH, typename Load, typename Replay>
__device__ __forceinline__ void replay_item_blocks(int rbeg, int rend, Load&& load, Replay&& replay) {
  float4 SN[16];  // PREFETCH: the next block's rows
  if constexpr (PREFETCH) load(SN, rbeg);
#pragma unroll 1
  for (int r0 = rbeg; r0 < rend; r0 += 16) {
    float4 S[16];
    if constexpr (PREFETCH) {
#pragma unroll
      for (int i = 0; i < 16; ++i) S[i] = SN[i];
      if (r0 + 16 < rend) load(SN, r0 + 16);
    } else {
      load(S, r0);
    }
    replay(S, r0);
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

// Replays one 16-row block (rows r0 .. r0 + 15) over steps 0..m, then writes its rows, copy and
// (fp8) scales. Lane (g, c) =
// (lane >> 3, lane & 7) holds in S[4 i + t] row r0 + 4 g + (i ^ rr),
// rr = (c >> 1) & 3, at float4 column c + 8 t: a row's sum is over the 8 lanes of group g (3
// shuffle rounds) and its d_j goes back to them in 3 shuffles.
template <typename T, int CF>
__device__ __forceinline__ void replay_tile(const FlushTile<T, CF>& f, int r0, float4 (&S)[16]) {
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
        for (int i = 0; i < 4; ++i) S[4 * i + t] = mul4(S[4 * i + t], kh[t]);
        kh[t] = kt[t];
      }
    }
    float pr[4];
#pragma unroll
    for (int i = 0; i < 4; ++i) pr[i] = dot16(S + 4 * i, kt);
    const float bj = __shfl_sync(FULL, f.beta_reg, j);
    const float dj = bj * (f.vsm[j * V + r0 + 4 * rg + rr] - rs_perm4(pr));
    if (j == m) {  // item-uniform: this token's output from the decayed state
      float4 qt[4];
#pragma unroll
      for (int t = 0; t < 4; ++t) qt[t] = f.qt[c + 8 * t];
#pragma unroll
      for (int i = 0; i < 4; ++i) pr[i] = dot16(S + 4 * i, qt);
      const float oq = rs_perm4(pr);
      if ((c & 1) == 0) f.outp[r0 + 4 * rg + rr] = from_f<T>(fmaf(dj, f.kq, oq));
    }
    float d[4];
    bc_perm4(dj, d);
#pragma unroll
    for (int i = 0; i < 4; ++i)
#pragma unroll
      for (int t = 0; t < 4; ++t) S[4 * i + t] = fma4(d[i], kh[t], S[4 * i + t]);
  }
#pragma unroll
  for (int t = 0; t < 4; ++t) {
    const float4 ce = f.ce[c + 8 * t];
#pragma unroll
    for (int i = 0; i < 4; ++i) S[4 * i + t] = mul4(S[4 * i + t], ce);
  }
  const int rb = r0 + 4 * rg;  // slot i: row rb + (i ^ rr)
#pragma unroll
  for (int i = 0; i < 4; ++i)
#pragma unroll
    for (int t = 0; t < 4; ++t)
      __stcs(reinterpret_cast<float4*>(f.sbase + static_cast<int64_t>(rb + (i ^ rr)) * K + 32 * t), S[4 * i + t]);
  if constexpr (CF == 1) {
#pragma unroll
    for (int i = 0; i < 4; ++i)
#pragma unroll
      for (int t = 0; t < 4; ++t)
        *reinterpret_cast<uint2*>(f.cbase + static_cast<int64_t>(rb + (i ^ rr)) * K + 32 * t) = pack_bf16(S[4 * i + t]);
  } else {
    float am[4];
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      am[i] = 0.f;
#pragma unroll
      for (int t = 0; t < 4; ++t) {
        const float4 x = S[4 * i + t];
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
        const float4 x = S[4 * i + t];
        *reinterpret_cast<uint32_t*>(f.cbase + static_cast<int64_t>(rb + (i ^ rr)) * K + 32 * t) =
            pack_e4m3(make_float4(fp8_units(x.x, u[i], u[i]), fp8_units(x.y, u[i], u[i]), fp8_units(x.z, u[i], u[i]),
                                  fp8_units(x.w, u[i], u[i])));
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
  replay_item_blocks<RC_FLUSH_PREFETCH>(rbeg, rend, tile_rows, [&](auto& S, int r0) {
    replay_tile<T, CF>(ft, r0, S);
  });
#else
  auto rows = [&](float4 (&S)[16], int r0) {
#pragma unroll
    for (int i = 0; i < 16; ++i) S[i] = ld4_cs(sbase + static_cast<int64_t>(r0 + (i ^ lr)) * K);
  };
  replay_item_blocks<RC_FLUSH_PREFETCH>(rbeg, rend, rows, [&](auto& S, int r0) {
    replay_blocks<T, KDA, CF>(fx, r0, S);
  });
#endif
  __syncwarp();  // the next item rewrites this warp's shared memory
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
__global__ void __launch_bounds__(32) flush_kernel(const Args p) {
  extern __shared__ float4 rc_smem[];
  __shared__ int rows[ROW_WINDOW];
  const int lane = threadIdx.x;
  const int tw = gridDim.x, per_row = p.HV * p.parts;
  for (int w0 = 0; w0 < p.B; w0 += ROW_WINDOW) {
    const int count = list_flush_rows(p, w0, min(p.B, w0 + ROW_WINDOW), rows);
    __syncwarp();
    for (int it = blockIdx.x; it < count * per_row; it += tw) {
      const int r = it / per_row, rest = it - r * per_row;
      flush_item<T, KDA, CF>(p, rows[r] * per_row + rest, rc_smem, lane);
    }
    __syncwarp();  // the next window rewrites the row list
  }
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
  auto kern = flush_kernel<T, KDA, CF>;
  constexpr int threads = 32;
  const size_t smem = flush_smem_f4(KDA) * sizeof(float4);  // dynamic shared memory per warp
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
  const int64_t items = static_cast<int64_t>(p.B) * p.HV * p.parts;
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
