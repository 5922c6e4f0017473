// ggml's own MUL_MAT with n tokens (prefill) through ggml_graph_compute: the side-by-side for
// crates/xwen-kernels/examples/matmul_bench.rs. Weights live in a plain CPU context (no
// CPU_REPACK buffer): Q8_0 runs llamafile's tinyBLAS as in llama.cpp; Q4_K/Q6_K run the
// b11434 tiled kernel (llama.cpp itself repacks Q4_K matrices with rows % 8 == 0 instead).
// Usage: ggml_matmul_bench ROWS COLS NTOK THREADS
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include "ggml.h"
#include "ggml-cpu.h"

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

// CPU time of the calling thread: with THREADS = 1 ggml computes on the caller, so this does
// not count time a neighbour takes the core away.
static double cpu(void) {
    struct timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

int main(int argc, char ** argv) {
    if (argc < 5) { fprintf(stderr, "usage: %s ROWS COLS NTOK THREADS\n", argv[0]); return 1; }
    const int rows = atoi(argv[1]), cols = atoi(argv[2]), ntok = atoi(argv[3]), nth = atoi(argv[4]);
    ggml_cpu_init();
    const enum ggml_type types[] = { GGML_TYPE_Q8_0, GGML_TYPE_Q4_K, GGML_TYPE_Q6_K };
    float * row = malloc(sizeof(float) * cols);
    for (int t = 0; t < 3; t++) {
        enum ggml_type ty = types[t];
        size_t wbytes = ggml_row_size(ty, cols) * rows;
        struct ggml_init_params ip = { wbytes + (size_t) ntok * cols * 8 + 64u * 1024 * 1024, NULL, false };
        struct ggml_context * ctx = ggml_init(ip);
        struct ggml_tensor * a = ggml_new_tensor_2d(ctx, ty, cols, rows);
        struct ggml_tensor * b = ggml_new_tensor_2d(ctx, GGML_TYPE_F32, cols, ntok);
        for (int r = 0; r < rows; r++) {
            for (int i = 0; i < cols; i++) row[i] = (float)(((r * 31 + i) * 7919) % 1000) / 5000.0f - 0.1f;
            ggml_quantize_chunk(ty, row, (char *) a->data + (size_t) r * ggml_row_size(ty, cols), 0, 1, cols, NULL);
        }
        for (long i = 0; i < (long) cols * ntok; i++) ((float *) b->data)[i] = (float)((i * 7919) % 1000) / 500.0f - 1.0f;
        struct ggml_tensor * c = ggml_mul_mat(ctx, a, b);
        struct ggml_cgraph * gf = ggml_new_graph(ctx);
        ggml_build_forward_expand(gf, c);
        struct ggml_cplan cplan = ggml_graph_plan(gf, nth, NULL);
        cplan.work_data = malloc(cplan.work_size);
        ggml_graph_compute(gf, &cplan); // warm-up
        double best = 1e9, best_cpu = 1e9;
        for (int rep = 0; rep < 5; rep++) {
            double t0 = now(), c0 = cpu();
            ggml_graph_compute(gf, &cplan);
            double d = now() - t0, dc = cpu() - c0;
            if (d < best) best = d;
            if (dc < best_cpu) best_cpu = dc;
        }
        free(cplan.work_data);
        printf("ggml %s %dx%d x %d tok, %d thr: %.1f ms, %.1f GMAC/s (calling thread's CPU time: %.1f ms, %.1f GMAC/s)\n",
               ggml_type_name(ty), rows, cols, ntok, nth, best * 1e3, (double) rows * cols * ntok / best / 1e9,
               best_cpu * 1e3, (double) rows * cols * ntok / best_cpu / 1e9);
        ggml_free(ctx);
    }
    return 0;
}
