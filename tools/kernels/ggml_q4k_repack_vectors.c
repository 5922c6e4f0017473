// Golden outputs of llama.cpp's repacked Q4_K matmul (CPU_REPACK buffer, block_q4_Kx8 with
// ggml_gemm/gemv_q4_K_8x8_q8_K) for crates/xwen-kernels/tests/q4k_repack.rs. The weight goes
// through ggml's own repack buffer type (found via ggml_backend_dev_get_extra_bufts) and the
// product through the CPU backend's MUL_MAT, so the activation quantizers, token grouping
// (groups of 4 via gemm, the n % 4 tail via gemv) and float order are ggml's, not a copy.
// Valid for the ISA the build targets (x86 AVX2 here). Build and run:
//   LLAMA_CPP=<llama.cpp tree with build/> tools/kernels/make_q4k_repack_vectors.sh
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <math.h>
#include "ggml.h"
#include "ggml-alloc.h"
#include "ggml-backend.h"
#include "ggml-cpu.h"

static uint64_t rng = 0x2545F4914F6CDD1Dull;
static uint64_t next_u64(void) {
    rng ^= rng << 13; rng ^= rng >> 7; rng ^= rng << 17;
    return rng;
}
static float uniform(void) { return (float)((next_u64() >> 40) * (1.0 / 16777216.0)) * 2.0f - 1.0f; }

static void write_block(FILE * f, const char * tag, const void * p, size_t bytes) {
    uint32_t len = (uint32_t) bytes;
    fwrite(tag, 1, 4, f);
    fwrite(&len, 4, 1, f);
    fwrite(p, 1, bytes, f);
}

static ggml_backend_buffer_type_t repack_buft(void) {
    ggml_backend_dev_t dev = ggml_backend_dev_by_type(GGML_BACKEND_DEVICE_TYPE_CPU);
    ggml_backend_reg_t reg = ggml_backend_dev_backend_reg(dev);
    typedef ggml_backend_buffer_type_t * (*get_extra_t)(ggml_backend_dev_t);
    get_extra_t get = (get_extra_t) ggml_backend_reg_get_proc_address(reg, "ggml_backend_dev_get_extra_bufts");
    for (ggml_backend_buffer_type_t * b = get ? get(dev) : NULL; b && *b; b++) {
        if (strcmp(ggml_backend_buft_name(*b), "CPU_REPACK") == 0) return *b;
    }
    fprintf(stderr, "no CPU_REPACK buffer type\n");
    exit(1);
}

// One case: rows x n weight, n_tok activation rows; file <out>/ggml_q4k_repack_<tag>.bin with
// QW (Q4_K rows), X (f32 n_tok x n), Y (f32 n_tok x rows, ggml's MUL_MAT output).
static void run_case(const char * dir, int rows, int n, int n_tok, int n_threads) {
    float * wf = malloc(sizeof(float) * rows * n);
    float * x = malloc(sizeof(float) * n_tok * n);
    for (int i = 0; i < rows * n; i++) wf[i] = uniform() * (1.0f + (i / 256 % 5));
    for (int i = 0; i < n_tok * n; i++) {
        float s = powf(10.0f, 2.0f * uniform());
        x[i] = uniform() * s;
    }
    size_t rb = ggml_row_size(GGML_TYPE_Q4_K, n);
    void * wq = malloc(rb * rows);
    ggml_quantize_chunk(GGML_TYPE_Q4_K, wf, wq, 0, rows, n, NULL);

    struct ggml_init_params wp = { ggml_tensor_overhead() * 4, NULL, true };
    struct ggml_context * wctx = ggml_init(wp);
    struct ggml_tensor * w = ggml_new_tensor_2d(wctx, GGML_TYPE_Q4_K, n, rows);
    ggml_backend_buffer_t wbuf = ggml_backend_alloc_ctx_tensors_from_buft(wctx, repack_buft());
    ggml_backend_tensor_set(w, wq, 0, rb * rows);

    size_t mem = (size_t) n_tok * (n + rows) * sizeof(float) + ggml_graph_overhead() + ggml_tensor_overhead() * 8 + 1024 * 1024;
    struct ggml_init_params cp = { mem, NULL, false };
    struct ggml_context * ctx = ggml_init(cp);
    struct ggml_tensor * xt = ggml_new_tensor_2d(ctx, GGML_TYPE_F32, n, n_tok);
    memcpy(xt->data, x, sizeof(float) * n_tok * n);
    struct ggml_tensor * y = ggml_mul_mat(ctx, w, xt);
    struct ggml_cgraph * gf = ggml_new_graph(ctx);
    ggml_build_forward_expand(gf, y);
    ggml_backend_t be = ggml_backend_cpu_init();
    ggml_backend_cpu_set_n_threads(be, n_threads);
    if (ggml_backend_graph_compute(be, gf) != GGML_STATUS_SUCCESS) { fprintf(stderr, "compute failed\n"); exit(1); }

    char path[1024];
    snprintf(path, sizeof path, "%s/repack_q4k_r%d_n%d_t%d.bin", dir, rows, n, n_tok);
    FILE * f = fopen(path, "wb");
    uint32_t id = GGML_TYPE_Q4_K, nn = (uint32_t) n;
    fwrite("XWKV", 1, 4, f); fwrite(&id, 4, 1, f); fwrite(&nn, 4, 1, f);
    uint32_t shape[2] = { (uint32_t) rows, (uint32_t) n_tok };
    write_block(f, "SHAP", shape, sizeof shape);
    write_block(f, "QW  ", wq, rb * rows);
    write_block(f, "X   ", x, sizeof(float) * n_tok * n);
    write_block(f, "Y   ", y->data, sizeof(float) * n_tok * rows);
    fclose(f);
    printf("wrote %s\n", path);

    ggml_backend_free(be);
    ggml_free(ctx);
    ggml_backend_buffer_free(wbuf);
    ggml_free(wctx);
    free(wf); free(x); free(wq);
}

int main(int argc, char ** argv) {
    if (argc < 2) { fprintf(stderr, "usage: %s OUTDIR\n", argv[0]); return 1; }
    ggml_cpu_init();
    // 7 tokens: one gemm group of 4 and a gemv tail of 3; 1 token: gemv only.
    run_case(argv[1], 32, 1024, 7, 2);
    run_case(argv[1], 16, 512, 1, 1);
    run_case(argv[1], 24, 2048, 9, 2);
    return 0;
}
