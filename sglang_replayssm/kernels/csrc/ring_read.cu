// ReplaySSM decode step (GDN and KDA) in CUDA, as two passes; one warp per (decode row, value head).
//
// Function, ring layout and cursor rule: sglang_replayssm/kernels/ring_decode_triton.py (module
// docstring). FLUSH = false serves the non-flush rows (output + this step's ring record; padded
// rows, slot < 0, get a zero output); FLUSH = true serves the flush rows (output + the folded
// checkpoint). Each pass leaves the other's rows alone, so the wrapper may run them concurrently.
// The checkpoint streams through a cp.async ring in shared memory (RR_STAGES / RR_FLUSH_STAGES),
// each staged chunk carrying its 8 rows and the live records' deltas at those rows, the rows
// optionally by one bulk copy (RR_BULK / RR_FLUSH_BULK); or, with 0, through two register buffers.
//
// Why CUDA: at decode sizes the Triton kernels are bound by instructions issued (412 per 8-row
// chunk, 120 of them shuffles; notes/kernels.md). Here every lane owns 4 fixed K columns and walks
// the 8 rows of a chunk as one 512-byte row per load instruction; the 8 row sums reduce-scatter
// over lane bits 4..2 (3 shuffle rounds, 7 shuffles per vector instead of 40) so the lane ends
// with row sigma = lane bits 4..2, and the delta-ring part joins the sum before the last 2 rounds.
//
// Requirements (checked by the Python wrapper): K = V = 128, L <= 16, state and ring tensors fp32
// and contiguous within a slot, qkv / a / b / out one dtype (fp32 or bf16), A_log / dt_bias fp32.
//
// Rings keyed by request row (RR_RING_MAP = 1): slot s's records live at ring row ring_map[s] (int32
// [slots]); its checkpoint, cursor and flush stay at s. Builds without it ignore ring_map (ring row = slot).

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
// 16-byte global -> shared copy that bypasses registers (sm_80+); completion per thread by group
__device__ __forceinline__ void cp_async16(float4* smem, const float* gmem) {
  const unsigned s = static_cast<unsigned>(__cvta_generic_to_shared(smem));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(s), "l"(gmem) : "memory");
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
template <int N> __device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}
#ifndef RR_BULK  // non-flush pass, 1: stage each chunk's checkpoint rows with one bulk copy (sm_90 copy engine)
#define RR_BULK 0
#endif
#ifndef RR_FLUSH_BULK  // the same for the flush pass
#define RR_FLUSH_BULK 0
#endif
#if (RR_BULK || RR_FLUSH_BULK) && defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 900
#error "RR_BULK / RR_FLUSH_BULK need sm_90 or newer"
#endif
__device__ __forceinline__ unsigned smem_addr(const void* p) {
  return static_cast<unsigned>(__cvta_generic_to_shared(p));
}
// A completion barrier expecting `count` arrivals per phase.
__device__ __forceinline__ void bar_init(uint64_t* bar, unsigned count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(smem_addr(bar)), "r"(count) : "memory");
}
// This lane arrives on `bar` once all of its earlier cp.async copies have landed.
__device__ __forceinline__ void bar_arrive_cp_async(uint64_t* bar) {
  asm volatile("cp.async.mbarrier.arrive.noinc.shared::cta.b64 [%0];\n" ::"r"(smem_addr(bar)) : "memory");
}
__device__ __forceinline__ void bar_init_fence() {
  asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
}
// One lane: `bytes` contiguous bytes global -> shared by the bulk-copy engine, completing on `bar`
// (marked evict-first in L2: the checkpoint is not read again within the step); the lane arrives
// on `bar` announcing the bytes.
__device__ __forceinline__ void bulk_load(void* smem, const void* gmem, unsigned bytes, uint64_t* bar) {
  const unsigned b = smem_addr(bar);
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(b), "r"(bytes) : "memory");
  asm volatile(
      "{\n .reg .b64 pol;\n createpolicy.fractional.L2::evict_first.b64 pol, 1.0;\n"
      " cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes.L2::cache_hint [%0], [%1], %2, [%3], pol;\n}\n"
      ::"r"(smem_addr(smem)), "l"(gmem), "r"(bytes), "r"(b) : "memory");
}
// Every lane: wait until phase `parity` of `bar` has completed.
__device__ __forceinline__ void bar_wait(uint64_t* bar, unsigned parity) {
  const unsigned b = smem_addr(bar);
  unsigned done = 0;
  do {
    asm volatile("{\n .reg .pred p;\n mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n selp.u32 %0, 1, 0, p;\n}\n"
                 : "=r"(done) : "r"(b), "r"(parity) : "memory");
  } while (!done);
}
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

// One reduce-scatter round over lane bit `mask`: v[0 .. 2 HALF) -> v[0 .. HALF), the lane keeping
// the half its bit selects (the upper one when set) plus its partner's copy of that half.
template <int HALF>
__device__ __forceinline__ void rs_round(float* v, int lane, int mask) {
  const bool up = lane & mask;
#pragma unroll
  for (int i = 0; i < HALF; ++i) {
    const float send = up ? v[i] : v[i + HALF], keep = up ? v[i + HALF] : v[i];
    v[i] = keep + __shfl_xor_sync(FULL, send, mask);
  }
}

