// Writes many-row vec_dot goldens for the K-quants from ggml's CPU backend (this machine's ISA,
// here AVX2): one Q8_K activation row against `rows` weight rows of n = 4096, so float-order
// differences that a single 4-block dot can hide (ggml_vectors.c) show up.
// Build and run: tools/kernels/make_kdot_vectors.sh (needs a llama.cpp build tree).
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <math.h>
#include "ggml.h"
#include "ggml-cpu.h"

static uint64_t rng = 0x243F6A8885A308D3ull;
static uint64_t next_u64(void) {
    rng ^= rng << 13; rng ^= rng >> 7; rng ^= rng << 17;
    return rng;
}
static float uniform(void) { return (float)((next_u64() >> 40) * (1.0 / 16777216.0)) * 2.0f - 1.0f; }
static float gauss(void) { float s = 0; for (int i = 0; i < 6; i++) s += uniform(); return s * 0.7f; }

// Weight-like rows: per-row scale spread over decades, a few outliers, a mean offset on some
// rows so the dmin (bsums) term matters.
static void fill(float * x, int n) {
    float scale = powf(10.0f, 2.0f * uniform() - 2.0f);
    float mean = (next_u64() & 1) ? 0.3f * scale * uniform() : 0.0f;
    for (int j = 0; j < n; j++) x[j] = mean + gauss() * scale;
    for (int k = 0; k < 4; k++) x[next_u64() % n] = 8.0f * scale * uniform();
}

static void write_block(FILE * f, const char * tag, const void * p, size_t bytes) {
    uint32_t len = (uint32_t) bytes;
    fwrite(tag, 1, 4, f);
    fwrite(&len, 4, 1, f);
    fwrite(p, 1, bytes, f);
}

int main(int argc, char ** argv) {
    if (argc < 2) { fprintf(stderr, "usage: %s OUTDIR\n", argv[0]); return 1; }
    ggml_cpu_init();
    const enum ggml_type types[] = { GGML_TYPE_Q3_K, GGML_TYPE_Q4_K, GGML_TYPE_Q5_K, GGML_TYPE_Q6_K };
    const int n = 4096, rows = 48;
    float * x = malloc((size_t) n * sizeof(float));
    char path[1024];
    for (size_t t = 0; t < sizeof(types) / sizeof(types[0]); t++) {
        enum ggml_type ty = types[t];
        const struct ggml_type_traits_cpu * tc = ggml_get_type_traits_cpu(ty);
        size_t rb = ggml_row_size(ty, n);
        char * q = calloc(rows, rb);
        for (int r = 0; r < rows; r++) {
            fill(x, n);
            ggml_quantize_chunk(ty, x, q + r * rb, 0, 1, n, NULL);
        }
        enum ggml_type vt = tc->vec_dot_type;
        size_t arb = ggml_row_size(vt, n);
        void * a = calloc(1, arb);
        for (int j = 0; j < n; j++) x[j] = gauss() * (j % 97 == 0 ? 20.0f : 1.0f);
        ggml_get_type_traits_cpu(vt)->from_float(x, a, n);
        float * s = calloc(rows, sizeof(float));
        for (int r = 0; r < rows; r++) tc->vec_dot(n, s + r, 0, q + r * rb, 0, a, 0, 1);
        snprintf(path, sizeof path, "%s/kdot_%s.bin", argv[1], ggml_type_name(ty));
        FILE * f = fopen(path, "wb");
        uint32_t id = ty, nn = n;
        fwrite("XWKV", 1, 4, f); fwrite(&id, 4, 1, f); fwrite(&nn, 4, 1, f);
        write_block(f, "QREF", q, rows * rb);
        write_block(f, "ACTQ", a, arb);
        write_block(f, "DOTS", s, rows * sizeof(float));
        fclose(f);
        free(q); free(a); free(s);
    }
    free(x);
    return 0;
}
