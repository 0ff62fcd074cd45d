// The chunked gated delta rule: problem checks, workspace layout, launches and the C ABI
// (kernels/include/opslot_kernels/gated_delta_rule.h). The kernels are in gdr_kernels*.cuh.
#include "gdr_kernels.cuh"

namespace opslot::gdr {
namespace {

// Pointers into the caller's workspace: the chunk table, then the forward's u or the backward's
// arrays.
struct Workspace {
  ChunkInfo* table;
  int* seq_first;
  void *u, *kd, *qd;
  float *dvl, *dq, *dkp, *dA, *dgam, *dbp;
  void *dvt, *dw, *dh;
};

// Lays the workspace out from `base` (nullptr: sizes only); returns its size in bytes.
int64_t layout(const opslot_gdr_problem& p, int esize, bool backward, char* base, Workspace* ws) {
  int64_t off = 0;
  auto take = [&](int64_t bytes) {
    char* at = base == nullptr ? nullptr : base + off;
    off += (bytes + 255) / 256 * 256;
    return static_cast<void*>(at);
  };
  const int64_t tiles = p.max_chunks * p.heads, tile = kChunk * kD;
  Workspace w{};
  w.table = static_cast<ChunkInfo*>(take(p.max_chunks * static_cast<int64_t>(sizeof(ChunkInfo))));
  w.seq_first = static_cast<int*>(take((p.nseq + 1) * 4));
  if (!backward) w.u = take(tiles * tile * esize);
  w.kd = take(tiles * tile * esize);
  if (backward) {
    w.qd = take(tiles * tile * esize);
    w.dvl = static_cast<float*>(take(tiles * tile * 4));
    w.dvt = take(tiles * tile * esize);
    w.dq = static_cast<float*>(take(tiles * tile * 4));
    w.dkp = static_cast<float*>(take(tiles * tile * 4));
    w.dw = take(tiles * tile * esize);
    w.dA = static_cast<float*>(take(tiles * kChunk * kChunk * 4));
    w.dgam = static_cast<float*>(take(tiles * kChunk * 4));
    w.dbp = static_cast<float*>(take(tiles * kChunk * 4));
    w.dh = take(tiles * kD * kD * esize);
  }
  if (ws != nullptr) *ws = w;
  return off;
}

int esize_of(int dtype) { return dtype == OPSLOT_FLOAT32 ? 4 : 2; }

bool valid_dtype(int d) {
  return d == OPSLOT_FLOAT32 || d == OPSLOT_FLOAT16 || d == OPSLOT_BFLOAT16;
}

int64_t max_chunks(int64_t batch, int64_t seqlen, int64_t nseq, bool packed) {
  const int64_t per = (seqlen + kChunk - 1) / kChunk;
  return packed ? per + nseq : batch * per;
}

// OPSLOT_OK when the kernels can take the problem, else an error recorded for opslot_last_error().
int check_problem(const opslot_gdr_problem* p, const char* what) {
  if (p == nullptr) return set_error(OPSLOT_ERR_INVALID_ARGUMENT, "%s: no problem given", what);
  if (!valid_dtype(p->dtype) || !valid_dtype(p->g_dtype) || !valid_dtype(p->beta_dtype)) {
    return set_error(OPSLOT_ERR_INVALID_ARGUMENT, "%s: unknown dtype code (q %d, g %d, beta %d)",
                     what, p->dtype, p->g_dtype, p->beta_dtype);
  }
  if (p->batch < 0 || p->seqlen < 0 || p->heads < 1 || p->heads > 65535 ||
      p->seqlen >= (1LL << 30)) {
    return set_error(OPSLOT_ERR_INVALID_ARGUMENT,
                     "%s: bad shape batch %lld, seqlen %lld, heads %lld", what,
                     static_cast<long long>(p->batch), static_cast<long long>(p->seqlen),
                     static_cast<long long>(p->heads));
  }
  if (p->dk < 1 || p->dk > kD || p->dv < 1 || p->dv > kD) {
    return set_error(OPSLOT_ERR_UNSUPPORTED,
                     "%s: head dims Dk %lld, Dv %lld: this kernel takes 1..%d", what,
                     static_cast<long long>(p->dk), static_cast<long long>(p->dv), kD);
  }
  const bool packed = p->cu_seqlens != nullptr;
  if (packed ? (p->batch != 1 || p->nseq < 0) : p->nseq != p->batch) {
    return set_error(OPSLOT_ERR_INVALID_ARGUMENT, "%s: %s needs %s (batch %lld, nseq %lld)", what,
                     packed ? "cu_seqlens" : "a dense batch", packed ? "batch 1" : "nseq == batch",
                     static_cast<long long>(p->batch), static_cast<long long>(p->nseq));
  }
  if (p->max_chunks != max_chunks(p->batch, p->seqlen, p->nseq, packed) ||
      p->max_chunks >= (1LL << 31)) {
    return set_error(OPSLOT_ERR_INVALID_ARGUMENT,
                     "%s: max_chunks %lld is not opslot_gdr_max_chunks()", what,
                     static_cast<long long>(p->max_chunks));
  }
  if (p->max_chunks > 0 && (!p->q || !p->k || !p->v || !p->g || !p->beta)) {
    return set_error(OPSLOT_ERR_INVALID_ARGUMENT, "%s: null input pointer", what);
  }
  return OPSLOT_OK;
}

template <typename K>
int set_smem(K kernel, size_t bytes, const char* what) {
  const cudaError_t err = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                               static_cast<int>(bytes));
  if (err != cudaSuccess) {
    return set_error(static_cast<int>(err), "%s: %zu bytes of shared memory refused: %s", what,
                     bytes, cudaGetErrorString(err));
  }
  return OPSLOT_OK;
}

// Launches `kernel` on `grid` x `block` with `smem` dynamic bytes; OPSLOT_OK or the error.
template <typename K, typename... A>
int launch(const char* what, K kernel, dim3 grid, int block, size_t smem, cudaStream_t st,
           A... args) {
  if (grid.x == 0 || grid.y == 0 || grid.z == 0) return OPSLOT_OK;
  if (int rc = set_smem(kernel, smem, what)) return rc;
  kernel<<<grid, block, smem, st>>>(args...);
  return check_launch(what);
}

#define OPSLOT_TRY(x)              \
  do {                             \
    if (int rc_ = (x)) return rc_; \
  } while (0)

int chunk_table(const opslot_gdr_problem& p, const Workspace& w, cudaStream_t st) {
  return launch("gdr chunk table", chunk_table_kernel, dim3(1), kThreads, 0, st, p, w.table,
                w.seq_first);
}

// What the forward writes for the backward (Saved<T>) and the backward reads (Saved<const T>).
template <typename T>
struct Saved {
  T *hs, *vnew, *w;
  std::conditional_t<std::is_const_v<T>, const float*, float*> gamma;
};

template <typename T>
int forward(const opslot_gdr_problem& p, const float* s0, T* out, float* s_final,
            const Saved<T>& sv, const Workspace& w, cudaStream_t st) {
  const dim3 chunks(static_cast<unsigned>(p.max_chunks), static_cast<unsigned>(p.heads));
  const dim3 seqs(static_cast<unsigned>(p.nseq), static_cast<unsigned>(p.heads),
                  static_cast<unsigned>((p.dv + kStateCols - 1) / kStateCols));
  T* u = static_cast<T*>(w.u);
  T *hs = sv.hs, *vnew = sv.vnew;
  OPSLOT_TRY(chunk_table(p, w, st));
  T* kd = static_cast<T*>(w.kd);
  OPSLOT_TRY(launch("gdr prep", prep_kernel<T>, chunks, kThreads, prep_smem<T>(), st, p, w.table,
                    sv.w, u, sv.gamma, kd));
  OPSLOT_TRY(launch("gdr state", state_fwd_kernel<T>, seqs, kThreads, state_fwd_smem<T>(), st, p,
                    w.seq_first, static_cast<const T*>(sv.w), static_cast<const T*>(u),
                    static_cast<const float*>(sv.gamma), static_cast<const T*>(kd), s0, s_final, hs,
                    vnew));
  return launch("gdr output", output_kernel<T, false>, chunks, kThreads, output_smem<T>(), st, p,
                w.table, hs, vnew, static_cast<const T*>(nullptr), out,
                static_cast<float*>(nullptr));
}

struct Grads {
  void *dq, *dk, *dv, *dg, *dbeta;
  float* dinit;
};

template <typename T>
int backward(const opslot_gdr_problem& p, const T* dout, const float* dfinal,
             const Saved<const T>& sv, const Grads& g, const Workspace& w, cudaStream_t st) {
  const T *hs = sv.hs, *vnew = sv.vnew;
  const dim3 chunks(static_cast<unsigned>(p.max_chunks), static_cast<unsigned>(p.heads));
  const dim3 seqs(static_cast<unsigned>(p.nseq), static_cast<unsigned>(p.heads),
                  static_cast<unsigned>((p.dv + kStateCols - 1) / kStateCols));
  T* dh = static_cast<T*>(w.dh);
  OPSLOT_TRY(chunk_table(p, w, st));
  T *dvt = static_cast<T*>(w.dvt), *dw = static_cast<T*>(w.dw), *kd = static_cast<T*>(w.kd),
    *qd = static_cast<T*>(w.qd);
  OPSLOT_TRY(launch("gdr dv local", output_kernel<T, true>, chunks, kThreads, output_smem<T>(), st,
                    p, w.table, hs, vnew, dout, static_cast<T*>(nullptr), w.dvl));
  OPSLOT_TRY(launch("gdr decay qk", decay_qk_kernel<T>, chunks, kThreads, decay_qk_smem<T>(), st, p,
                    w.table, sv.gamma, kd, qd));
  OPSLOT_TRY(launch("gdr state bwd", state_bwd_kernel<T>, seqs, kThreads, state_bwd_smem<T>(), st,
                    p, w.table, w.seq_first, sv.w, sv.gamma, static_cast<const T*>(kd),
                    static_cast<const T*>(qd), dout, dfinal, g.dinit, dh,
                    static_cast<const float*>(w.dvl), dvt));
  OPSLOT_TRY(launch("gdr dqk", dqk_kernel<T>, chunks, kThreads, dqk_smem<T>(), st, p, w.table, hs,
                    vnew, static_cast<const T*>(dh), static_cast<const T*>(dvt), dout, w.dq, w.dkp,
                    dw, w.dgam));
  OPSLOT_TRY(launch("gdr wy", wy_kernel<T>, chunks, kThreads, wy_smem<T>(), st, p, w.table,
                    static_cast<const T*>(dvt), static_cast<const T*>(dw), w.dkp, w.dA, w.dgam,
                    w.dbp, static_cast<T*>(g.dv)));
  return launch("gdr finish", finish_kernel<T>, chunks, kThreads, finish_smem<T>(), st, p, w.table,
                static_cast<const float*>(w.dA), static_cast<const float*>(w.dq),
                static_cast<const float*>(w.dkp), static_cast<const float*>(w.dgam),
                static_cast<const float*>(w.dbp), static_cast<T*>(g.dq), static_cast<T*>(g.dk),
                g.dg, g.dbeta);
}

}  // namespace
}  // namespace opslot::gdr