// 16 values per lane -> lane l holds the warp total of value (l >> 1).
__device__ __forceinline__ float reduce_scatter16(float (&v)[16], int lane) {
  rs_round<8>(v, lane, 16);
  rs_round<4>(v, lane, 8);
  rs_round<2>(v, lane, 4);
  rs_round<1>(v, lane, 2);
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
                                           int64_t ring, int n, int hv, int i_h, int nvalid, int lane, float scale,
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
  const float* kr = k_ring + ring * stride_k + static_cast<int64_t>(i_h) * L * K + 4 * lane;
  const float4 zero = make_float4(0.f, 0.f, 0.f, 0.f);
  float pq[16], pk[16];
  h.g_cur_s = 0.f;
  h.g_cur4 = zero;
  float fw = 0.f;
  if (!KDA) {
    const float gj = (lane < nvalid) ? g_ring[ring * stride_g + hv * L + lane] : 0.f;
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
    const float* gp = g_ring + ring * stride_g + static_cast<int64_t>(hv) * L * K + 4 * lane;
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

// A chunk's delta tile ([16 records x 8 rows], fp32) in shared memory: record j's 8 rows at float
// tile_at(j), the record's octet within its group of 4 swizzled by the group, so that the 4 records
// the read-out's lanes read at once (4 s + t for s = lane & 3) lie in 4 different bank octets.
constexpr int TILE_F4 = 16 * ROWS / 4;  // one tile, in float4
__device__ __forceinline__ int tile_at(int j) { return 32 * (j >> 2) + 8 * ((j & 3) ^ (j >> 2)); }

// Flush fold of one chunk: acc[i] += sum_{j < NJ} d_j[row i] fk_j (this lane's columns); dead
// records are zero in the tile and in fk.
template <int NJ>
__device__ __forceinline__ void fold_records(float4 (&acc)[ROWS], const float* tile, const float4 (&fk)[16]) {
#pragma unroll
  for (int j = 0; j < NJ; ++j) {
    const float4 lo = *reinterpret_cast<const float4*>(tile + tile_at(j));
    const float4 hi = *reinterpret_cast<const float4*>(tile + tile_at(j) + 4);
    const float dj[ROWS] = {lo.x, lo.y, lo.z, lo.w, hi.x, hi.y, hi.z, hi.w};
    const float4 f = fk[j];
#pragma unroll
    for (int i = 0; i < ROWS; ++i) {
      acc[i].x = fmaf(dj[i], f.x, acc[i].x);
      acc[i].y = fmaf(dj[i], f.y, acc[i].y);
      acc[i].z = fmaf(dj[i], f.z, acc[i].z);
      acc[i].w = fmaf(dj[i], f.w, acc[i].w);
    }
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
  // reduce-scatter over lane bits 4, 3, 2: the lane keeps the half holding row sigma
  rs_round<4>(p, lane, 16);
  rs_round<4>(pkk, lane, 16);
  rs_round<2>(p, lane, 8);
  rs_round<2>(pkk, lane, 8);
  rs_round<1>(p, lane, 4);
  rs_round<1>(pkk, lane, 4);
  float sq = p[0] + rq, sk = pkk[0] + rk;
  sq += __shfl_xor_sync(FULL, sq, 2);
  sk += __shfl_xor_sync(FULL, sk, 2);
  sq += __shfl_xor_sync(FULL, sq, 1);
  sk += __shfl_xor_sync(FULL, sk, 1);
  return make_float2(sq, sk);
}

// ST == 0 (register double buffer): the small per-chunk inputs, loaded one chunk ahead: delta
// records 4*(lane&3)+t at row sigma, this step's v at row sigma, and (FLUSH) this lane's 4 values
// of the chunk's delta tile. Staged passes (ST > 0) take all three from shared memory instead.
struct Small {
  float d[4];
  float v;
  float4 dt;
};

#ifndef RR_HELPERS_ONLY  // read_copy.cu includes the helpers above, not the passes below

#ifndef RR_MIN_BLOCKS  // register budget of the non-flush pass: blocks of 4 warps per SM
#define RR_MIN_BLOCKS 4
#endif
#ifndef RR_FLUSH_MIN_BLOCKS  // the same for the flush pass (1: no cap)
#define RR_FLUSH_MIN_BLOCKS 1
#endif
#ifndef RR_STAGES  // non-flush pass: 0 = chunks double-buffered in registers; >= 2 = a cp.async ring of that many chunks per warp
#define RR_STAGES 0
#endif
#ifndef RR_FLUSH_STAGES  // the same for the flush pass
#define RR_FLUSH_STAGES 0
#endif
static_assert(RR_STAGES == 0 || (RR_STAGES >= 2 && RR_STAGES <= 6), "RR_STAGES is 0 or 2..6");
static_assert(RR_FLUSH_STAGES == 0 || (RR_FLUSH_STAGES >= 2 && RR_FLUSH_STAGES <= 6), "RR_FLUSH_STAGES is 0 or 2..6");
constexpr int CHUNK_F4 = ROWS * 32;  // one chunk of checkpoint rows (8 x 128 fp32), in float4
constexpr int STAGE_F4 = CHUNK_F4 + TILE_F4;  // one staged chunk of one warp: its rows, then its delta tile

// Dynamic shared memory per warp, in float4: the staged chunks of one pass.
__host__ __device__ constexpr int stages_of(bool flush) { return flush ? RR_FLUSH_STAGES : RR_STAGES; }
__host__ __device__ constexpr int smem_f4_per_warp(bool flush) { return stages_of(flush) * STAGE_F4; }

// Work unit u of P (row, value head) pairs -> (pair, part, parts): the unit streams V rows
// [part * V / parts, (part + 1) * V / parts) of the pair. tail == 0: every pair is `vsplit` units;
// tail > 0 (vsplit == 1): the first P - tail pairs are one unit each and the last `tail` pairs two
// halves each, so that the units left when the GPU runs out of work are short.
struct Unit {
  int pair, part, parts;
};
__device__ __forceinline__ Unit unit_of(int u, int P, int vsplit, int tail) {
  const int head = P - tail;
  if (u < head * vsplit) {
    const int pr = u / vsplit;
    return {pr, u - pr * vsplit, vsplit};
  }
  const int r = u - head;
  return {head + (r >> 1), r & 1, 2};
}

#ifndef RR_FUSED  // 1: also compile the one-launch kernel (both passes' work in one grid)
#define RR_FUSED 0
#endif
#ifndef RR_RING_MAP  // 1: the rings are indexed by ring_map[slot] (rings keyed by request row)
#define RR_RING_MAP 0
#endif
#ifndef RR_FUSED_MIN_BLOCKS  // its register budget (one for both kinds of items)
#define RR_FUSED_MIN_BLOCKS RR_MIN_BLOCKS
#endif

// The kernels' parameters (and the arguments forwarding them): the step's tensors, strides and sizes.
#define RR_KPARAMS                                                                                                 \
  const T *__restrict__ qkv, const T *__restrict__ a, const T *__restrict__ b, const float *__restrict__ A_log,    \
      const float *__restrict__ dt_bias, T *__restrict__ out, float *state, float *d_ring, float *k_ring,           \
      float *g_ring, const IDX *__restrict__ slots, const int32_t *__restrict__ write_pos,                          \
      const int32_t *__restrict__ force_flush, const int32_t *__restrict__ ring_map, float scale,                   \
      int64_t stride_qkv, int64_t stride_a, int64_t stride_b, int64_t stride_state, int64_t stride_d,             \
      int64_t stride_k, int64_t stride_g, int B, int H, int HV, int L, int vsplit
#define RR_KARGS                                                                                                   \
  qkv, a, b, A_log, dt_bias, out, state, d_ring, k_ring, g_ring, slots, write_pos, force_flush, ring_map, scale,    \
      stride_qkv, stride_a, stride_b, stride_state, stride_d, stride_k, stride_g, B, H, HV, L, vsplit

// One pass's work, as the blocks blk = 0 .. nblk - 1 of a grid region of nblk blocks do it.
// FLUSH = false: non-flush rows (output + ring record); FLUSH = true: flush rows (output + new checkpoint).
// Each unit (unit_of) is served by one warp; part 0 of a pair also writes the key / gate records.
template <typename T, typename IDX, bool KDA, bool L2N, bool FLUSH>
__device__ __forceinline__ void pass_body(RR_KPARAMS, int tail, int blk, int nblk) {
  extern __shared__ float4 smem[];
  __shared__ float4 dtile[4][2][TILE_F4];  // FLUSH, ST == 0: per warp, two buffers of the delta tile
  const int lane = threadIdx.x & 31;
  const int wib = threadIdx.x >> 5;
  const int items = B * HV * vsplit + tail;  // work units
  constexpr int ST = stages_of(FLUSH);  // staged chunks per warp (0: register double buffer)
  constexpr int STM = ST > 0 ? ST : 1;
  constexpr bool BULK = (FLUSH ? RR_FLUSH_BULK : RR_BULK) && ST > 0;
  // BULK: per warp, one completion barrier per staged chunk; bit b of `phases` is the parity the
  // next wait on barrier b expects (each barrier completes once per chunk it receives)
  __shared__ uint64_t bars[4][BULK ? STM : 1];
  unsigned phases = 0;
  if (BULK) {
    if (lane < STM) bar_init(&bars[wib][lane], 33);  // lane 0's bulk copy + each lane's cp.async
    bar_init_fence();
    __syncwarp();
  }

  // ---- one item: returns early for rows this pass does not serve
  auto item_fn = [&](int item) {
  const Unit un = unit_of(item, B * HV, vsplit, tail);
  const int pair = un.pair, part = un.part;
  const int n = pair / HV, hv = pair - n * HV;
  const int i_h = hv / (HV / H);
  const int64_t slot = static_cast<int64_t>(slots[n]);
  const int m = write_pos[n];
  const bool is_flush = (m == L - 1) || (force_flush != nullptr && force_flush[n] != 0);
  T* outp = out + (static_cast<int64_t>(n) * HV + hv) * V;
  if (slot < 0) {
    if (!FLUSH && part == 0) {
#pragma unroll
      for (int c = 0; c < 4; ++c) outp[4 * lane + c] = from_f<T>(0.f);
    }
    return;
  }
  if (is_flush != FLUSH) return;
#if RR_RING_MAP
  const int64_t ring = static_cast<int64_t>(ring_map[slot]);  // the ring row of this slot's records
#else
  const int64_t ring = slot;
#endif
  const int nvalid = m < L ? m : L;
  const bool in_ring = m < L;
  const int nch = V / ROWS / un.parts;  // chunks this warp streams
  const int vbeg = part * nch * ROWS;

  // ---- first chunks requested before the setup, so that their latency overlaps it
  const int s = lane & 3;             // which 4 records this lane folds into its row's read-out
  const int sigma = (lane >> 2) & 7;  // which row of each chunk this lane's read-out ends with
  const T* row = qkv + n * stride_qkv;
  float* sbase = state + slot * stride_state + static_cast<int64_t>(hv) * V * K + 4 * lane;
  const float* dring = d_ring + ring * stride_d + static_cast<int64_t>(hv) * L * V;
  const float* dptr = dring + (4 * s) * V + sigma;
  const T* vptr = row + 2 * H * K + hv * V + sigma;
  const int jt = nvalid - 4 * s;  // records t < jt of this lane's four are live
  // lane's 4 values of a chunk's delta tile: record lane/2, rows 4*(lane&1) .. +3 (copied by the
  // cp.async staging; ST == 0 FLUSH: loaded into registers)
  const int tj = lane >> 1;
  const float* tptr = dring + tj * V + 4 * (lane & 1);
  auto load_small = [&](Small& c, int v0) {
#pragma unroll
    for (int t = 0; t < 4; ++t) c.d[t] = (t < jt) ? dptr[t * V + v0] : 0.f;
    c.v = to_f(vptr[v0]);
    c.dt = (FLUSH && tj < nvalid) ? ld4(tptr + v0) : make_float4(0.f, 0.f, 0.f, 0.f);
  };
  float4* stage = smem + wib * smem_f4_per_warp(FLUSH);  // this warp's staged chunks
  auto issue = [&](int c) {  // ST > 0: stage chunk c: its rows (this warp's head) and its delta tile
    float4* buf = stage + (c % STM) * STAGE_F4;
    float* tile = reinterpret_cast<float*>(buf + CHUNK_F4);
    const int r0 = vbeg + c * ROWS;
    const float* src = sbase + static_cast<int64_t>(r0) * K;
    if (BULK) {  // the chunk's 8 rows are contiguous: one 4 KiB bulk copy
      if (lane == 0) bulk_load(buf, src - 4 * lane, ROWS * K * sizeof(float), &bars[wib][c % STM]);
    } else {
#pragma unroll
      for (int i = 0; i < ROWS; ++i) cp_async16(buf + i * 32 + lane, src + i * K);
    }
    if (tj < nvalid) cp_async16(reinterpret_cast<float4*>(tile + tile_at(tj) + 4 * (lane & 1)), tptr + r0);
    if (BULK) bar_arrive_cp_async(&bars[wib][c % STM]);  // the tile's copies complete on the same barrier
  };
  float4 ra[ROWS], rb[ROWS];  // ST == 0: the two register buffers
  auto load_regs = [&](float4 (&r)[ROWS], int c) {
#pragma unroll
    for (int i = 0; i < ROWS; ++i) r[i] = ld4_cs(sbase + static_cast<int64_t>(vbeg + c * ROWS + i) * K);
  };
  Small sa_;
  float vr[4];  // ST > 0: this step's v, element 32 r + lane in vr[r] (fp32)
  if constexpr (ST > 0) {
    __syncwarp();  // the previous item's reads of this warp's staged chunks and v are done
    // dead records stay zero in every stage's tile for this item (no copy writes them)
#pragma unroll
    for (int b = 0; b < STM; ++b) {
      float* tile = reinterpret_cast<float*>(stage + b * STAGE_F4 + CHUNK_F4);
#pragma unroll
      for (int e = lane; e < 16 * ROWS; e += 32)
        if ((e >> 3) >= nvalid) tile[tile_at(e >> 3) + (e & 7)] = 0.f;
    }
#pragma unroll
    for (int c = 0; c < ST - 1; ++c) {
      if (c < nch) issue(c);
      if (!BULK) cp_async_commit();
    }
#pragma unroll
    for (int r = 0; r < 4; ++r) vr[r] = to_f(row[2 * H * K + hv * V + 32 * r + lane]);
  } else {
    load_regs(ra, 0);
    load_small(sa_, vbeg);
  }

  Head h;
  head_setup<T, KDA, L2N, FLUSH>(h, row, a, b, A_log, dt_bias, k_ring, g_ring, ring, n, hv, i_h, nvalid, lane,
                                 scale, stride_a, stride_b, stride_k, stride_g, H, L);

  // ---- non-flush: this step's gate and key records (slot m: no read of this step touches it)
  if (!FLUSH && in_ring && part == 0) {
    if (!KDA) {
      if (lane == 0) g_ring[ring * stride_g + hv * L + m] = h.g_cur_s;
    } else {
      *reinterpret_cast<float4*>(g_ring + ring * stride_g + (static_cast<int64_t>(hv) * L + m) * K + 4 * lane) =
          h.g_cur4;
    }
    if (hv % (HV / H) == 0)
      *reinterpret_cast<float4*>(k_ring + ring * stride_k + (static_cast<int64_t>(i_h) * L + m) * K + 4 * lane) =
          h.k;
  }

  T* optr = outp + sigma;
  float* wptr = d_ring + ring * stride_d + (static_cast<int64_t>(hv) * L + m) * V + sigma;
  // tile: the chunk's delta tile (FLUSH only; dead records zero)
  auto chunk = [&](const float4 (&srows)[ROWS], const float (&d)[4], float v, const float* tile, int v0) {
    const float2 r = chunk_readout(srows, d, h, lane);
    const float dcur = h.beta * (v - r.y);
    if (s == 0) {
      optr[v0] = from_f<T>(fmaf(dcur, h.kq, r.x));
      if (!FLUSH && in_ring) wptr[v0] = dcur;
    }
    if (FLUSH) {
      // new rows: S . Diag(sa) + sum_j d_j fk_j^T + d_cur k^T, this lane's columns of all 8 rows
      float4 acc[ROWS];
#pragma unroll
      for (int i = 0; i < ROWS; ++i) {
        const float dci = __shfl_sync(FULL, dcur, 4 * i);  // lanes 4i..4i+3 hold row i
        acc[i] = make_float4(fmaf(dci, h.k.x, srows[i].x * h.sa.x), fmaf(dci, h.k.y, srows[i].y * h.sa.y),
                             fmaf(dci, h.k.z, srows[i].z * h.sa.z), fmaf(dci, h.k.w, srows[i].w * h.sa.w));
      }
      // dead records have zero factors and zero deltas, so only the record count's bound (8 or 16,
      // warp-uniform) branches: no per-record branch keeps the tile reads from being issued early
      if (nvalid > 8)
        fold_records<16>(acc, tile, h.fk);
      else
        fold_records<8>(acc, tile, h.fk);
#pragma unroll
      for (int i = 0; i < ROWS; ++i)  // one 16-byte store per row (streamed: not read again this step)
        __stcs(reinterpret_cast<float4*>(sbase + static_cast<int64_t>(v0 + i) * K), acc[i]);
    }
  };
  if constexpr (ST > 0) {
#pragma unroll 1
    for (int c = 0; c < nch; ++c) {
      __syncwarp();  // every lane is done with chunk c - 1's buffer, which is refilled next
      if (c + ST - 1 < nch) issue(c + ST - 1);
      if (BULK) {  // chunk c has landed (all of it)
        const int bi = c % STM;
        bar_wait(&bars[wib][bi], (phases >> bi) & 1u);
        phases ^= 1u << bi;
      } else {
        cp_async_commit();
        cp_async_wait<STM - 1>();  // chunk c has landed (this lane's copies) ...
        __syncwarp();              // ... and every lane's
      }
      const float4* buf = stage + (c % STM) * STAGE_F4;
      const float* tile = reinterpret_cast<const float*>(buf + CHUNK_F4);
#pragma unroll
      for (int i = 0; i < ROWS; ++i) ra[i] = buf[i * 32 + lane];
      float d[4];
#pragma unroll
      for (int t = 0; t < 4; ++t) d[t] = tile[tile_at(4 * s + t) + sigma];  // zero if dead
      // v at row v0 + sigma: register (v0 >> 5) (warp-uniform) of lane (v0 & 31) + sigma
      const int v0 = vbeg + c * ROWS, vreg = v0 >> 5;
      const float vsel = vreg == 0 ? vr[0] : vreg == 1 ? vr[1] : vreg == 2 ? vr[2] : vr[3];
      chunk(ra, d, __shfl_sync(FULL, vsel, (v0 & 31) + sigma), tile, v0);
    }
  } else {
    Small sb_;
    auto run = [&](const float4 (&r)[ROWS], const Small& c, int v0, int buf) {
      float* tile = reinterpret_cast<float*>(dtile[wib][buf]);
      if (FLUSH) {
        *reinterpret_cast<float4*>(tile + tile_at(tj) + 4 * (lane & 1)) = c.dt;
        __syncwarp();
      }
      chunk(r, c.d, c.v, tile, v0);
    };
#pragma unroll 1
    for (int c = 0; c < nch; c += 2) {
      load_regs(rb, c + 1);
      load_small(sb_, vbeg + (c + 1) * ROWS);
      run(ra, sa_, vbeg + c * ROWS, 0);
      if (c + 2 < nch) {
        load_regs(ra, c + 2);
        load_small(sa_, vbeg + (c + 2) * ROWS);
      }
      run(rb, sb_, vbeg + (c + 1) * ROWS, 1);
    }
  }
  };  // item_fn

  // ---- warp gw serves items gw, gw + tw, gw + 2 tw, ... (one item per warp unless the launch caps the grid)
  // The rows each of its items belongs to are read by the lanes at once and the items this pass
  // does not serve are dropped by a ballot, so a pass with nothing to do costs one short wave
  // instead of one wave of early exits per resident set of items.
  const int tw = nblk * (blockDim.x >> 5);
  const int gw = blk * (blockDim.x >> 5) + wib;
  for (int base = gw; base < items; base += 32 * tw) {  // one round unless items > 32 tw
    const int it = base + lane * tw;
    bool todo = false;
    if (it < items) {
      const int nn = unit_of(it, B * HV, vsplit, tail).pair / HV;
      const bool padded = slots[nn] < 0;
      const bool fl = (write_pos[nn] == L - 1) || (force_flush != nullptr && force_flush[nn] != 0);
      todo = FLUSH ? (!padded && fl) : (padded || !fl);
    }
    unsigned todo_mask = __ballot_sync(FULL, todo);
    while (todo_mask) {
      const int j = __ffs(todo_mask) - 1;
      todo_mask &= todo_mask - 1;
      item_fn(base + j * tw);
    }
  }
}

// One pass: FLUSH's rows, over the whole grid.
template <typename T, typename IDX, bool KDA, bool L2N, bool FLUSH>
__global__ void __launch_bounds__(128, FLUSH ? RR_FLUSH_MIN_BLOCKS : RR_MIN_BLOCKS)
    ring_step_kernel(RR_KPARAMS, int tail) {
  pass_body<T, IDX, KDA, L2N, FLUSH>(RR_KARGS, tail, blockIdx.x, gridDim.x);
}

#if RR_FUSED
// Both passes in one launch: blocks [0, flush_blocks) do the flush pass's work (dispatched first: the
// expensive items), the rest the non-flush pass's (with `tail`); each region scans every row and
// skips the other kind, so which rows flush stays on the device. Per item, the passes' code.
template <typename T, typename IDX, bool KDA, bool L2N>
__global__ void __launch_bounds__(128, RR_FUSED_MIN_BLOCKS) ring_fused_kernel(RR_KPARAMS, int tail, int flush_blocks) {
  if (static_cast<int>(blockIdx.x) < flush_blocks)
    pass_body<T, IDX, KDA, L2N, true>(RR_KARGS, 0, blockIdx.x, flush_blocks);
  else
    pass_body<T, IDX, KDA, L2N, false>(RR_KARGS, tail, blockIdx.x - flush_blocks, gridDim.x - flush_blocks);
}
#endif

// A pass's grid (blocks of `warps` warps) and its halved items (`tail_out`), given the blocks resident
// at once: tail: the last tail_quarters quarters of a resident set of warps' worth of pairs, halved;
// never pairs of the first resident set (a launch that fits in one set has no ragged end to shorten).
// waves = 0: one item per warp; else at most `waves` resident sets of blocks, each warp serving
// several items (but never more than 32 per ballot round).
inline int pass_grid(int B, int HV, int warps, int vsplit, int waves, int tail_quarters, int resident_blocks,
                     int* tail_out) {
  const int64_t pairs = static_cast<int64_t>(B) * HV;
  const int64_t resident_warps = static_cast<int64_t>(resident_blocks) * warps;
  int64_t tail = vsplit == 1 ? tail_quarters * resident_warps / 4 : 0;
  if (tail > pairs - resident_warps) tail = pairs > resident_warps ? pairs - resident_warps : 0;
  const int64_t items = pairs * vsplit + tail;
  const int64_t needed = (items + warps - 1) / warps;
  const int64_t cap = static_cast<int64_t>(waves) * resident_blocks;
  const int64_t ballot_min = ((items + 31) / 32 + warps - 1) / warps;
  int64_t grid = (waves == 0 || needed < cap) ? needed : cap;
  if (grid < ballot_min) grid = ballot_min;
  *tail_out = static_cast<int>(tail);
  return static_cast<int>(grid);
}

// `kern`'s blocks of `warps` warps resident on the device at once, with `smem` bytes of dynamic shared
// memory (raising the kernel's limit first when needed); host queries only, safe under graph capture.
template <typename Kern>
cudaError_t resident_of(Kern kern, int warps, size_t smem, size_t* smem_allowed, int* resident) {
  cudaError_t e = cudaSuccess;
  if (smem > *smem_allowed) {  // the static delta tile counts against the same 48 KiB default
    e = cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem));
    if (e == cudaSuccess) *smem_allowed = smem;
  }
  int dev = 0, sms = 0, per_sm = 0;
  if (e == cudaSuccess) e = cudaGetDevice(&dev);
  if (e == cudaSuccess) e = cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev);
  if (e == cudaSuccess) e = cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kern, 32 * warps, smem);
  if (e == cudaSuccess) *resident = sms * (per_sm > 0 ? per_sm : 1);
  return e;
}

