// ggml's own MUL_MAT (matrix x vector, n = 1) through ggml_graph_compute with a chosen
// thread count: the side-by-side for matvec_bench. Weights live in a plain CPU context (no
// CPU_REPACK buffer), so Q4_K runs ggml_vec_dot_q4_K_q8_K, not the repacked 8x8 GEMV that
// llama.cpp uses for Q4_K matrices with rows % 8 == 0.
// Usage: ggml_matvec_bench ROWS COLS THREADS
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

int main(int argc, char ** argv) {
    if (argc < 4) { fprintf(stderr, "usage: %s ROWS COLS THREADS\n", argv[0]); return 1; }
    const int rows = atoi(argv[1]), cols = atoi(argv[2]), nth = atoi(argv[3]);
    ggml_cpu_init();
    const enum ggml_type types[] = { GGML_TYPE_Q4_K, GGML_TYPE_Q6_K, GGML_TYPE_Q8_0 };
    float * row = malloc(sizeof(float) * cols);
    for (int t = 0; t < 3; t++) {
        enum ggml_type ty = types[t];
        size_t wbytes = ggml_row_size(ty, cols) * rows;
        struct ggml_init_params ip = { wbytes + 16u * 1024 * 1024, NULL, false };
        struct ggml_context * ctx = ggml_init(ip);
        struct ggml_tensor * a = ggml_new_tensor_2d(ctx, ty, cols, rows);
        struct ggml_tensor * b = ggml_new_tensor_2d(ctx, GGML_TYPE_F32, cols, 1);
        for (int r = 0; r < rows; r++) {
            for (int i = 0; i < cols; i++) row[i] = (float)(((r * 31 + i) * 7919) % 1000) / 500.0f - 1.0f;
            ggml_quantize_chunk(ty, row, (char *) a->data + (size_t) r * ggml_row_size(ty, cols), 0, 1, cols, NULL);
        }
        for (int i = 0; i < cols; i++) ((float *) b->data)[i] = (float)((i * 7919) % 1000) / 500.0f - 1.0f;
        struct ggml_tensor * c = ggml_mul_mat(ctx, a, b);
        struct ggml_cgraph * gf = ggml_new_graph(ctx);
        ggml_build_forward_expand(gf, c);
        struct ggml_cplan cplan = ggml_graph_plan(gf, nth, NULL);
        cplan.work_data = malloc(cplan.work_size);
        ggml_graph_compute(gf, &cplan); // warm-up
        long reps = 0;
        double t0 = now(), t1;
        do { ggml_graph_compute(gf, &cplan); reps++; t1 = now(); } while (t1 - t0 < 1.5);
        free(cplan.work_data);
        double per = (t1 - t0) / reps;
        printf("ggml matvec %-5s %dx%d %d thread(s): %9.1f us  %6.2f GB/s weights\n",
               ggml_type_name(ty), rows, cols, nth, per * 1e6, wbytes / per / 1e9);
        ggml_free(ctx);
    }
    return 0;
}
