/* Benchmark-only tuning knobs: exported by libopslot_kernels_bench.so only (CMake target
 * opslot_kernels_bench: the same sources compiled with -DOPSLOT_KERNELS_BENCH), never by
 * libopslot_kernels.so, the library opslot loads. In the production library every knob below is a
 * compile-time constant with the default value named here, and the kernel versions that only a knob
 * selects are not compiled. runtime/tests/test_kernel_library_symbols.py checks both.
 *
 * Each knob is process-wide mutable state of the bench library, not thread-safe: set it between
 * runs, never while another thread launches kernels. Each returns 0, or OPSLOT_ERR_INVALID_ARGUMENT
 * (or OPSLOT_ERR_UNSUPPORTED) with opslot_last_error() and the state unchanged.
 */
#ifndef OPSLOT_KERNELS_BENCH_H_
#define OPSLOT_KERNELS_BENCH_H_

#include "opslot_kernels/common.h"

#ifdef __cplusplus
extern "C" {
#endif

/* RMSNorm (changes the row-group count, so call it between runs): the number of 16-byte vectors per
 * thread the launch geometry aims at (default 2; version 3 takes 1 or 2), the resident waves of
 * their backward (default 1), and the kernel version (0, the default: version 3 where it applies —
 * 16-byte vectors, at most two per thread — else version 2 for the plain norms and 1 for the gated
 * norm; 3: one block per row, the next rows copied into a shared-memory ring with cp.async; 2: raw
 * registers and the next row prefetched; 1: fp32 registers, one row in flight). Versions 2 and 3
 * fall back to 2 / 1 where they do not apply. Version 2 of the gated norm and version 1 of the
 * plain norms exist only here. */
OPSLOT_API int opslot_rms_norm_set_tuning(int vectors_per_thread, int bwd_waves, int variant);

/* RMSNorm version 3's resident blocks per SM (0, the default: as many as fit; -1: a forward that is
 * not persistent, one row per block); skip_row_sums = 1, a diagnostic that leaves out version 3's
 * row sums (wrong results: it measures what the sums cost; only in a bench library built with the
 * CMake option OPSLOT_KERNELS_DIAGNOSTICS=ON, else OPSLOT_ERR_UNSUPPORTED); backward_from_start =
 * 1: version 3's backward takes the rows in order (the default walks them from the last row, which
 * the producer of dy wrote last). */
OPSLOT_API int opslot_rms_norm_set_experiment(int pipe_blocks_per_sm, int skip_row_sums,
                                              int backward_from_start);

/* RoPE: spread_pass_through 1 (default) spreads the pass-through part of a partial rotation over
 * the pair slots, 0 gives each pass-through 16-byte vector its own thread (the first layout);
 * loop_heads 1 lets a thread rotate up to 8 heads of one position with one load of cos/sin (the
 * head-loop kernels exist only here), 0 (default: measured faster, docs/results/kernels_h200.md)
 * gives each row its own threads. */
OPSLOT_API int opslot_rope_set_tuning(int spread_pass_through, int loop_heads);

/* SiLU-mul: 16-byte vectors per thread and tensor (1, 2 or 4; default 1; 2 and 4 exist only here),
 * and the backward's order (backward_from_start = 1: in index order; 0, the default: from the end,
 * where what the producer of grad wrote last is most likely still in L2). */
OPSLOT_API int opslot_silu_mul_set_tuning(int vectors_per_thread, int backward_from_start);

/* Load-balancing loss: which kernels run. forward_path 0 = automatic (the default: the warp-per-row
 * forward where eligible: 16-bit logits, 64/128/256 experts, 1 <= top_k <= 16, rows aligned to a
 * lane's values; else the tile forward; else the general one), 1 = the tile forward where
 * eligible, 2 = the general forward; backward_path 0 = automatic (the warp backward for 8, 16 or
 * 32 lanes of 16-byte vectors per row), 1 = the general backward. Every path is also the default
 * for some inputs: the production library has the same kernels, only not this switch. */
OPSLOT_API int opslot_load_balancing_set_tuning(int forward_path, int backward_path);

/* mhc/pre and mhc/head. hold_max_threads: the forward holds a token's streams in registers
 * between the sum of squares and the collapse when its block has at most this many threads (64,
 * 128 or 256) and 4 16-byte vectors per stream and thread cover the row; 0 (the default): never,
 * the row is read again (from L2). Results are bitwise the same either way. dx_version: 1 (the
 * default) the production backward (opslot_mhc_dx_dfn where it fits, else opslot_mhc_dx's
 * production configuration and the d fn GEMM); 2 to 12 turn opslot_mhc_dx_dfn off and run the
 * CUDA-core dx variants (kernels/src/mhc.cu, launch_dx_variant; all the same bits, 11 the
 * production one) with the d fn GEMM; 13 and 14 run opslot_mhc_dx_dfn's mma.sync kernel
 * (dx_dfn_kernel) with a 2-deep / a 4-deep ring, 15 with its production 3-deep ring (all three the
 * same bits; 15 is the production kernel on GPUs other than compute capability 9.0); 16 and 17 run
 * the warpgroup-MMA kernel (dx_dfn_wgmma_kernel; production on compute capability 9.0: two
 * warpgroups per block, a 2-deep ring each) with one warpgroup per block, a 2-deep ring and 3
 * blocks per SM / a 3-deep ring and 2 (the same bits as each other; dx also as production's, whose
 * d fn sums the tokens in another order; compute capability 9.0 only, elsewhere the call fails). */
OPSLOT_API int opslot_mhc_set_tuning(int hold_max_threads, int dx_version);

/* mhc/pre's and mhc/head's forward collapse (opslot_mhc_collapse_fwd, 16-byte rows, rows not held):
 * threads per block, a multiple of 32 up to 1024; 0 (the default) the production choice. */
OPSLOT_API int opslot_mhc_collapse_set_tuning(int threads);

/* The forms of mhc's token kernels: collapse_form 1 runs opslot_mhc_collapse_fwd's collapse as a
 * block a token, 2 as blocks that walk the tokens with the next token's row in flight (16-byte rows
 * of up to two vectors per stream and thread; the same bits); comb_form 1 runs opslot_mhc_comb_fwd
 * / _bwd as a thread a token, 2 as a lane a matrix entry (the same bits); 0 (the default) the
 * production form of each. */
OPSLOT_API int opslot_mhc_forms_set_tuning(int collapse_form, int comb_form);

/* opslot_topk_indices's kernel (kernels/src/topk.cu): path 0 (the default) the production choice
 * (opslot_kernels/topk.h); 1 the long-row kernel for every row; 2 no warp kernel: the block
 * register kernel for rows of up to 4096 columns, one launch, 512-thread long-row blocks above; 3
 * the production choice with the long-row kernel's one-read pass off (its two-read path for every
 * row it takes); 4 the long-row kernel for every row, its one-read pass off; 5 the one-read pass on
 * rows of any length (production: longer than 16384 columns); 6 the choice of commit 5cb1570 on
 * rows of 2049 to 16384 columns (the block register kernel up to 4096, 512-thread long-row blocks
 * above). Paths 7 to 12 are the production choice but for one kernel: 7 two warps a row on rows of
 * 2049 to 4096 columns with a mask too (production: without one), 8 four there; 9 two warps a row
 * on rows of 1025 to 2048 columns; 10 256-thread long-row blocks on rows of 4097 to 8192 columns
 * (production: four warps a row); 11 eight warps a row on rows of 8193 to 16384 columns
 * (production: 256-thread long-row blocks); 12 the one-read pass asking L2 for the round after next
 * instead of the next; 13 (an experiment) the one-read pass with its first threshold given per row
 * by opslot_topk_set_hint instead of its first round's select (a row whose hint leaves it fewer
 * than k candidates takes the two-read path); 14 the same in 256-thread blocks (three an SM, 7168
 * candidates; production's rows of more than 16384 columns take 512); 15 (an experiment) the
 * one-read pass with its first threshold at a sampled rank of its first round's keys (f m + 4
 * sqrt(f m) + 4, f = k / n, m the round's keys) instead of k, lowered to production's where it
 * proves too high (kernels/src/topk_long.cuh, Start: kSample); 16 the same in 256-thread blocks.
 * All give the same bits. */
OPSLOT_API int opslot_topk_set_tuning(int path);

/* Paths 13 and 14's thresholds: lo[r] (device memory, one a row of the next calls' [batch * seq]
 * rows) the order key (kernels/src/topk_select.cuh, order_key) from which row r's one-read pass
 * keeps candidates. */
OPSLOT_API int opslot_topk_set_hint(const uint32_t* lo);

/* Where the long-row top-k kernel's one-read pass spends its time (kernels/src/topk_long.cuh,
 * PhaseClock): reset 1 clears the counters; reset 0 copies them to out[10]: the clock cycles of
 * the block's first thread summed over rows in 0 the first round's threshold, 1 the rounds, 2 the
 * cuts of the candidates, 3 the select, 4 the write; then 5 rows, 6 cuts and 7 rounds counted, 8
 * rows whose sampled threshold was lowered (their rounds read again), 9 rows the pass handed to
 * the two-read path. */
OPSLOT_API int opslot_topk_probe_phases(unsigned long long* out, int reset);

/* The lightning indexer's scores (opslot_dsa_index_scores) on 16-bit inputs where production runs
 * the warpgroup-MMA kernel (kernels/src/dsa_indexer90.cuh: compute capability 9.0, head dims of 113
 * to 128, 16, 32, 64 or 128 padded heads): kernel 1 runs the mma.sync kernel
 * (kernels/src/dsa_indexer_mma.cuh) instead, 2 to 4 the warpgroup-MMA kernel with that many
 * warpgroups (query blocks) a CTA; 0 (the default) production's choice. The same products in the
 * same order: the same bits whichever runs. */
OPSLOT_API int opslot_dsa_scores_set_tuning(int kernel);

/* Sparse MQA attention's kernels where the warpgroup-MMA ones apply (compute capability 9.0, dv
 * 512, rows that allow 16-byte copies; the backward bf16 only): mma_sync bit 0 runs the mma.sync
 * forward there, bit 1 the mma.sync backward (the sm_80 paths, for side-by-side runs and their
 * tests on an H200; the same bits either way); 0 (the default) the wgmma kernels. */
OPSLOT_API int opslot_sparse_mqa_set_tuning(int mma_sync);

#ifdef __cplusplus
}
#endif

#endif /* OPSLOT_KERNELS_BENCH_H_ */