template <typename T, typename IDX, bool KDA, bool L2N, bool FLUSH>
cudaError_t launch_t(const void* qkv, const void* a, const void* b, const float* A_log, const float* dt_bias,
                     void* out, float* state, float* d_ring, float* k_ring, float* g_ring, const void* slots,
                     const int32_t* write_pos, const int32_t* force_flush, const int32_t* ring_map, float scale,
                     const int64_t* strides, int B, int H, int HV, int L, int warps, int vsplit, int waves,
                     int tail_quarters, cudaStream_t stream) {
  const size_t smem = static_cast<size_t>(warps) * smem_f4_per_warp(FLUSH) * sizeof(float4);
  auto kern = ring_step_kernel<T, IDX, KDA, L2N, FLUSH>;
  // per instantiation and block size, computed once
  static int resident_blocks[5] = {0, 0, 0, 0, 0};
  static size_t smem_allowed = 0;  // the kernel's dynamic shared memory limit as last set (only raised)
  if (resident_blocks[warps] == 0) {
    const cudaError_t e = resident_of(kern, warps, smem, &smem_allowed, &resident_blocks[warps]);
    if (e != cudaSuccess) return e;
  }
  int tail = 0;
  const int blocks = pass_grid(B, HV, warps, vsplit, waves, tail_quarters, resident_blocks[warps], &tail);
  kern<<<blocks, 32 * warps, smem, stream>>>(
      static_cast<const T*>(qkv), static_cast<const T*>(a), static_cast<const T*>(b), A_log, dt_bias,
      static_cast<T*>(out), state, d_ring, k_ring, g_ring, static_cast<const IDX*>(slots), write_pos, force_flush,
      ring_map, scale, strides[0], strides[1], strides[2], strides[3], strides[4], strides[5], strides[6], B, H, HV,
      L, vsplit, tail);
  return cudaGetLastError();
}

