// Non-flush ReplaySSM read-out (GDN and KDA), CUDA: one warp per (decode row, value head).
//
// Function, ring layout and cursor rule: sglang_replayssm/kernels/ring_decode_triton.py (module
// docstring). This kernel does the every-step half only: rows whose step is a flush return at
// once (the caller launches the flush pass for them); padded rows (slot < 0) get a zero output.
//
// Why CUDA: at decode sizes the Triton kernels are bound by instructions issued (412 per 8-row
// chunk, 120 of them shuffles; notes/kernels.md). Here every lane owns 4 fixed K columns and walks
// the 8 rows of a chunk as one 512-byte row per load instruction; the 8 row sums reduce-scatter
// over lane bits 4..2 (3 shuffle rounds, 7 shuffles per vector instead of 40) so the lane ends
// with row sigma = lane bits 4..2, and the delta-ring part joins the sum before the last 2 rounds.
//
// Requirements (checked by the Python wrapper): K = V = 128, L <= 16, state and ring tensors fp32
// and contiguous within a slot, qkv / a / b / out one dtype (fp32 or bf16), A_log / dt_bias fp32.

#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <stdint.h>

namespace {

constexpr int K = 128;
constexpr int V = 128;
constexpr int ROWS = 8;  // rows per chunk
constexpr unsigned FULL = 0xffffffffu;

__device__ __forceinline__ float to_f(float x) { return x; }
__device__ __forceinline__ float to_f(__nv_bfloat16 x) { return __bfloat162float(x); }
template <typename T> __device__ __forceinline__ T from_f(float x);
template <> __device__ __forceinline__ float from_f<float>(float x) { return x; }
template <> __device__ __forceinline__ __nv_bfloat16 from_f<__nv_bfloat16>(float x) { return __float2bfloat16_rn(x); }

__device__ __forceinline__ float4 ld4(const float* p) { return *reinterpret_cast<const float4*>(p); }
__device__ __forceinline__ float4 ld4(const __nv_bfloat16* p) {
  uint2 raw = *reinterpret_cast<const uint2*>(p);
  __nv_bfloat162 lo = *reinterpret_cast<__nv_bfloat162*>(&raw.x);
  __nv_bfloat162 hi = *reinterpret_cast<__nv_bfloat162*>(&raw.y);
  float2 a = __bfloat1622float2(lo), b = __bfloat1622float2(hi);
  return make_float4(a.x, a.y, b.x, b.y);
}
__device__ __forceinline__ float4 ld4_cs(const float* p) { return __ldcs(reinterpret_cast<const float4*>(p)); }
__device__ __forceinline__ float dot4(float4 a, float4 b) {
  return fmaf(a.w, b.w, fmaf(a.z, b.z, fmaf(a.y, b.y, a.x * b.x)));
}
__device__ __forceinline__ float4 mul4(float4 a, float s) { return make_float4(a.x * s, a.y * s, a.z * s, a.w * s); }
__device__ __forceinline__ float4 mul4(float4 a, float4 b) { return make_float4(a.x * b.x, a.y * b.y, a.z * b.z, a.w * b.w); }
__device__ __forceinline__ float warp_sum(float x) {
#pragma unroll
  for (int d = 16; d >= 1; d >>= 1) x += __shfl_xor_sync(FULL, x, d);
  return x;
}
__device__ __forceinline__ float softplus(float x) { return x <= 20.f ? logf(1.f + expf(fminf(x, 20.f))) : x; }

// 16 values per lane -> lane l holds the warp total of value (l >> 1).
__device__ __forceinline__ float reduce_scatter16(float (&v)[16], int lane) {
#pragma unroll
  for (int i = 0; i < 8; ++i) {
    bool up = lane & 16;
    float send = up ? v[i] : v[i + 8], keep = up ? v[i + 8] : v[i];
    v[i] = keep + __shfl_xor_sync(FULL, send, 16);
  }
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    bool up = lane & 8;
    float send = up ? v[i] : v[i + 4], keep = up ? v[i + 4] : v[i];
    v[i] = keep + __shfl_xor_sync(FULL, send, 8);
  }
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    bool up = lane & 4;
    float send = up ? v[i] : v[i + 2], keep = up ? v[i + 2] : v[i];
    v[i] = keep + __shfl_xor_sync(FULL, send, 4);
  }
  {
    bool up = lane & 2;
    float send = up ? v[0] : v[1], keep = up ? v[1] : v[0];
    v[0] = keep + __shfl_xor_sync(FULL, send, 2);
  }
  return v[0] + __shfl_xor_sync(FULL, v[0], 1);
}

