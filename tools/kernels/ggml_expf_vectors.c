// Golden values for crates/xwen-kernels/src/f32ops (ggml-exact SiLU, SwiGLU and softmax), taken
// from llama.cpp's own compiled CPU backend rather than from a copy of its code: the exported
// vec.cpp functions ggml_vec_silu_f32 / ggml_vec_swiglu_f32 / ggml_vec_soft_max_f32 and the
// GGML_OP_SOFT_MAX op run through a one-node graph. The results are those of the ISA the
// llama.cpp build targets (GGML_NATIVE; on an AVX2+FMA machine without AVX-512 that is vec.h's
// 8-lane `__AVX2__ && __FMA__` ggml_v_expf), so regenerate on such a machine.
// Build and run: tools/kernels/make_expf_vectors.sh (needs a llama.cpp build tree).
//
// Output: XWF1, then sections [4-byte tag][u32 byte length][bytes], little-endian:
//   EXIN  f32[n]   inputs (n = 4096 + 5: full 8-lane chunks and a scalar tail)
//   EXPY  f32[n]   ggml_vec_soft_max_f32(n, y, EXIN, 0): ggml_v_expf(x) lanes, expf(x) tail
//   EXPS  f64      the sum it returned
//   SLOT  f32[n]   ggml_vec_silu_f32 over EXIN
//   SWUP  f32[n]   second SwiGLU operand
//   SWOT  f32[n]   ggml_vec_swiglu_f32(n, y, EXIN, SWUP) = silu(EXIN)·SWUP
//   TLIN  f32[820] lengths 1..40 back to back (the tail split of every length)
//   TLUP  f32[820] second operand for those
//   TLSL  f32[820] ggml_vec_silu_f32 per length
//   TLSW  f32[820] ggml_vec_swiglu_f32 per length
//   SMLN  u32[k]   row lengths of the unmasked softmax cases
//   SMIN  f32[Σ]   one row per length
//   SMOT  f32[Σ]   ggml_soft_max (the MoE router's op)
//   MKVS  u32[r]   visible columns per row of the masked case
//   MKSC  f32      kq scale
//   MKIN  f32[r·256] kq rows (n_kv = 256, llama.cpp's padded KV length)
//   MKOT  f32[r·256] ggml_soft_max_ext(kq, mask, scale, 0) with mask 0 / -inf (causal attention)
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "ggml.h"
#include "ggml-cpu.h"

// ggml-cpu/vec.h (extern "C"), exported from libggml-cpu.a.
void ggml_vec_silu_f32(const int n, float * y, const float * x);
double ggml_vec_soft_max_f32(const int n, float * y, const float * x, float max);
void ggml_vec_swiglu_f32(const int n, float * y, const float * x, const float * g);

static uint64_t rng = 0x2545F4914F6CDD1Dull;
static uint64_t next_u64(void) {
    rng ^= rng << 13; rng ^= rng >> 7; rng ^= rng << 17;
    return rng;
}
static float uniform(void) { return (float)((next_u64() >> 40) * (1.0 / 16777216.0)) * 2.0f - 1.0f; }
static float gauss(void) { float s = 0; for (int i = 0; i < 6; i++) s += uniform(); return s * 0.7f; }

// A mix that reaches every branch of ggml_v_expf: the common range, |n| just around the 126 and
// 192 cut-offs (|x| ≈ 87.3 and 133.1), the float exp's overflow/underflow edges (88.7, -103.97),
// signed zeros, subnormals and huge magnitudes.
static float edge_value(int i) {
    static const float fixed[] = {
        0.0f, -0.0f, 1e-45f, -1e-45f, 1e-38f, -1e-38f, 1e-30f, -1e-30f, 1e-7f, -1e-7f,
        0.5f, -0.5f, 1.0f, -1.0f, 2.0f, -2.0f, 20.0f, -20.0f, 87.0f, -87.0f,
        87.3f, -87.3f, 87.34f, -87.34f, 88.0f, -88.0f, 88.38f, -88.38f, 88.72f, -88.72f,
        89.0f, -89.0f, 100.0f, -100.0f, 103.97f, -103.97f, 104.0f, -104.0f, 133.0f, -133.0f,
        133.1f, -133.1f, 140.0f, -140.0f, 1e4f, -1e4f, 1e10f, -1e10f, 3e38f, -3e38f,
    };
    const int nf = (int)(sizeof(fixed) / sizeof(fixed[0]));
    if (i < nf) return fixed[i];
    switch (i % 6) {
        case 0: return gauss();
        case 1: return gauss() * 5.0f;
        case 2: return uniform() * 150.0f;
        case 3: return (uniform() > 0 ? 1.0f : -1.0f) * (87.0f + 17.0f * (uniform() * 0.5f + 0.5f)); // ±87..104
        case 4: return (uniform() > 0 ? 1.0f : -1.0f) * (130.0f + 6.0f * (uniform() * 0.5f + 0.5f)); // ±130..136
        default: return gauss() * 0.05f;
    }
}

static FILE * out;
static void section(const char * tag, const void * p, size_t bytes) {
    uint32_t len = (uint32_t) bytes;
    fwrite(tag, 1, 4, out);
    fwrite(&len, 4, 1, out);
    fwrite(p, 1, bytes, out);
}

static struct ggml_context * new_ctx(void) {
    struct ggml_init_params ip = { 64u * 1024 * 1024, NULL, false };
    return ggml_init(ip);
}