#if RR_FUSED
// One launch of both passes' work: the flush region sized as the flush pass's grid (flush_waves,
// no tail), the non-flush region as the non-flush pass's (waves, tail_quarters), both with the
// fused kernel's residency.
template <typename T, typename IDX, bool KDA, bool L2N>
cudaError_t launch_t_fused(const void* qkv, const void* a, const void* b, const float* A_log, const float* dt_bias,
                           void* out, float* state, float* d_ring, float* k_ring, float* g_ring, const void* slots,
                           const int32_t* write_pos, const int32_t* force_flush, const int32_t* ring_map, float scale,
                           const int64_t* strides, int B, int H, int HV, int L, int warps, int vsplit, int waves,
                           int tail_quarters, int flush_waves, cudaStream_t stream) {
  const int f4 = smem_f4_per_warp(true) > smem_f4_per_warp(false) ? smem_f4_per_warp(true) : smem_f4_per_warp(false);
  const size_t smem = static_cast<size_t>(warps) * f4 * sizeof(float4);
  auto kern = ring_fused_kernel<T, IDX, KDA, L2N>;
  static int resident_blocks[5] = {0, 0, 0, 0, 0};
  static size_t smem_allowed = 0;
  if (resident_blocks[warps] == 0) {
    const cudaError_t e = resident_of(kern, warps, smem, &smem_allowed, &resident_blocks[warps]);
    if (e != cudaSuccess) return e;
  }
  int tail = 0, no_tail = 0;
  const int fblocks = pass_grid(B, HV, warps, vsplit, flush_waves, 0, resident_blocks[warps], &no_tail);
  const int nblocks = pass_grid(B, HV, warps, vsplit, waves, tail_quarters, resident_blocks[warps], &tail);
  kern<<<fblocks + nblocks, 32 * warps, smem, stream>>>(
      static_cast<const T*>(qkv), static_cast<const T*>(a), static_cast<const T*>(b), A_log, dt_bias,
      static_cast<T*>(out), state, d_ring, k_ring, g_ring, static_cast<const IDX*>(slots), write_pos, force_flush,
      ring_map, scale, strides[0], strides[1], strides[2], strides[3], strides[4], strides[5], strides[6], B, H, HV,
      L, vsplit, tail, fblocks);
  return cudaGetLastError();
}
#endif