// Per-(row, value head) quantities; lane owns K columns 4*lane .. 4*lane+3.
struct Head {
  float4 k;         // normalised key (this lane's columns)
  float4 qv, kv;    // read-out vectors applied to checkpoint rows
  float4 sa;        // flush scale on the checkpoint (A o alpha)
  float4 g_cur4;    // KDA: this step's log-decay (this lane's columns)
  float g_cur_s;    // GDN: this step's log-decay
  float kq, beta;
  float cqs[4], cks[4];  // read-out coefficients of records 4*(lane&3) + t
  float4 fk[16];    // flush: factor of record j on this lane's columns (zero for dead records)
};

template <typename T, bool KDA, bool L2N, bool FLUSH>
__device__ __forceinline__ void head_setup(Head& h, const T* row, const T* a, const T* b, const float* A_log,
                                           const float* dt_bias, const float* k_ring, const float* g_ring,
                                           int64_t slot, int n, int hv, int i_h, int nvalid, int lane, float scale,
                                           int64_t stride_a, int64_t stride_b, int64_t stride_k, int64_t stride_g,
                                           int H, int L) {
  float4 q = ld4(row + i_h * K + 4 * lane);
  float4 k = ld4(row + H * K + i_h * K + 4 * lane);
  float q_fac = scale, k_fac = 1.f;
  if (L2N) {
    q_fac = scale / sqrtf(warp_sum(dot4(q, q)) + 1e-6f);
    k_fac = 1.f / sqrtf(warp_sum(dot4(k, k)) + 1e-6f);
  }
  q = mul4(q, q_fac);
  k = mul4(k, k_fac);
  h.k = k;
  h.kq = warp_sum(dot4(k, q));
  const float a_decay = expf(A_log[hv]);
  h.beta = to_f(from_f<T>(1.f / (1.f + expf(-to_f(b[n * stride_b + hv])))));
  const float* kr = k_ring + slot * stride_k + static_cast<int64_t>(i_h) * L * K + 4 * lane;
  const float4 zero = make_float4(0.f, 0.f, 0.f, 0.f);
  float pq[16], pk[16];
  h.g_cur_s = 0.f;
  h.g_cur4 = zero;
  float fw = 0.f;
  if (!KDA) {
    const float gj = (lane < nvalid) ? g_ring[slot * stride_g + hv * L + lane] : 0.f;
    float incl = gj;  // sum_{i >= lane} g_i over the live records
#pragma unroll
    for (int d = 1; d < 16; d <<= 1) {
      float t = __shfl_down_sync(FULL, incl, d);
      if (lane + d < 16) incl += t;
    }
    const float g_tot = __shfl_sync(FULL, incl, 0);
    const float x = to_f(a[n * stride_a + hv]) + dt_bias[hv];
    h.g_cur_s = -a_decay * softplus(x);
    const float alpha = expf(h.g_cur_s);
    fw = (lane < nvalid) ? alpha * expf(incl - gj) : 0.f;  // alpha * W_j for j = lane
    const float sa = alpha * expf(g_tot);
    h.sa = make_float4(sa, sa, sa, sa);
    h.qv = mul4(q, sa);
    h.kv = mul4(k, sa);
#pragma unroll
    for (int j = 0; j < 16; ++j) {
      const float4 kj = (j < nvalid) ? ld4(kr + j * K) : zero;
      pq[j] = dot4(kj, q);
      pk[j] = dot4(kj, k);
      if (FLUSH) h.fk[j] = mul4(kj, __shfl_sync(FULL, fw, j));
    }
  } else {
    const float4 av = ld4(a + n * stride_a + static_cast<int64_t>(hv) * K + 4 * lane);
    const float4 dv = ld4(dt_bias + static_cast<int64_t>(hv) * K + 4 * lane);
    h.g_cur4 = make_float4(-a_decay * softplus(av.x + dv.x), -a_decay * softplus(av.y + dv.y),
                           -a_decay * softplus(av.z + dv.z), -a_decay * softplus(av.w + dv.w));
    const float4 alpha = make_float4(expf(h.g_cur4.x), expf(h.g_cur4.y), expf(h.g_cur4.z), expf(h.g_cur4.w));
    const float4 aq = mul4(alpha, q), ak = mul4(alpha, k);
    const float* gp = g_ring + slot * stride_g + static_cast<int64_t>(hv) * L * K + 4 * lane;
    float4 suf = zero;  // sum_{i > j} g_i
    // branch-free (dead records load nothing and contribute zeros) so the loads can be issued early
#pragma unroll
    for (int j = 15; j >= 0; --j) {
      const bool live = j < nvalid;
      const float4 kj = live ? ld4(kr + j * K) : zero;
      const float4 gj = live ? ld4(gp + j * K) : zero;
      const float4 w = make_float4(expf(suf.x) * kj.x, expf(suf.y) * kj.y, expf(suf.z) * kj.z, expf(suf.w) * kj.w);
      pq[j] = dot4(w, aq);
      pk[j] = dot4(w, ak);
      if (FLUSH) h.fk[j] = mul4(w, alpha);
      suf = make_float4(suf.x + gj.x, suf.y + gj.y, suf.z + gj.z, suf.w + gj.w);
    }
    h.sa = make_float4(alpha.x * expf(suf.x), alpha.y * expf(suf.y), alpha.z * expf(suf.z), alpha.w * expf(suf.w));
    h.qv = mul4(h.sa, q);
    h.kv = mul4(h.sa, k);
  }
  float cq = reduce_scatter16(pq, lane);  // record (lane >> 1)
  float ck = reduce_scatter16(pk, lane);
  if (!KDA) {
    const float fwj = __shfl_sync(FULL, fw, lane >> 1);
    cq *= fwj;
    ck *= fwj;
  }
  const int s = lane & 3;
#pragma unroll
  for (int t = 0; t < 4; ++t) {
    h.cqs[t] = __shfl_sync(FULL, cq, 2 * (4 * s + t));
    h.cks[t] = __shfl_sync(FULL, ck, 2 * (4 * s + t));
  }
}

