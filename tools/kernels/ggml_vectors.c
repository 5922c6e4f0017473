// Writes ground-truth vectors for crates/xwen-kernels from llama.cpp's own ggml libraries:
// reference quantizers (ggml-base), dequantization, the CPU backend's activation quantizers
// (ggml-cpu, this machine's ISA), the x86 4-row Q8_K repack quantizer, and ggml's vec_dot.
// Build and run: tools/kernels/make_vectors.sh (needs a llama.cpp build tree).
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <math.h>
#include "ggml.h"
#include "ggml-cpu.h"

// Internal to ggml-cpu (repack.h); exported from the static library.
void ggml_quantize_mat_q8_K_4x8(const float * x, void * vy, int64_t k);
// ggml-quants.h (ggml-base); Q8_K has no entry in the public type traits.
void quantize_row_q8_K_ref(const float * x, void * y, int64_t k);
void dequantize_row_q8_K(const void * x, float * y, int64_t k);

static uint64_t rng = 0x9E3779B97F4A7C15ull;
static uint64_t next_u64(void) {
    rng ^= rng << 13; rng ^= rng >> 7; rng ^= rng << 17;
    return rng;
}
static float uniform(void) { return (float)((next_u64() >> 40) * (1.0 / 16777216.0)) * 2.0f - 1.0f; }
static float gauss(void) { float s = 0; for (int i = 0; i < 6; i++) s += uniform(); return s * 0.7f; }

// n floats with a mix of shapes per 32-element stretch (see case comments).
static void fill_input(float * x, int n) {
    for (int b = 0; b < n / 32; b++) {
        float * xb = x + 32 * b;
        int kind = b % 8;
        float scale = powf(10.0f, 3.0f * uniform());
        for (int j = 0; j < 32; j++) xb[j] = gauss() * scale;
        switch (kind) {
            case 1: for (int j = 0; j < 32; j++) xb[j] = 0.0f; break;                  // all zero
            case 2: xb[5] = 4.0f * scale; xb[20] = -4.0f * scale; break;                  // +/- amax tie
            case 3: xb[7] = -4.0f * scale; xb[9] = 4.0f * scale; break;                   // -/+ tie, negative first
            case 4: for (int j = 0; j < 32; j++) xb[j] = (float)((int)(uniform() * 120)) + 0.5f;
                    xb[0] = 127.0f; break;                                               // halfway cases for Q8 rounding
            case 5: for (int j = 0; j < 32; j++) xb[j] *= 1e-6f; break;                  // tiny (f16 subnormal scales)
            case 6: xb[3] = 30.0f * scale; break;                                         // outlier
            default: break;
        }
    }
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
    const enum ggml_type types[] = {
        GGML_TYPE_F16, GGML_TYPE_BF16, GGML_TYPE_Q4_0, GGML_TYPE_Q4_1, GGML_TYPE_Q5_0, GGML_TYPE_Q5_1,
        GGML_TYPE_Q8_0, GGML_TYPE_Q2_K, GGML_TYPE_Q3_K, GGML_TYPE_Q4_K, GGML_TYPE_Q5_K, GGML_TYPE_Q6_K,
        GGML_TYPE_IQ4_NL, GGML_TYPE_IQ4_XS, GGML_TYPE_Q8_K, GGML_TYPE_Q8_1,
    };
    const int n = 1024;
    float * x = malloc(n * sizeof(float));
    float * y = malloc(n * sizeof(float));
    float * xa = malloc(n * sizeof(float));
    char path[1024];
    for (size_t t = 0; t < sizeof(types) / sizeof(types[0]); t++) {
        enum ggml_type ty = types[t];
        const struct ggml_type_traits * tr = ggml_get_type_traits(ty);
        const struct ggml_type_traits_cpu * tc = ggml_get_type_traits_cpu(ty);
        size_t rb = ggml_row_size(ty, n);
        void * q = calloc(1, rb);
        fill_input(x, n);
        fill_input(xa, n);
        // Reference quantizer (what llama-quantize uses without an imatrix) and dequantization.
        if (ty == GGML_TYPE_Q8_K) {
            quantize_row_q8_K_ref(x, q, n);
        } else if (ty == GGML_TYPE_Q8_1) {
            tr->from_float_ref(x, q, n);
        } else {
            ggml_quantize_chunk(ty, x, q, 0, 1, n, NULL);
        }
        if (ty == GGML_TYPE_Q8_K) dequantize_row_q8_K(q, y, n);
        else if (tr->to_float) tr->to_float(q, y, n);
        snprintf(path, sizeof path, "%s/ggml_%s.bin", argv[1], ggml_type_name(ty));
        FILE * f = fopen(path, "wb");
        uint32_t id = ty, nn = n;
        fwrite("XWKV", 1, 4, f); fwrite(&id, 4, 1, f); fwrite(&nn, 4, 1, f);
        write_block(f, "INPT", x, n * sizeof(float));
        write_block(f, "QREF", q, rb);
        if (ty == GGML_TYPE_Q8_K || tr->to_float) write_block(f, "DEQ ", y, n * sizeof(float));
        if (tc->vec_dot && ty != GGML_TYPE_Q8_1) {
            enum ggml_type vt = tc->vec_dot_type;
            size_t arb = ggml_row_size(vt, n);
            void * a = calloc(1, arb);
            ggml_get_type_traits_cpu(vt)->from_float(xa, a, n);
            float s = 0;
            tc->vec_dot(n, &s, 0, q, 0, a, 0, 1);
            write_block(f, "ACTX", xa, n * sizeof(float));
            write_block(f, "ACTQ", a, arb);
            write_block(f, "DOT ", &s, sizeof s);
            free(a);
        }
        if (ty == GGML_TYPE_Q8_K) {
            // 4 rows through the x86 4x8 repack quantizer, de-interleaved to plain block_q8_K rows.
            const int k = 256;
            float rows[4 * 256];
            for (int r = 0; r < 4; r++) memcpy(rows + r * k, x + r * k, k * sizeof(float));
            struct { float d[4]; int8_t qs[1024]; int16_t bsums[64]; } blk;
            ggml_quantize_mat_q8_K_4x8(rows, &blk, k);
            struct { float d; int8_t qs[256]; int16_t bsums[16]; } out[4];
            int set[4][16] = {{0}};
            for (int j = 0; j < 1024; j++) {
                int src_offset = (j / 32) * 8 + (j % 8);
                int src_id = (j % 32) / 8;
                int index = (((j & 31) >> 3) << 2) + ((j >> 8) << 4) + ((j >> 6) & 3);
                out[src_id].qs[src_offset] = blk.qs[j];
                int g = src_offset / 16;
                if (set[src_id][g] == 0) { out[src_id].bsums[g] = blk.bsums[index]; set[src_id][g] = 1; }
            }
            for (int r = 0; r < 4; r++) {
                out[r].d = blk.d[r];
                for (int g = 0; g < 16; g++) {
                    int s = 0; for (int l = 0; l < 16; l++) s += out[r].qs[16 * g + l];
                    if (s != out[r].bsums[g]) { fprintf(stderr, "bsum map mismatch r%d g%d\n", r, g); return 1; }
                }
            }
            write_block(f, "RP4X", out, sizeof out);
        }
        fclose(f);
        free(q);
    }
    printf("wrote vectors to %s\n", argv[1]);
    return 0;
}