template <typename T, typename IDX, bool FLUSH>
cudaError_t launch_kind(bool kda, bool l2n, const void* qkv, const void* a, const void* b, const float* A_log,
                        const float* dt_bias, void* out, float* state, float* d_ring, float* k_ring,
                        float* g_ring, const void* slots, const int32_t* write_pos, const int32_t* force_flush,
                        const int32_t* ring_map, float scale, const int64_t* strides, int B, int H, int HV, int L,
                        int warps, int vsplit, int waves, int tail_quarters, cudaStream_t stream) {
#define RR_ARGS qkv, a, b, A_log, dt_bias, out, state, d_ring, k_ring, g_ring, slots, write_pos, force_flush, \
                ring_map, scale, strides, B, H, HV, L, warps, vsplit, waves, tail_quarters, stream
  if (kda)
    return l2n ? launch_t<T, IDX, true, true, FLUSH>(RR_ARGS) : launch_t<T, IDX, true, false, FLUSH>(RR_ARGS);
  return l2n ? launch_t<T, IDX, false, true, FLUSH>(RR_ARGS) : launch_t<T, IDX, false, false, FLUSH>(RR_ARGS);
#undef RR_ARGS
}

#if RR_FUSED
template <typename T, typename IDX>
cudaError_t launch_kind_fused(bool kda, bool l2n, const void* qkv, const void* a, const void* b, const float* A_log,
                              const float* dt_bias, void* out, float* state, float* d_ring, float* k_ring,
                              float* g_ring, const void* slots, const int32_t* write_pos, const int32_t* force_flush,
                              const int32_t* ring_map, float scale, const int64_t* strides, int B, int H, int HV,
                              int L, int warps, int vsplit, int waves, int tail_quarters, int flush_waves,
                              cudaStream_t stream) {
#define RR_ARGS qkv, a, b, A_log, dt_bias, out, state, d_ring, k_ring, g_ring, slots, write_pos, force_flush, \
                ring_map, scale, strides, B, H, HV, L, warps, vsplit, waves, tail_quarters, flush_waves, stream
  if (kda)
    return l2n ? launch_t_fused<T, IDX, true, true>(RR_ARGS) : launch_t_fused<T, IDX, true, false>(RR_ARGS);
  return l2n ? launch_t_fused<T, IDX, false, true>(RR_ARGS) : launch_t_fused<T, IDX, false, false>(RR_ARGS);
#undef RR_ARGS
}
#endif