// Read-out of one chunk of ROWS rows: returns (sq, sk) of row sigma = lane bits 4..2 (in all 4 lanes
// of that row). srows: the chunk's checkpoint rows (this lane's columns); d[t]: delta record
// 4*(lane&3)+t at row sigma (zero when dead).
__device__ __forceinline__ float2 chunk_readout(const float4 (&srows)[ROWS], const float (&d)[4], const Head& h,
                                                int lane) {
  float rq = 0.f, rk = 0.f;
#pragma unroll
  for (int t = 0; t < 4; ++t) {
    rq = fmaf(h.cqs[t], d[t], rq);
    rk = fmaf(h.cks[t], d[t], rk);
  }
  float p[ROWS], pkk[ROWS];
#pragma unroll
  for (int i = 0; i < ROWS; ++i) {
    p[i] = dot4(srows[i], h.qv);
    pkk[i] = dot4(srows[i], h.kv);
  }
  const bool up4 = lane & 16, up2 = lane & 8, up1 = lane & 4;
  // reduce-scatter over lane bits 4, 3, 2: the lane keeps the half holding row sigma
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const float sq_ = up4 ? p[i] : p[i + 4], kq_ = up4 ? p[i + 4] : p[i];
    const float sk_ = up4 ? pkk[i] : pkk[i + 4], kk_ = up4 ? pkk[i + 4] : pkk[i];
    p[i] = kq_ + __shfl_xor_sync(FULL, sq_, 16);
    pkk[i] = kk_ + __shfl_xor_sync(FULL, sk_, 16);
  }
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    const float sq_ = up2 ? p[i] : p[i + 2], kq_ = up2 ? p[i + 2] : p[i];
    const float sk_ = up2 ? pkk[i] : pkk[i + 2], kk_ = up2 ? pkk[i + 2] : pkk[i];
    p[i] = kq_ + __shfl_xor_sync(FULL, sq_, 8);
    pkk[i] = kk_ + __shfl_xor_sync(FULL, sk_, 8);
  }
  float sq = (up1 ? p[1] : p[0]) + __shfl_xor_sync(FULL, up1 ? p[0] : p[1], 4) + rq;
  float sk = (up1 ? pkk[1] : pkk[0]) + __shfl_xor_sync(FULL, up1 ? pkk[0] : pkk[1], 4) + rk;
  sq += __shfl_xor_sync(FULL, sq, 2);
  sk += __shfl_xor_sync(FULL, sk, 2);
  sq += __shfl_xor_sync(FULL, sq, 1);
  sk += __shfl_xor_sync(FULL, sk, 1);
  return make_float2(sq, sk);
}