static void compute(struct ggml_context * ctx, struct ggml_tensor * t) {
    struct ggml_cgraph * gf = ggml_new_graph(ctx);
    ggml_build_forward_expand(gf, t);
    if (ggml_graph_compute_with_ctx(ctx, gf, 1) != GGML_STATUS_SUCCESS) {
        fprintf(stderr, "graph compute failed\n");
        exit(1);
    }
}

int main(int argc, char ** argv) {
    if (argc < 2) { fprintf(stderr, "usage: %s OUT.bin\n", argv[0]); return 1; }
    ggml_cpu_init();
    out = fopen(argv[1], "wb");
    if (!out) { perror(argv[1]); return 1; }
    fwrite("XWF1", 1, 4, out);

    // Element-wise: one long vector.
    enum { N = 4096 + 5 };
    static float x[N], y[N], u[N];
    for (int i = 0; i < N; i++) x[i] = edge_value(i);
    for (int i = 0; i < N; i++) u[i] = gauss() * 2.0f;
    section("EXIN", x, sizeof x);
    double s = ggml_vec_soft_max_f32(N, y, x, 0.0f);
    section("EXPY", y, sizeof y);
    section("EXPS", &s, sizeof s);
    ggml_vec_silu_f32(N, y, x);
    section("SLOT", y, sizeof y);
    section("SWUP", u, sizeof u);
    ggml_vec_swiglu_f32(N, y, x, u);
    section("SWOT", y, sizeof y);

    // Every length 1..40, so every chunk/tail split.
    enum { T = 40 * 41 / 2 };
    static float tx[T], tu[T], tsl[T], tsw[T];
    for (int i = 0; i < T; i++) { tx[i] = gauss() * 4.0f; tu[i] = gauss(); }
    for (int len = 1, off = 0; len <= 40; off += len, len++) {
        ggml_vec_silu_f32(len, tsl + off, tx + off);
        ggml_vec_swiglu_f32(len, tsw + off, tx + off, tu + off);
    }
    section("TLIN", tx, sizeof tx);
    section("TLUP", tu, sizeof tu);
    section("TLSL", tsl, sizeof tsl);
    section("TLSW", tsw, sizeof tsw);

    // ggml_soft_max without mask (MoE router): one row per length.
    {
        uint32_t lens[64];
        int k = 0;
        for (int l = 1; l <= 40; l++) lens[k++] = (uint32_t) l;
        const uint32_t more[] = { 48, 60, 64, 100, 128, 256, 257 };
        for (size_t i = 0; i < sizeof(more) / sizeof(more[0]); i++) lens[k++] = more[i];
        size_t total = 0;
        for (int i = 0; i < k; i++) total += lens[i];
        float * in = malloc(total * sizeof(float));
        float * ot = malloc(total * sizeof(float));
        size_t off = 0;
        for (int i = 0; i < k; i++) {
            struct ggml_context * ctx = new_ctx();
            struct ggml_tensor * a = ggml_new_tensor_1d(ctx, GGML_TYPE_F32, lens[i]);
            float * ad = (float *) a->data;
            for (uint32_t j = 0; j < lens[i]; j++) ad[j] = gauss() * 3.0f;
            memcpy(in + off, ad, lens[i] * sizeof(float));
            struct ggml_tensor * r = ggml_soft_max(ctx, a);
            compute(ctx, r);
            memcpy(ot + off, r->data, lens[i] * sizeof(float));
            off += lens[i];
            ggml_free(ctx);
        }
        section("SMLN", lens, k * sizeof(uint32_t));
        section("SMIN", in, total * sizeof(float));
        section("SMOT", ot, total * sizeof(float));
        free(in);
        free(ot);
    }

    // Causal attention: kq rows of n_kv = 256, scale, F32 mask (0 visible, -inf beyond), as
    // llama.cpp's build_attn_mha with flash attention off.
    {
        enum { NKV = 256 };
        uint32_t vis[64];
        int r = 0;
        for (int v = 1; v <= 40; v++) vis[r++] = (uint32_t) v;
        const uint32_t more[] = { 63, 64, 65, 100, 127, 200, 249, 255, 256 };
        for (size_t i = 0; i < sizeof(more) / sizeof(more[0]); i++) vis[r++] = more[i];
        const float scale = 0.125f; // 1/sqrt(64)
        struct ggml_context * ctx = new_ctx();
        struct ggml_tensor * kq = ggml_new_tensor_2d(ctx, GGML_TYPE_F32, NKV, r);
        struct ggml_tensor * mask = ggml_new_tensor_2d(ctx, GGML_TYPE_F32, NKV, r);
        float * kd = (float *) kq->data;
        float * md = (float *) mask->data;
        for (int i = 0; i < r; i++) {
            for (int j = 0; j < NKV; j++) {
                kd[i * NKV + j] = gauss() * 12.0f;
                md[i * NKV + j] = (uint32_t) j < vis[i] ? 0.0f : -INFINITY;
            }
        }
        section("MKVS", vis, r * sizeof(uint32_t));
        section("MKSC", &scale, sizeof scale);
        section("MKIN", kd, (size_t) r * NKV * sizeof(float));
        struct ggml_tensor * p = ggml_soft_max_ext(ctx, kq, mask, scale, 0.0f);
        compute(ctx, p);
        section("MKOT", p->data, (size_t) r * NKV * sizeof(float));
        ggml_free(ctx);
    }

    fclose(out);
    return 0;
}