using namespace opslot::gdr;

extern "C" {

OPSLOT_API int64_t opslot_gdr_max_chunks(int64_t batch, int64_t seqlen, int64_t nseq, int packed) {
  return max_chunks(batch, seqlen, nseq, packed != 0);
}

OPSLOT_API int64_t opslot_gdr_workspace_bytes(const opslot_gdr_problem* p, int backward) {
  if (check_problem(p, "opslot_gdr_workspace_bytes") != OPSLOT_OK) return -1;
  return layout(*p, esize_of(p->dtype), backward != 0, nullptr, nullptr);
}

OPSLOT_API int opslot_gdr_fwd(const opslot_gdr_problem* p, const float* initial_state, void* out,
                              float* final_state, void* h, void* v_new, void* w_out, float* gamma,
                              void* workspace, void* stream) {
  OPSLOT_TRY(check_problem(p, "opslot_gdr_fwd"));
  if (p->nseq == 0) return OPSLOT_OK;
  Workspace w;
  layout(*p, esize_of(p->dtype), false, static_cast<char*>(workspace), &w);
  const auto st = static_cast<cudaStream_t>(stream);
  return opslot::dispatch_dtype(p->dtype, "opslot_gdr_fwd", [&](auto t) {
    using T = decltype(t);
    const Saved<T> sv{static_cast<T*>(h), static_cast<T*>(v_new), static_cast<T*>(w_out), gamma};
    return forward<T>(*p, initial_state, static_cast<T*>(out), final_state, sv, w, st);
  });
}

OPSLOT_API int opslot_gdr_bwd(const opslot_gdr_problem* p, const void* dout,
                              const float* dfinal_state, const void* h, const void* v_new,
                              const void* w_in, const float* gamma, void* dq, void* dk, void* dv,
                              void* dg, void* dbeta, float* dinitial_state, void* workspace,
                              void* stream) {
  OPSLOT_TRY(check_problem(p, "opslot_gdr_bwd"));
  if (p->nseq == 0) return OPSLOT_OK;
  Workspace w;
  layout(*p, esize_of(p->dtype), true, static_cast<char*>(workspace), &w);
  const auto st = static_cast<cudaStream_t>(stream);
  const Grads g{dq, dk, dv, dg, dbeta, dinitial_state};
  return opslot::dispatch_dtype(p->dtype, "opslot_gdr_bwd", [&](auto t) {
    using T = decltype(t);
    const Saved<const T> sv{static_cast<const T*>(h), static_cast<const T*>(v_new),
                            static_cast<const T*>(w_in), gamma};
    return backward<T>(*p, static_cast<const T*>(dout), dfinal_state, sv, g, w, st);
  });
}

}  // extern "C"