struct Chunk {
  float4 s[ROWS];
  float d[4];
  float v;
};

#ifndef RR_MIN_BLOCKS  // register budget of the non-flush pass: blocks of 4 warps per SM
#define RR_MIN_BLOCKS 4
#endif
#ifndef RR_FLUSH_MIN_BLOCKS  // the same for the flush pass (1: no cap, ~250 registers)
#define RR_FLUSH_MIN_BLOCKS 1
#endif

// FLUSH = false: non-flush rows (output + ring record); FLUSH = true: flush rows (output + new checkpoint).
template <typename T, typename IDX, bool KDA, bool L2N, bool FLUSH>
__global__ void __launch_bounds__(128, FLUSH ? RR_FLUSH_MIN_BLOCKS : RR_MIN_BLOCKS) ring_step_kernel(
    const T* __restrict__ qkv, const T* __restrict__ a, const T* __restrict__ b, const float* __restrict__ A_log,
    const float* __restrict__ dt_bias, T* __restrict__ out, float* state, float* d_ring,
    float* k_ring, float* g_ring, const IDX* __restrict__ slots, const int32_t* __restrict__ write_pos,
    const int32_t* __restrict__ force_flush, float scale, int64_t stride_qkv, int64_t stride_a, int64_t stride_b,
    int64_t stride_state, int64_t stride_d, int64_t stride_k, int64_t stride_g, int B, int H, int HV, int L) {
  __shared__ float4 dtile[4][2][32];  // FLUSH: per warp, two buffers of the [16 records x 8 rows] delta tile
  const int lane = threadIdx.x & 31;
  const int wib = threadIdx.x >> 5;
  const int pair = blockIdx.x * (blockDim.x >> 5) + wib;
  if (pair >= B * HV) return;
  const int n = pair / HV, hv = pair - n * HV;
  const int i_h = hv / (HV / H);
  const int64_t slot = static_cast<int64_t>(slots[n]);
  const int m = write_pos[n];
  const bool is_flush = (m == L - 1) || (force_flush != nullptr && force_flush[n] != 0);
  T* outp = out + (static_cast<int64_t>(n) * HV + hv) * V;
  if (slot < 0) {
    if (!FLUSH) {
#pragma unroll
      for (int c = 0; c < 4; ++c) outp[4 * lane + c] = from_f<T>(0.f);
    }
    return;
  }
  if (is_flush != FLUSH) return;
  const int nvalid = m < L ? m : L;
  const bool in_ring = m < L;

  // ---- first chunk requested before the setup, so that its latency overlaps it
  const int s = lane & 3;             // which 4 records this lane folds into its row's read-out
  const int sigma = (lane >> 2) & 7;  // which row of each chunk this lane's read-out ends with
  const T* row = qkv + n * stride_qkv;
  float* sbase = state + slot * stride_state + static_cast<int64_t>(hv) * V * K + 4 * lane;
  const float* dring = d_ring + slot * stride_d + static_cast<int64_t>(hv) * L * V;
  const float* dptr = dring + (4 * s) * V + sigma;
  const T* vptr = row + 2 * H * K + hv * V + sigma;
  const int jt = nvalid - 4 * s;  // records t < jt of this lane's four are live
  // FLUSH: lane loads 4 values of the chunk's delta tile: record lane/2, rows 4*(lane&1) .. +3
  const int tj = lane >> 1;
  const float* tptr = dring + tj * V + 4 * (lane & 1);
  auto load_chunk = [&](Chunk& c, float4& dt, int v0) {
#pragma unroll
    for (int i = 0; i < ROWS; ++i) c.s[i] = ld4_cs(sbase + static_cast<int64_t>(v0 + i) * K);
#pragma unroll
    for (int t = 0; t < 4; ++t) c.d[t] = (t < jt) ? dptr[t * V + v0] : 0.f;
    c.v = to_f(vptr[v0]);
    if (FLUSH) dt = (tj < nvalid) ? ld4(tptr + v0) : make_float4(0.f, 0.f, 0.f, 0.f);
  };
  Chunk ca, cb;
  float4 dta, dtb;
  load_chunk(ca, dta, 0);

  Head h;
  head_setup<T, KDA, L2N, FLUSH>(h, row, a, b, A_log, dt_bias, k_ring, g_ring, slot, n, hv, i_h, nvalid, lane,
                                 scale, stride_a, stride_b, stride_k, stride_g, H, L);

  T* optr = outp + sigma;
  float* wptr = d_ring + slot * stride_d + (static_cast<int64_t>(hv) * L + m) * V + sigma;
  auto chunk = [&](const Chunk& c, const float4& dt, int v0, int buf) {
    const float2 r = chunk_readout(c.s, c.d, h, lane);
    const float dcur = h.beta * (c.v - r.y);
    if (s == 0) {
      optr[v0] = from_f<T>(fmaf(dcur, h.kq, r.x));
      if (!FLUSH && in_ring) wptr[v0] = dcur;
    }
    if (FLUSH) {
      // new rows: S . Diag(sa) + sum_j d_j fk_j^T + d_cur k^T, this lane's columns of all 8 rows
      dtile[wib][buf][lane] = dt;
      __syncwarp();
      float4 acc[ROWS];
#pragma unroll
      for (int i = 0; i < ROWS; ++i) {
        const float dci = __shfl_sync(FULL, dcur, 4 * i);  // lanes 4i..4i+3 hold row i
        acc[i] = make_float4(fmaf(dci, h.k.x, c.s[i].x * h.sa.x), fmaf(dci, h.k.y, c.s[i].y * h.sa.y),
                             fmaf(dci, h.k.z, c.s[i].z * h.sa.z), fmaf(dci, h.k.w, c.s[i].w * h.sa.w));
      }
#pragma unroll
      for (int j = 0; j < 16; ++j) {
        if (j < nvalid) {
          const float4 lo = dtile[wib][buf][2 * j], hi = dtile[wib][buf][2 * j + 1];
          const float dj[ROWS] = {lo.x, lo.y, lo.z, lo.w, hi.x, hi.y, hi.z, hi.w};
          const float4 f = h.fk[j];
#pragma unroll
          for (int i = 0; i < ROWS; ++i) {
            acc[i].x = fmaf(dj[i], f.x, acc[i].x);
            acc[i].y = fmaf(dj[i], f.y, acc[i].y);
            acc[i].z = fmaf(dj[i], f.z, acc[i].z);
            acc[i].w = fmaf(dj[i], f.w, acc[i].w);
          }
        }
      }
#pragma unroll
      for (int i = 0; i < ROWS; ++i)
        *reinterpret_cast<float4*>(sbase + static_cast<int64_t>(v0 + i) * K) = acc[i];
    }
  };
#pragma unroll 1
  for (int v0 = 0; v0 < V; v0 += 2 * ROWS) {
    load_chunk(cb, dtb, v0 + ROWS);
    chunk(ca, dta, v0, 0);
    if (v0 + 2 * ROWS < V) load_chunk(ca, dta, v0 + 2 * ROWS);
    chunk(cb, dtb, v0 + ROWS, 1);
  }

  // ---- non-flush: this step's gate and key records
  if (!FLUSH && in_ring) {
    if (!KDA) {
      if (lane == 0) g_ring[slot * stride_g + hv * L + m] = h.g_cur_s;
    } else {
      *reinterpret_cast<float4*>(g_ring + slot * stride_g + (static_cast<int64_t>(hv) * L + m) * K + 4 * lane) =
          h.g_cur4;
    }
    if (hv % (HV / H) == 0)
      *reinterpret_cast<float4*>(k_ring + slot * stride_k + (static_cast<int64_t>(i_h) * L + m) * K + 4 * lane) =
          h.k;
  }
}

