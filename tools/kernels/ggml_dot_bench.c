// Times ggml's own vec_dot kernels (this build's ISA) on an L2-resident weight block, in
// thread CPU time, so the figure is the kernel's compute cost rather than memory bandwidth
// or the load of a shared machine. Counterpart: matvec_bench --in-cache.
// Build: see tools/kernels/make_vectors.sh (same include and link lines).
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include "ggml.h"
#include "ggml-cpu.h"

static double cpu_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

int main(void) {
    ggml_cpu_init();
    const enum ggml_type types[] = { GGML_TYPE_Q4_K, GGML_TYPE_Q6_K, GGML_TYPE_Q8_0 };
    const int rows = 64, cols = 4096;
    float * x = malloc(sizeof(float) * rows * cols);
    for (int i = 0; i < rows * cols; i++) x[i] = (float)((i * 7919) % 1000) / 500.0f - 1.0f;
    for (int t = 0; t < 3; t++) {
        enum ggml_type ty = types[t];
        const struct ggml_type_traits_cpu * tc = ggml_get_type_traits_cpu(ty);
        size_t rb = ggml_row_size(ty, cols);
        char * w = malloc(rb * rows);
        ggml_quantize_chunk(ty, x, w, 0, rows, cols, NULL);
        char * a = malloc(ggml_row_size(tc->vec_dot_type, cols));
        ggml_get_type_traits_cpu(tc->vec_dot_type)->from_float(x, a, cols);
        volatile float sink = 0;
        long reps = 0;
        double t0 = cpu_now(), t1;
        do {
            for (int r = 0; r < rows; r++) {
                float s;
                tc->vec_dot(cols, &s, 0, w + r * rb, 0, a, 0, 1);
                sink += s;
            }
            reps++;
            t1 = cpu_now();
        } while (t1 - t0 < 1.5);
        double per_row = (t1 - t0) / (reps * rows);
        printf("ggml vec_dot %-5s in-cache %dx%d: %7.1f ns/row  %6.2f GB/s of weights (thread CPU time)\n",
               ggml_type_name(ty), rows, cols, per_row * 1e9, rb / per_row / 1e9);
        free(w); free(a);
    }
    return 0;
}