#endif  // RR_HELPERS_ONLY
}  // namespace
#ifndef RR_HELPERS_ONLY

// io_dtype: 0 = fp32, 1 = bf16; idx64: ssm_state_indices is int64; flush: 0 = the non-flush rows'
// pass (output + ring record), 1 = the flush rows' pass (output + new checkpoint). Returns a
// cudaError_t code.
extern "C" int ring_step_launch(const void* qkv, const void* a, const void* b, const float* A_log,
                                const float* dt_bias, void* out, float* state, float* d_ring, float* k_ring,
                                float* g_ring, const void* slots, const int32_t* write_pos,
                                const int32_t* force_flush, const int32_t* ring_map, float scale,
                                const int64_t* strides, int B, int H, int HV,
                                int L, int is_kda, int use_l2norm, int io_dtype, int idx64, int warps, int vsplit,
                                int waves, int tail_quarters, int flush, void* stream) {
  cudaStream_t st = static_cast<cudaStream_t>(stream);
#define RR_ARGS2 is_kda != 0, use_l2norm != 0, qkv, a, b, A_log, dt_bias, out, state, d_ring, k_ring, g_ring, slots, \
                 write_pos, force_flush, ring_map, scale, strides, B, H, HV, L, warps, vsplit, waves, tail_quarters, st
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

// Both passes in one launch (a build with RR_FUSED; cudaErrorNotSupported otherwise): the arguments of
// ring_step_launch, with the non-flush pass's waves / tail_quarters and the flush pass's flush_waves.
extern "C" int ring_step_launch_fused(const void* qkv, const void* a, const void* b, const float* A_log,
                                      const float* dt_bias, void* out, float* state, float* d_ring, float* k_ring,
                                      float* g_ring, const void* slots, const int32_t* write_pos,
                                      const int32_t* force_flush, const int32_t* ring_map, float scale,
                                      const int64_t* strides, int B, int H,
                                      int HV, int L, int is_kda, int use_l2norm, int io_dtype, int idx64, int warps,
                                      int vsplit, int waves, int tail_quarters, int flush_waves, void* stream) {
#if RR_FUSED
  cudaStream_t st = static_cast<cudaStream_t>(stream);
#define RR_ARGS2 is_kda != 0, use_l2norm != 0, qkv, a, b, A_log, dt_bias, out, state, d_ring, k_ring, g_ring, slots, \
                 write_pos, force_flush, ring_map, scale, strides, B, H, HV, L, warps, vsplit, waves, tail_quarters, \
                 flush_waves, st
  cudaError_t e;
  if (io_dtype == 1)
    e = idx64 ? launch_kind_fused<__nv_bfloat16, int64_t>(RR_ARGS2) : launch_kind_fused<__nv_bfloat16, int32_t>(RR_ARGS2);
  else
    e = idx64 ? launch_kind_fused<float, int64_t>(RR_ARGS2) : launch_kind_fused<float, int32_t>(RR_ARGS2);
#undef RR_ARGS2
  return static_cast<int>(e);
#else
  return static_cast<int>(cudaErrorNotSupported);
#endif
}

#endif  // RR_HELPERS_ONLY