template <typename T, typename IDX, bool KDA, bool L2N, bool FLUSH>
cudaError_t launch_t(const void* qkv, const void* a, const void* b, const float* A_log, const float* dt_bias,
                     void* out, float* state, float* d_ring, float* k_ring, float* g_ring, const void* slots,
                     const int32_t* write_pos, const int32_t* force_flush, float scale, const int64_t* strides,
                     int B, int H, int HV, int L, int warps, cudaStream_t stream) {
  const int pairs = B * HV;
  const int blocks = (pairs + warps - 1) / warps;
  ring_step_kernel<T, IDX, KDA, L2N, FLUSH><<<blocks, 32 * warps, 0, stream>>>(
      static_cast<const T*>(qkv), static_cast<const T*>(a), static_cast<const T*>(b), A_log, dt_bias,
      static_cast<T*>(out), state, d_ring, k_ring, g_ring, static_cast<const IDX*>(slots), write_pos, force_flush,
      scale, strides[0], strides[1], strides[2], strides[3], strides[4], strides[5], strides[6], B, H, HV, L);
  return cudaGetLastError();
}

template <typename T, typename IDX, bool FLUSH>
cudaError_t launch_kind(bool kda, bool l2n, const void* qkv, const void* a, const void* b, const float* A_log,
                        const float* dt_bias, void* out, float* state, float* d_ring, float* k_ring,
                        float* g_ring, const void* slots, const int32_t* write_pos, const int32_t* force_flush,
                        float scale, const int64_t* strides, int B, int H, int HV, int L, int warps,
                        cudaStream_t stream) {
#define RR_ARGS qkv, a, b, A_log, dt_bias, out, state, d_ring, k_ring, g_ring, slots, write_pos, force_flush, \
                scale, strides, B, H, HV, L, warps, stream
  if (kda)
    return l2n ? launch_t<T, IDX, true, true, FLUSH>(RR_ARGS) : launch_t<T, IDX, true, false, FLUSH>(RR_ARGS);
  return l2n ? launch_t<T, IDX, false, true, FLUSH>(RR_ARGS) : launch_t<T, IDX, false, false, FLUSH>(RR_ARGS);
#undef RR_ARGS
}

}  // namespace

// io_dtype: 0 = fp32, 1 = bf16; idx64: ssm_state_indices is int64; flush: 0 = the non-flush rows'
// pass (output + ring record), 1 = the flush rows' pass (output + new checkpoint). Returns a
// cudaError_t code.
extern "C" int ring_step_launch(const void* qkv, const void* a, const void* b, const float* A_log,
                                const float* dt_bias, void* out, float* state, float* d_ring, float* k_ring,
                                float* g_ring, const void* slots, const int32_t* write_pos,
                                const int32_t* force_flush, float scale, const int64_t* strides, int B, int H, int HV,
                                int L, int is_kda, int use_l2norm, int io_dtype, int idx64, int warps, int flush,
                                void* stream) {
  cudaStream_t st = static_cast<cudaStream_t>(stream);
#define RR_ARGS2 is_kda != 0, use_l2norm != 0, qkv, a, b, A_log, dt_bias, out, state, d_ring, k_ring, g_ring, slots, \
                 write_pos, force_flush, scale, strides, B, H, HV, L, warps, st
  cudaError_t e;
  if (flush) {
    if (io_dtype == 1)
      e = idx64 ? launch_kind<__nv_bfloat16, int64_t, true>(RR_ARGS2) : launch_kind<__nv_bfloat16, int32_t, true>(RR_ARGS2);
    else
      e = idx64 ? launch_kind<float, int64_t, true>(RR_ARGS2) : launch_kind<float, int32_t, true>(RR_ARGS2);
  } else {
    if (io_dtype == 1)
      e = idx64 ? launch_kind<__nv_bfloat16, int64_t, false>(RR_ARGS2) : launch_kind<__nv_bfloat16, int32_t, false>(RR_ARGS2);
    else
      e = idx64 ? launch_kind<float, int64_t, false>(RR_ARGS2) : launch_kind<float, int32_t, false>(RR_ARGS2);
  }
#undef RR_ARGS2
  return static_cast<int>(e);
}
