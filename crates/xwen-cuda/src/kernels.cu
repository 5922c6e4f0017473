// xwen's CUDA kernels, compiled at load by NVRTC (docs/decisions.md "CUDA backend").
// Every kernel's CPU twin is named beside it; tests/ops.rs holds each one to it.
// Weights stay in their GGUF block formats: a product dequantizes in registers.

typedef unsigned char u8;
typedef unsigned short u16;
typedef unsigned int u32;
typedef signed char i8;
typedef long long i64;

// ggml type ids (ggml.h)
#define NEG_INF __int_as_float(0xff800000)
#define T_F32 0
#define T_F16 1
#define T_Q4_0 2
#define T_Q8_0 8
#define T_Q4_K 12
#define T_Q5_K 13
#define T_Q6_K 14
#define T_BF16 30

// Device block layouts (model.rs `device_layout`): Q8_0 and Q6_K blocks are padded at upload so
// that their quants can be read with aligned vector loads. Q8_0: f16 d, 2 pad bytes, 32 quants;
// Q6_K: the 210-byte block then 14 pad bytes. The other types keep their file layout.
#define Q8_0_BYTES 36
#define Q8_0_QS 4
#define Q6_K_BYTES 224

// Tuning knobs (gpu.rs passes XWEN_CUDA_DEFINES' -D definitions to NVRTC, for A/B runs).
// Q4K_UNROLL: how many of a lane's Q4_K / Q5_K blocks a row product loads before it computes.
#ifndef Q4K_UNROLL
#define Q4K_UNROLL 2
#endif
#define XW_STR(x) #x
#define UNROLL_BY(n) _Pragma(XW_STR(unroll n))

// e over a head's E = dim / 32 (≤ 8) values a lane: unrolled to 8 and guarded, so per-lane
// arrays indexed by e stay in registers (a loop to a run-time E would put them in memory).
#define EACH_E _Pragma("unroll") for (int e = 0; e < 8; e++) if (e < E)

__device__ __forceinline__ float h2f(u16 h) {
    float f;
    asm("{ .reg .b16 t; mov.b16 t, %1; cvt.f32.f16 %0, t; }" : "=f"(f) : "h"(h));
    return f;
}
__device__ __forceinline__ u16 f2h(float f) {
    u16 h;
    asm("{ .reg .b16 t; cvt.rn.f16.f32 t, %1; mov.b16 %0, t; }" : "=h"(h) : "f"(f));
    return h;
}
__device__ __forceinline__ float bf2f(u16 h) { return __uint_as_float(((u32)h) << 16); }
__device__ __forceinline__ u16 ld16(const u8* p) { return *(const u16*)p; }
__device__ __forceinline__ u32 ld32_2(const u8* p) { return (u32)ld16(p) | ((u32)ld16(p + 2) << 16); }

// A decode batch's rows each feed their own sequence: a layer's state pointers come from a table
// of two per row (tab[2t]: the conv state or K cache, tab[2t + 1]: S or the V cache), the rows'
// positions from row_pos[t]. The host writes both before the step's graph runs (no kernel
// writes them, so a kernel may read them before pdl_start). Null tab: the pointers given.
__device__ __forceinline__ void* row_state(const unsigned long long* tab, int t, int which, void* given) {
    return tab ? (void*)tab[2 * t + which] : given;
}

// Programmatic dependent launch (gpu.rs `launch_3d`): on sm_90 and later a kernel may start while
// the one before it on the stream still runs. Every kernel calls this first, before it reads or
// writes any buffer: it waits until the predecessor has finished and its writes are visible, then
// lets the next kernel start (its blocks wait here in turn). Without the launch attribute, or
// before sm_90, both are no-ops.
__device__ __forceinline__ void pdl_start() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.wait;" ::: "memory");
    asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

// Pulls [p, p + bytes) into L2, a warp's lanes a 128-byte line each. A kernel calls it before
// pdl_start for what it reads that no kernel before it writes (weights, a layer's recurrent
// state): the loads then overlap the predecessor's tail. Only a hint: values are unaffected.
__device__ __forceinline__ void prefetch_l2(const void* p, i64 bytes, int lane) {
    for (i64 o = (i64)lane * 128; o < bytes; o += 32 * 128) asm volatile("prefetch.global.L2 [%0];" ::"l"((const char*)p + o));
}

__device__ __forceinline__ float warp_sum(float v) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}
__device__ __forceinline__ double warp_sum_d(double v) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}
__device__ __forceinline__ float warp_max(float v) {
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}
// A whole block's sum in double (ggml's rms_norm sums squares in ggml_float); every thread gets it.
__device__ double block_sum_d(double v) {
    __shared__ double red[32];
    int lane = threadIdx.x & 31, w = threadIdx.x >> 5, nw = (blockDim.x + 31) >> 5;
    v = warp_sum_d(v);
    __syncthreads();
    if (lane == 0) red[w] = v;
    __syncthreads();
    double t = 0.0;
    for (int i = 0; i < nw; i++) t += red[i];
    return t;
}

__device__ __forceinline__ void scale_min_k4(int j, const u8* q, int* d, int* m) {
    if (j < 4) {
        *d = q[j] & 63;
        *m = q[j + 4] & 63;
    } else {
        *d = (q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4);
        *m = (q[j + 4] >> 4) | ((q[j] >> 6) << 4);
    }
}

// Element i of a row of type `ty` (ggml's dequantize_row_* for one value): the embedding
// lookup and the products of the types without a fast path.
__device__ float deq1(int ty, const u8* row, int i) {
    switch (ty) {
    case T_F32: return ((const float*)row)[i];
    case T_F16: return h2f(((const u16*)row)[i]);
    case T_BF16: return bf2f(((const u16*)row)[i]);
    case T_Q4_0: {
        const u8* b = row + (i / 32) * 18;
        int l = i % 32;
        int q = l < 16 ? (b[2 + l] & 0xF) : (b[2 + l - 16] >> 4);
        return h2f(ld16(b)) * (float)(q - 8);
    }
    case T_Q8_0: {
        const u8* b = row + (i / 32) * Q8_0_BYTES;
        return h2f(ld16(b)) * (float)((const i8*)(b + Q8_0_QS))[i % 32];
    }
    case T_Q4_K: {
        const u8* b = row + (i / 256) * 144;
        int r = i % 256, j = r / 64, l = r % 64, sc, m;
        scale_min_k4(2 * j + (l >= 32), b + 4, &sc, &m);
        u8 q = b[16 + 32 * j + (l % 32)];
        int v = l < 32 ? (q & 0xF) : (q >> 4);
        return h2f(ld16(b)) * sc * v - h2f(ld16(b + 2)) * m;
    }
    case T_Q5_K: {
        const u8* b = row + (i / 256) * 176;
        int r = i % 256, j = r / 64, l = r % 64, sc, m;
        int hi = l >= 32;
        scale_min_k4(2 * j + hi, b + 4, &sc, &m);
        u8 q = b[48 + 32 * j + (l % 32)];
        int v = hi ? (q >> 4) : (q & 0xF);
        v += ((b[16 + (l % 32)] >> (2 * j + hi)) & 1) << 4;
        return h2f(ld16(b)) * sc * v - h2f(ld16(b + 2)) * m;
    }
    case T_Q6_K: {
        const u8* b = row + (i / 256) * Q6_K_BYTES;
        int r = i % 256, n = r / 128, s = (r % 128) / 32, l = r % 32;
        const u8* ql = b + 64 * n;
        const u8* qh = b + 128 + 32 * n;
        const i8* sc = (const i8*)(b + 192) + 8 * n;
        int lo = (s & 1) ? ql[l + 32] : ql[l];
        lo = (s >= 2) ? (lo >> 4) : (lo & 0xF);
        int q = (lo | (((qh[l] >> (2 * s)) & 3) << 4)) - 32;
        return h2f(ld16(b + 208)) * sc[l / 16 + 2 * s] * q;
    }
    }
    return 0.0f;
}

// One lane's share of a row · x: the lanes of a warp stride over the row's blocks.
__device__ float dot_row(int ty, const u8* row, const float* __restrict__ x, int cols, int lane) {
    float sum = 0.0f;
    switch (ty) {
    case T_F32:
        if ((cols & 3) == 0) {
            const float4* w4 = (const float4*)row;
            const float4* x4 = (const float4*)x;
            // unrolled so eight loads are in flight (a MoE router's f32 rows are a step's
            // longest of their few): the sum's order is the loop's either way
            #pragma unroll 8
            for (int i = lane; i < cols / 4; i += 32) {
                float4 a = w4[i], b = x4[i];
                sum = __fmaf_rn(a.w, b.w, __fmaf_rn(a.z, b.z, __fmaf_rn(a.y, b.y, __fmaf_rn(a.x, b.x, sum))));
            }
            return sum;
        }
        break;
    case T_F16:
    case T_BF16:
        if ((cols & 1) == 0) {
            const u32* w2 = (const u32*)row;
            #pragma unroll 8
            for (int i = lane; i < cols / 2; i += 32) {
                u32 p = w2[i];
                float a = ty == T_F16 ? h2f((u16)p) : bf2f((u16)p);
                float b = ty == T_F16 ? h2f((u16)(p >> 16)) : bf2f((u16)(p >> 16));
                sum = __fmaf_rn(b, x[2 * i + 1], __fmaf_rn(a, x[2 * i], sum));
            }
            return sum;
        }
        break;
    case T_Q8_0: {
        int nu = cols / 32 * 8;
        for (int u = lane; u < nu; u += 32) {
            int b = u >> 3, g = u & 7;
            const u8* blk = row + b * Q8_0_BYTES;
            u32 q = *(const u32*)(blk + Q8_0_QS + 4 * g);
            float4 xv = *(const float4*)(x + b * 32 + 4 * g);
            float s = __fmaf_rn((float)(i8)(q >> 24), xv.w, __fmaf_rn((float)(i8)(q >> 16), xv.z, __fmaf_rn((float)(i8)(q >> 8), xv.y, __fmul_rn((float)(i8)(q), xv.x))));
            sum = __fmaf_rn(h2f(ld16(blk)), s, sum);
        }
        return sum;
    }
    case T_Q4_K: {
        // 16 bytes of quants a lane: 8 lanes a block, 4 blocks a warp step; lane (j, half)
        // holds 16 values of sub-block 2j (low nibbles) and 16 of 2j + 1 (high)
        int nb = cols / 256, j = (lane & 7) >> 1, hh = lane & 1;
        for (int b = lane >> 3; b < nb; b += 4) {
            const u8* blk = row + b * 144;
            uint4 q = *(const uint4*)(blk + 16 + 32 * j + 16 * hh);
            u32 dd = *(const u32*)blk;
            int sc0, m0, sc1, m1;
            scale_min_k4(2 * j, blk + 4, &sc0, &m0);
            scale_min_k4(2 * j + 1, blk + 4, &sc1, &m1);
            const float* xb = x + b * 256 + 64 * j + 16 * hh;
            u32 qw[4] = {q.x, q.y, q.z, q.w};
            float lo = 0.f, hi = 0.f, s0 = 0.f, s1 = 0.f;
            #pragma unroll
            for (int w = 0; w < 4; w++) {
                float4 x0 = *(const float4*)(xb + 4 * w), x1 = *(const float4*)(xb + 32 + 4 * w);
                u32 v = qw[w];
                lo += (float)(v & 0xF) * x0.x + (float)((v >> 8) & 0xF) * x0.y + (float)((v >> 16) & 0xF) * x0.z + (float)((v >> 24) & 0xF) * x0.w;
                hi += (float)((v >> 4) & 0xF) * x1.x + (float)((v >> 12) & 0xF) * x1.y + (float)((v >> 20) & 0xF) * x1.z + (float)(v >> 28) * x1.w;
                s0 += (x0.x + x0.y) + (x0.z + x0.w);
                s1 += (x1.x + x1.y) + (x1.z + x1.w);
            }
            float d = h2f((u16)dd), dm = h2f((u16)(dd >> 16));
            sum += d * (sc0 * lo + sc1 * hi) - dm * (m0 * s0 + m1 * s1);
        }
        return sum;
    }
    case T_Q5_K: {
        int nu = cols / 256 * 32;
        for (int u = lane; u < nu; u += 32) {
            int b = u >> 5, j = (u >> 3) & 3, g = u & 7;
            const u8* blk = row + b * 176;
            u32 q = *(const u32*)(blk + 48 + 32 * j + 4 * g);
            u32 h = *(const u32*)(blk + 16 + 4 * g);
            int sc0, m0, sc1, m1;
            scale_min_k4(2 * j, blk + 4, &sc0, &m0);
            scale_min_k4(2 * j + 1, blk + 4, &sc1, &m1);
            const float* xb = x + b * 256 + 64 * j + 4 * g;
            float4 x0 = *(const float4*)xb, x1 = *(const float4*)(xb + 32);
            float xs0[4] = {x0.x, x0.y, x0.z, x0.w}, xs1[4] = {x1.x, x1.y, x1.z, x1.w};
            float lo = 0.f, hi = 0.f, s0 = 0.f, s1 = 0.f;
            #pragma unroll
            for (int e = 0; e < 4; e++) {
                u32 qb = (q >> (8 * e)) & 0xFF, hb = (h >> (8 * e)) & 0xFF;
                lo += (float)((qb & 0xF) | (((hb >> (2 * j)) & 1) << 4)) * xs0[e];
                hi += (float)((qb >> 4) | (((hb >> (2 * j + 1)) & 1) << 4)) * xs1[e];
                s0 += xs0[e];
                s1 += xs1[e];
            }
            float d = h2f(ld16(blk)), dm = h2f(ld16(blk + 2));
            sum += d * (sc0 * lo + sc1 * hi) - dm * (m0 * s0 + m1 * s1);
        }
        return sum;
    }
    case T_Q6_K: {
        int nu = cols / 256 * 16;
        for (int u = lane; u < nu; u += 32) {
            int b = u >> 4, n = (u >> 3) & 1, g = u & 7;
            const u8* blk = row + b * Q6_K_BYTES;
            u32 qa = *(const u32*)(blk + 64 * n + 4 * g);
            u32 qb = *(const u32*)(blk + 64 * n + 32 + 4 * g);
            u32 qh = *(const u32*)(blk + 128 + 32 * n + 4 * g);
            const i8* sc = (const i8*)(blk + 192) + 8 * n + (g >> 2);
            const float* xb = x + b * 256 + 128 * n + 4 * g;
            float s1 = 0.f, s2 = 0.f, s3 = 0.f, s4 = 0.f;
            #pragma unroll
            for (int e = 0; e < 4; e++) {
                int a = (qa >> (8 * e)) & 0xFF, c = (qb >> (8 * e)) & 0xFF, hh = (qh >> (8 * e)) & 0xFF;
                s1 += (float)(((a & 0xF) | ((hh & 3) << 4)) - 32) * xb[e];
                s2 += (float)(((c & 0xF) | (((hh >> 2) & 3) << 4)) - 32) * xb[e + 32];
                s3 += (float)(((a >> 4) | (((hh >> 4) & 3) << 4)) - 32) * xb[e + 64];
                s4 += (float)(((c >> 4) | (((hh >> 6) & 3) << 4)) - 32) * xb[e + 96];
            }
            sum += h2f(ld16(blk + 208)) * (sc[0] * s1 + sc[2] * s2 + sc[4] * s3 + sc[6] * s4);
        }
        return sum;
    }
    }
    for (int i = lane; i < cols; i += 32) sum += deq1(ty, row, i) * x[i];
    return sum;
}

// dot_row behind a call: see dot_any_rows.
__device__ __noinline__ float dot_row_call(int ty, const u8* row, const float* x, int cols, int lane) { return dot_row(ty, row, x, cols, lane); }

// ---- decode products on q8 activations, weights dotted four quants an instruction (dp4a).
// The activations are quantized as the CPU quantizes them for the same weight (ggml's
// quantize_row_q8_K for the k-quants, one scale a 256; quantize_row_q8_0 for Q8_0, one f16
// scale a 32), so a product differs from the CPU's only in the order of its float sums.
// Layout: xq int8 values; xd one (scale, scale·Σq) per 32 values (a q8_K scale repeated). ----

// Sub-blocks 2j and 2j + 1's 6-bit scales and mins of a Q4_K / Q5_K block (scale_min_k4), from
// three aligned words and shifts (byte indexing of a local array would spill to memory).
__device__ __forceinline__ void scales_k4_words(u32 s0, u32 s1, u32 s2, int j, int* sc0, int* m0, int* sc1, int* m1) {
    if (j < 2) {
        int sh0 = 16 * j, sh1 = 16 * j + 8;
        *sc0 = (s0 >> sh0) & 63;
        *m0 = (s1 >> sh0) & 63;
        *sc1 = (s0 >> sh1) & 63;
        *m1 = (s1 >> sh1) & 63;
    } else {
        int sh0 = 16 * (j - 2), sh1 = sh0 + 8;
        *sc0 = ((s2 >> sh0) & 0xF) | (((s0 >> sh0) >> 6 & 3) << 4);
        *m0 = ((s2 >> sh0) >> 4 & 0xF) | (((s1 >> sh0) >> 6 & 3) << 4);
        *sc1 = ((s2 >> sh1) & 0xF) | (((s0 >> sh1) >> 6 & 3) << 4);
        *m1 = ((s2 >> sh1) >> 4 & 0xF) | (((s1 >> sh1) >> 6 & 3) << 4);
    }
}

__device__ __forceinline__ void scales_k4(const u8* blk, int j, int* sc0, int* m0, int* sc1, int* m1) {
    const u32* w = (const u32*)(blk + 4);
    scales_k4_words(w[0], w[1], w[2], j, sc0, m0, sc1, m1);
}

// Row r of R rows rstride bytes apart, of which the first nrows are real: the others repeat the
// last real one (a block's tail), so a product's loads stay in the matrix.
__device__ __forceinline__ const u8* row_at(const u8* row, i64 rstride, int r, int nrows) { return row + (i64)min(r, nrows - 1) * rstride; }

// Column c of C activation rows xs values apart (their scales xs / 32 apart), of which the first
// ncol are real: the others repeat the last real one, so a product's loads stay in the batch.
// With ci, column c is activation row ci[c] / cdiv instead (an expert's routed slots, gathered
// from their tokens' rows: cdiv = k, or their own rows: cdiv = 1).
__device__ __forceinline__ i64 col_at(int c, int ncol, i64 xs, const int* ci = nullptr, int cdiv = 1) {
    int cc = min(c, ncol - 1);
    return ci ? (i64)(ci[cc] / cdiv) * xs : (i64)cc * xs;
}

// One lane's shares of R rows · C columns for Q4_K (Q5: Q5_K): see dot_rows_q8.
template <int R, bool Q5, int C>
__device__ __forceinline__ void dot_rows_k4(const u8* row, i64 rstride, int nrows, const i8* __restrict__ xq, const float2* __restrict__ xd, const i64* cof,
                                            int cols, int lane, float* sum) {
    constexpr int UN = R == 1 ? 2 : 1;
    // lane (j, hh) of a block's 8: 16 quant bytes = 16 values of sub-block 2j (low nibbles)
    // and 16 of 2j + 1 (high); the half hh of each sub-block
    constexpr int bs = Q5 ? 176 : 144;
    int nb = cols / 256, j = (lane & 7) >> 1, hh = lane & 1;
    #pragma unroll UN
    for (int b = lane >> 3; b < nb; b += 4) {
        int4 q[R], qh[R];
        u32 dd[R], s0[R], s1[R], s2[R];
        #pragma unroll
        for (int r = 0; r < R; r++) {
            const u8* blk = row_at(row, rstride, r, nrows) + (i64)b * bs;
            q[r] = *(const int4*)(blk + (Q5 ? 48 : 16) + 32 * j + 16 * hh);
            if (Q5) qh[r] = *(const int4*)(blk + 16 + 16 * hh);
            dd[r] = *(const u32*)blk;
            const u32* w = (const u32*)(blk + 4);
            s0[r] = w[0];
            s1[r] = w[1];
            s2[r] = w[2];
        }
        #pragma unroll
        for (int c = 0; c < C; c++) {
        i64 co = cof[c];
        const i8* xb = xq + co + b * 256 + 64 * j + 16 * hh;
        int4 xa = *(const int4*)xb, xh = *(const int4*)(xb + 32);
        int xaw[4] = {xa.x, xa.y, xa.z, xa.w}, xhw[4] = {xh.x, xh.y, xh.z, xh.w};
        float2 d0 = xd[co / 32 + b * 8 + 2 * j], d1 = xd[co / 32 + b * 8 + 2 * j + 1];
        #pragma unroll
        for (int r = 0; r < R; r++) {
            int qw[4] = {q[r].x, q[r].y, q[r].z, q[r].w};
            int lo = 0, hi = 0;
            #pragma unroll
            for (int w = 0; w < 4; w++) {
                int vl = qw[w] & 0x0F0F0F0F, vh = (qw[w] >> 4) & 0x0F0F0F0F;
                if (Q5) {
                    int hw = w == 0 ? qh[r].x : w == 1 ? qh[r].y : w == 2 ? qh[r].z : qh[r].w;
                    vl |= ((hw >> (2 * j)) & 0x01010101) << 4;
                    vh |= ((hw >> (2 * j + 1)) & 0x01010101) << 4;
                }
                lo = __dp4a(vl, xaw[w], lo);
                hi = __dp4a(vh, xhw[w], hi);
            }
            int sc0, m0, sc1, m1;
            scales_k4_words(s0[r], s1[r], s2[r], j, &sc0, &m0, &sc1, &m1);
            float d = h2f((u16)dd[r]), dm = h2f((u16)(dd[r] >> 16));
            // (explicit fused multiply-adds: the compiler may not contract them differently in
            // different kernels, so a row's bits are the same in every kernel that dots it)
            float& sr = sum[r * C + c];
            sr = __fmaf_rn(d, __fmaf_rn((float)(sc1 * hi), d1.x, __fmul_rn((float)(sc0 * lo), d0.x)), sr);
            // the mins' term takes each sub-block's Σx once: the hh = 0 lane adds it
            if (hh == 0) sr = __fmaf_rn(-dm, __fmaf_rn((float)m1, d1.y, __fmul_rn((float)m0, d0.y)), sr);
        }
        }
    }
}

// One lane's shares of R rows · x (rows rstride bytes apart, the first nrows real: row_at) for
// the quantized types with a q8 path, into sum[0..R); `ok` false for the other types. Each step
// loads the R rows' words before it computes, so a warp has R rows' loads in flight where one
// row would leave the memory system idle between them, and the activations' words are loaded
// once for all R. A row's sum is the same expression, in the same order, for any R: the bits
// do not depend on R. With C > 1 columns (a decode batch's activation rows, xs values apart,
// the first ncol real: col_at) each row is dotted with each column, the weights' words loaded
// once for all; sum[r·C + c] is the expression one column alone gives, in the same order
// (columns gathered through ci: col_at).
template <int R, int C = 1>
__device__ __forceinline__ void dot_rows_q8(int ty, const u8* row, i64 rstride, int nrows, const i8* __restrict__ xq, const float2* __restrict__ xd, int cols,
                                            int lane, bool* ok, float* sum, i64 xs = 0, int ncol = 1, const int* ci = nullptr, int cdiv = 1) {
    constexpr int UN = R == 1 && C == 1 ? 2 : 1;
    #pragma unroll
    for (int r = 0; r < R * C; r++) sum[r] = 0.0f;
    // the columns' offsets, in registers
    i64 cof[C];
    #pragma unroll
    for (int c = 0; c < C; c++) cof[c] = col_at(c, ncol, xs, ci, cdiv);
    *ok = true;
    switch (ty) {
    case T_Q4_K:
        dot_rows_k4<R, false, C>(row, rstride, nrows, xq, xd, cof, cols, lane, sum);
        return;
    case T_Q5_K:
        dot_rows_k4<R, true, C>(row, rstride, nrows, xq, xd, cof, cols, lane, sum);
        return;
    case T_Q6_K: {
        // lane (n, c) of a block's 8: ql bytes [64n + 8c, +8) and [64n + 32 + 8c, +8) and qh
        // bytes [32n + 8c, +8): 8 values of each of the half's four quarters
        int nb = cols / 256, n = (lane & 7) >> 2, c = lane & 3;
        #pragma unroll UN
        for (int b = lane >> 3; b < nb; b += 4) {
            int2 la[R], lb[R], hq[R];
            u16 dh[R];
            u32 scw[R];
            #pragma unroll
            for (int r = 0; r < R; r++) {
                const u8* blk = row_at(row, rstride, r, nrows) + (i64)b * Q6_K_BYTES;
                la[r] = *(const int2*)(blk + 64 * n + 8 * c);
                lb[r] = *(const int2*)(blk + 64 * n + 32 + 8 * c);
                hq[r] = *(const int2*)(blk + 128 + 32 * n + 8 * c);
                dh[r] = ld16(blk + 208);
                // the scales sc[2s] for s < 4 at bytes 192 + 8n + (c >> 1) + 2s: in two words
                const u8* scp = blk + 192 + 8 * n + (c >> 1);
                scw[r] = (u32)scp[0] | ((u32)scp[2] << 8) | ((u32)scp[4] << 16) | ((u32)scp[6] << 24);
            }
            #pragma unroll
            for (int cc = 0; cc < C; cc++) {
            i64 co = cof[cc];
            #pragma unroll
            for (int r = 0; r < R; r++) {
                float d = h2f(dh[r]);
                int law[2] = {la[r].x, la[r].y}, lbw[2] = {lb[r].x, lb[r].y}, hw[2] = {hq[r].x, hq[r].y};
                float acc = 0.0f;
                #pragma unroll
                for (int s = 0; s < 4; s++) {
                    const i8* xp = xq + co + b * 256 + 128 * n + 32 * s + 8 * c;
                    int2 xv = *(const int2*)xp;
                    int xw[2] = {xv.x, xv.y};
                    int isum = 0;
                    #pragma unroll
                    for (int w = 0; w < 2; w++) {
                        int l = (s & 1) ? lbw[w] : law[w];
                        int v = ((s >= 2) ? (l >> 4) : l) & 0x0F0F0F0F;
                        v |= ((hw[w] >> (2 * s)) & 0x03030303) << 4;
                        isum = __dp4a((int)__vsubss4((unsigned)v, 0x20202020u), xw[w], isum);
                    }
                    int sc = (int)(i8)(scw[r] >> (8 * s));
                    acc = __fmaf_rn((float)(sc * isum), xd[co / 32 + b * 8 + 4 * n + s].x, acc);
                }
                sum[r * C + cc] = __fmaf_rn(d, acc, sum[r * C + cc]);
            }
            }
        }
        return;
    }
    case T_Q8_0: {
        // lane: half a block (16 quants)
        int nh = cols / 16;
        #pragma unroll UN
        for (int u = lane; u < nh; u += 32) {
            int b = u >> 1, hh = u & 1;
            #pragma unroll
            for (int c = 0; c < C; c++) {
            i64 co = cof[c];
            int4 xv = *(const int4*)(xq + co + 16 * u);
            float xsc = xd[co / 32 + b].x;
            #pragma unroll
            for (int r = 0; r < R; r++) {
                const u8* blk = row_at(row, rstride, r, nrows) + (i64)b * Q8_0_BYTES;
                const int* q = (const int*)(blk + Q8_0_QS + 16 * hh);
                int isum = __dp4a(q[0], xv.x, 0);
                isum = __dp4a(q[1], xv.y, isum);
                isum = __dp4a(q[2], xv.z, isum);
                isum = __dp4a(q[3], xv.w, isum);
                sum[r * C + c] = __fmaf_rn(h2f(ld16(blk)), __fmul_rn((float)isum, xsc), sum[r * C + c]);
            }
            }
        }
        return;
    }
    }
    *ok = false;
}

__device__ __forceinline__ float dot_row_q8(int ty, const u8* row, const i8* __restrict__ xq, const float2* __restrict__ xd, int cols, int lane, bool* ok) {
    float s[1];
    dot_rows_q8<1>(ty, row, 0, 1, xq, xd, cols, lane, ok, s);
    return s[0];
}

// R rows · x (rstride bytes apart), one lane's shares into sum[0..R): the q8 path where the type
// has one and its activations are given (k: q8_K for the k-quants, z: q8_0 for Q8_0), else the
// f32 one, a row at a time.
// With C > 1 columns: dot_rows_q8's (each column's bits those of the column alone; columns
// gathered through ci: col_at).
template <int R, int C = 1>
__device__ __forceinline__ void dot_any_rows(int ty, const u8* row, i64 rstride, int nrows, const float* x, const i8* qk, const float2* dk, const i8* qz,
                                             const float2* dz, int cols, int lane, float* sum, i64 xs = 0, int ncol = 1, const int* ci = nullptr,
                                             int cdiv = 1) {
    bool kq = ty == T_Q4_K || ty == T_Q5_K || ty == T_Q6_K;
    const i8* q = kq ? qk : (ty == T_Q8_0 ? qz : nullptr);
    if (q) {
        bool ok;
        dot_rows_q8<R, C>(ty, row, rstride, nrows, q, kq ? dk : dz, cols, lane, &ok, sum, xs, ncol, ci, cdiv);
        if (ok) return;
    }
    if constexpr (C > 1) {
        #pragma unroll
        for (int r = 0; r < R; r++)
            #pragma unroll
            for (int c = 0; c < C; c++) sum[r * C + c] = dot_row_call(ty, row_at(row, rstride, r, nrows), x + col_at(c, ncol, xs, ci, cdiv), cols, lane);
    } else if constexpr (R == 1) {
        sum[0] = dot_row(ty, row, x, cols, lane);
    } else {
        // the types without a q8 path a row at a time, through one call (R inlined copies of
        // dot_row's every case would hold registers the fast path then lacks)
        #pragma unroll
        for (int r = 0; r < R; r++) sum[r] = dot_row_call(ty, row_at(row, rstride, r, nrows), x, cols, lane);
    }
}

// row · x: the q8 path where the type has one and its activations are given (k: q8_K for the
// k-quants, z: q8_0 for Q8_0), else the f32 one.
__device__ __forceinline__ float dot_any(int ty, const u8* row, const float* x, const i8* qk, const float2* dk, const i8* qz, const float2* dz,
                                         int cols, int lane) {
    float s[1];
    dot_any_rows<1>(ty, row, 0, 1, x, qk, dk, qz, dz, cols, lane, s);
    return s[0];
}

// The first index of the largest |v| over a warp's (|v|, v, index) triples, to every lane.
__device__ __forceinline__ void warp_absmax(float* ax, float* v, int* idx) {
    for (int o = 16; o > 0; o >>= 1) {
        float oa = __shfl_xor_sync(0xffffffffu, *ax, o), ov = __shfl_xor_sync(0xffffffffu, *v, o);
        int oi = __shfl_xor_sync(0xffffffffu, *idx, o);
        if (oa > *ax || (oa == *ax && oi < *idx)) { *ax = oa; *v = ov; *idx = oi; }
    }
}

// One warp quantizes 256 values (8 a lane, lane-major) as quantize_row_q8_K_ref: the value of
// largest magnitude (first of equals) sets iscale = −127 / max; q = min(127, nearest(iscale·x)).
__device__ __forceinline__ void quant_block_k(const float* v8, int lane, i8* q, float2* d8) {
    float ax = 0.0f, mv = 0.0f;
    int idx = 0x7fffffff;
    #pragma unroll
    for (int e = 0; e < 8; e++)
        if (fabsf(v8[e]) > ax) { ax = fabsf(v8[e]); mv = v8[e]; idx = 8 * lane + e; }
    warp_absmax(&ax, &mv, &idx);
    int qs[8], sum = 0;
    float iscale = ax > 0.0f ? -127.0f / mv : 0.0f;
    #pragma unroll
    for (int e = 0; e < 8; e++) {
        qs[e] = ax > 0.0f ? min(127, __float2int_rn(iscale * v8[e])) : 0;
        sum += qs[e];
    }
    u32 lo = (qs[0] & 0xFF) | ((qs[1] & 0xFF) << 8) | ((qs[2] & 0xFF) << 16) | ((u32)(qs[3] & 0xFF) << 24);
    u32 hi = (qs[4] & 0xFF) | ((qs[5] & 0xFF) << 8) | ((qs[6] & 0xFF) << 16) | ((u32)(qs[7] & 0xFF) << 24);
    *(uint2*)(q + 8 * lane) = make_uint2(lo, hi);
    // Σq of each 32 (four lanes)
    sum += __shfl_xor_sync(0xffffffffu, sum, 1);
    sum += __shfl_xor_sync(0xffffffffu, sum, 2);
    float d = ax > 0.0f ? 1.0f / iscale : 0.0f;
    if ((lane & 3) == 0) d8[lane >> 2] = make_float2(d, d * (float)sum);
}

// One warp quantizes 32 values (one a lane) as quantize_row_q8_0_ref: d = amax / 127 kept as
// f16, q = roundf(x / d) (by the reciprocal, as ggml).
__device__ __forceinline__ void quant_block_z(float v, int lane, i8* q, float2* d1) {
    float amax = warp_max(fabsf(v));
    float d = amax / 127.0f;
    float id = d != 0.0f ? 1.0f / d : 0.0f;
    int qi = (int)roundf(v * id);
    q[lane] = (i8)qi;
    int sum = __reduce_add_sync(0xffffffffu, qi);
    float dh = h2f(f2h(d));
    if (lane == 0) *d1 = make_float2(dh, dh * (float)sum);
}

// xq/xd ← rows of x quantized for the products: kind 0 q8_K (a warp a 256; cols % 256 == 0),
// kind 1 q8_0 (a warp a 32; cols % 32 == 0). blockIdx.y a row.
__device__ __forceinline__ void quant_row(const float* x, int cols, i64 x_stride, i8* xq, float2* xd, int kind, i64 r) {
    int blk = blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5), lane = threadIdx.x & 31;
    int bw = kind == 0 ? 256 : 32;
    if (blk * bw >= cols) return;
    const float* xr = x + r * x_stride + blk * bw;
    i8* q = xq + r * x_stride + blk * bw;
    float2* d = xd + r * (x_stride / 32) + blk * (bw / 32);
    if (kind == 0) {
        float4 a = *(const float4*)(xr + 8 * lane), b = *(const float4*)(xr + 8 * lane + 4);
        float v8[8] = {a.x, a.y, a.z, a.w, b.x, b.y, b.z, b.w};
        quant_block_k(v8, lane, q, d);
    } else {
        quant_block_z(xr[lane], lane, q, d);
    }
}

extern "C" __global__ void quant_q8(const float* x, int cols, i64 x_stride, i8* xq, float2* xd, int kind) {
    pdl_start();
    quant_row(x, cols, x_stride, xq, xd, kind, blockIdx.y);
}

// A block's 256 outputs (s_y, `first` values into the row) quantized for the next product, as
// quant_q8 makes them: q8_K by the first warp (yq), q8_0 a warp a 32 (yqz); either may be null.
__device__ void quant_256(const float* s_y, i64 first, i8* yq, float2* yd, i8* yqz, float2* ydz) {
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
    if (yq && warp == 0) {
        float v8[8];
        #pragma unroll
        for (int e = 0; e < 8; e++) v8[e] = s_y[8 * lane + e];
        quant_block_k(v8, lane, yq + first, yd + first / 32);
    }
    if (yqz)
        for (int c = warp; c < 8; c += nw) quant_block_z(s_y[32 * c + lane], lane, yqz + first + 32 * c, ydz + first / 32 + c);
}

// quant_q8 of two inputs in one launch: gridDim.y − 1 rows of x (kind), then one row of x2
// (kind2) in the last blockIdx.y (a decode step's routed experts' hidden rows and the shared
// expert's, which their down products take in different kinds). blockIdx.z is a decode batch's
// row: its gridDim.y − 1 rows of x from z·(gridDim.y − 1), its row of x2 at z.
extern "C" __global__ void quant_q8_2(const float* x, int cols, i8* xq, float2* xd, int kind, const float* x2, int cols2, i8* xq2, float2* xd2, int kind2) {
    pdl_start();
    int per = gridDim.y - 1;
    if (blockIdx.y < per) quant_row(x, cols, cols, xq, xd, kind, blockIdx.z * per + blockIdx.y);
    else quant_row(x2, cols2, cols2, xq2, xd2, kind2, blockIdx.z);
}

// Eight consecutive values a lane (lane l of the warp: values 8l..8l+7 of its 256) quantized as
// q8_0, four lanes a 32-value block: the bits of quant_block_z (a block's max and Σq do not
// depend on which lane holds which value).
__device__ __forceinline__ void quant_8_z(const float* v8, int lane, i8* q8, float2* d1) {
    float amax = 0.0f;
    #pragma unroll
    for (int e = 0; e < 8; e++) amax = fmaxf(amax, fabsf(v8[e]));
    amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, 1));
    amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, 2));
    float d = amax / 127.0f;
    float id = d != 0.0f ? 1.0f / d : 0.0f;
    int qs[8], sum = 0;
    #pragma unroll
    for (int e = 0; e < 8; e++) {
        qs[e] = (int)roundf(v8[e] * id);
        sum += qs[e];
    }
    u32 lo = (qs[0] & 0xFF) | ((qs[1] & 0xFF) << 8) | ((qs[2] & 0xFF) << 16) | ((u32)(qs[3] & 0xFF) << 24);
    u32 hi = (qs[4] & 0xFF) | ((qs[5] & 0xFF) << 8) | ((qs[6] & 0xFF) << 16) | ((u32)(qs[7] & 0xFF) << 24);
    *(uint2*)q8 = make_uint2(lo, hi);
    sum += __shfl_xor_sync(0xffffffffu, sum, 1);
    sum += __shfl_xor_sync(0xffffffffu, sum, 2);
    float dh = h2f(f2h(d));
    if ((lane & 3) == 0) *d1 = make_float2(dh, dh * (float)sum);
}

// Whether this block is the last of its grid (or of the blocks sharing `count`) to get here:
// every thread's global writes made visible first; the counter (zero before) counts blocks,
// `of` of them in all, and is left for the last block to reset.
__device__ __forceinline__ bool last_block(u32* count, u32 of) {
    __shared__ bool s_last;
    __threadfence();
    __syncthreads();
    if (threadIdx.x == 0) s_last = atomicAdd(count, 1u) == of - 1;
    __syncthreads();
    if (s_last) __threadfence();
    return s_last;
}

// One row of `cols` values quantized by the whole block, a warp a q8 block at a time (kind 0
// q8_K, 256 values a block; kind 1 q8_0, 32): quant_row's blocks and bits. The row is read
// through L2 (other blocks of the grid wrote it: moe_glu's fused quantization).
__device__ __forceinline__ void quant_row_all(const float* x, int cols, i8* xq, float2* xd, int kind) {
    int lane = threadIdx.x & 31, bw = kind == 0 ? 256 : 32;
    for (int b = threadIdx.x >> 5; b * bw < cols; b += blockDim.x >> 5) {
        const float* xr = x + (i64)b * bw;
        if (kind == 0) {
            float4 a = __ldcg((const float4*)(xr + 8 * lane)), c = __ldcg((const float4*)(xr + 8 * lane + 4));
            float v8[8] = {a.x, a.y, a.z, a.w, c.x, c.y, c.z, c.w};
            quant_block_k(v8, lane, xq + (i64)b * bw, xd + (i64)b * (bw / 32));
        } else {
            quant_block_z(__ldcg(xr + lane), lane, xq + (i64)b * bw, xd + (i64)b * (bw / 32));
        }
    }
}

// rms_norm's fast path (n % 256 == 0: n / 8 threads, eight values each) by a block of any
// number of warps: the same expressions in the same order — each 256 values' squares summed by
// a (virtual) warp's warp_sum_d, the n / 256 partials added in order as block_sum_d adds them,
// then each value scaled and weighted and each 256 quantized as rms_norm's warps do — so the
// same bits. x is read through L2 (other blocks of the grid wrote it); n ≤ 8192.
__device__ void norm_row_block(const float* x, const float* w, float* y, int n, float eps, i8* yq, float2* yd, i8* yqz, float2* ydz) {
    __shared__ double red[32];
    int lane = threadIdx.x & 31, nw = blockDim.x >> 5, parts = n / 256;
    for (int p = threadIdx.x >> 5; p < parts; p += nw) {
        int i0 = 256 * p + 8 * lane;
        float4 a = __ldcg((const float4*)(x + i0)), b = __ldcg((const float4*)(x + i0 + 4));
        float v8[8] = {a.x, a.y, a.z, a.w, b.x, b.y, b.z, b.w};
        double s = 0.0;
        #pragma unroll
        for (int e = 0; e < 8; e++) s += (double)(v8[e] * v8[e]);
        s = warp_sum_d(s);
        if (lane == 0) red[p] = s;
    }
    __syncthreads();
    double s = 0.0;
    for (int i = 0; i < parts; i++) s += red[i];
    float scale = 1.0f / sqrtf((float)(s / n) + eps);
    for (int p = threadIdx.x >> 5; p < parts; p += nw) {
        int i0 = 256 * p + 8 * lane;
        float4 a = __ldcg((const float4*)(x + i0)), b = __ldcg((const float4*)(x + i0 + 4));
        float4 wa = *(const float4*)(w + i0), wb = *(const float4*)(w + i0 + 4);
        float v8[8] = {a.x, a.y, a.z, a.w, b.x, b.y, b.z, b.w};
        float w8[8] = {wa.x, wa.y, wa.z, wa.w, wb.x, wb.y, wb.z, wb.w};
        #pragma unroll
        for (int e = 0; e < 8; e++) v8[e] = (v8[e] * scale) * w8[e];
        *(float4*)(y + i0) = make_float4(v8[0], v8[1], v8[2], v8[3]);
        *(float4*)(y + i0 + 4) = make_float4(v8[4], v8[5], v8[6], v8[7]);
        if (yq) quant_block_k(v8, lane, yq + 256 * p, yd + 8 * p);
        if (yqz) quant_8_z(v8, lane, yqz + i0, ydz + i0 / 32);
    }
}

#define MV_WARPS 4

// Rows a warp of mv takes (gpu.rs `Knobs` defines it; the launches' grids follow).
#ifndef MV_ROWS
#define MV_ROWS 1
#endif

// Rows of a decode batch a warp of the dense row products takes at once (mv_cols, mv4): the
// weight's words loaded once for all of them (gpu.rs `Knobs` defines it; grids follow).
#ifndef MV_COLS
#define MV_COLS 8
#endif

// y[c][r] = W[r]·x[c] (+ res[c][r]) for a decode batch's n_col rows of x (x_stride values
// apart; their q8 copies likewise): a warp a weight row and MV_COLS batch rows, the row's words
// loaded once for all. Each batch row's sum is the expression mv computes for it alone
// (dot_rows_q8, a column's order), so its bits are mv's: the batch changes no row. Blocks run
// column group fastest (col_block): a weight row's groups are read while it is in L2.
__device__ __forceinline__ void col_block(int n_col, int C, int* row_block, int* c0) {
    int groups = (n_col + C - 1) / C;
    *row_block = blockIdx.x / groups;
    *c0 = (blockIdx.x % groups) * C;
}

// A column group's width for its live columns (-DCOLS_NARROW=1): the narrowest quarter of
// MV_COLS that holds them, so a verify of 5 rows does 6 columns' integer work a weight row,
// not 8. A column's sum is the same expression at any width (dot_rows_q8), so the width
// changes no bit. On an H100 (35B-A3B after 512 tokens) it took a verify of 2 rows from 1.78× to
// 1.45× one decode and of 4 from 2.18× to 2.02×, and the replay drafter at depth 4 from 1.87× to
// 1.91× plain (docs/bench.md); 0: every group MV_COLS wide.
#ifndef COLS_NARROW
#define COLS_NARROW 1
#endif
// CALL(W) for the width W of a group of `live` columns.
#if COLS_NARROW && MV_COLS >= 4 && MV_COLS % 4 == 0
#define WITH_COLS(live, CALL)                  \
    if ((live) <= MV_COLS / 4) CALL(MV_COLS / 4);        \
    else if ((live) <= MV_COLS / 2) CALL(MV_COLS / 2);   \
    else if ((live) <= 3 * MV_COLS / 4) CALL(3 * MV_COLS / 4); \
    else CALL(MV_COLS)
#else
#define WITH_COLS(live, CALL) CALL(MV_COLS)
#endif

// Channel c of one token's causal convolution against its conv state, then SiLU; the state
// shifted a row (rowwise::conv_silu): conv_step's arithmetic, and that of mv4's fused epilogue.
// Explicit fused multiply-adds, as conv_prompt's: inlined into different kernels, `a * b + c`
// may be contracted differently, and these three are held bit for bit equal.
__device__ __forceinline__ float conv_channel(float* state, const float* taps, float xc, int cd, int c, int kernel) {
    float acc = 0.0f;
    for (int j = 0; j < kernel - 1; j++) acc = __fmaf_rn(state[(i64)j * cd + c], taps[(i64)j * cd + c], acc);
    acc = __fmaf_rn(xc, taps[(i64)(kernel - 1) * cd + c], acc);
    for (int j = 0; j + 1 < kernel - 1; j++) state[(i64)j * cd + c] = state[(i64)(j + 1) * cd + c];
    if (kernel > 1) state[(i64)(kernel - 2) * cd + c] = xc;
    return acc / (1.0f + expf(-acc));
}

// One weight row's products with a group of C columns from c0 (`live` of them real; inputs
// x_stride values apart), each sum stored at y[c·y_stride + row] (plus res there, where res)
// and, with conv_out, convolved as conv_step convolves it (conv_channel, batch row c's conv
// state from ctab, into conv_out[c·rows0 + row]): mv_cols' and mv4's body at a group width.
template <int C>
__device__ __forceinline__ void cols_group(int ty, const u8* wrow, i64 rb, int cols, const float* x, const i8* qk, const float2* dk, const i8* qz,
                                           const float2* dz, i64 x_stride, int live, int lane, float* y, i64 y_stride, const float* res, int c0, int row,
                                           float* conv_out, int rows0, const float* taps, int kernel, const unsigned long long* ctab) {
    float sum[C];
    dot_any_rows<1, C>(ty, wrow, rb, 1, x, qk, dk, qz, dz, cols, lane, sum, x_stride, live);
    #pragma unroll
    for (int c = 0; c < C; c++) {
        float v = warp_sum(sum[c]);
        if (lane == 0 && c < live) {
            i64 o = (i64)(c0 + c) * y_stride + row;
            y[o] = res ? res[o] + v : v;
            if (conv_out) conv_out[(i64)(c0 + c) * rows0 + row] = conv_channel((float*)row_state(ctab, c0 + c, 0, nullptr), taps, v, rows0, row, kernel);
        }
    }
}

extern "C" __global__ void mv_cols(const u8* W, int ty, int rows, int cols, i64 row_bytes, const float* x, const i8* qk, const float2* dk, const i8* qz,
                                   const float2* dz, i64 x_stride, int n_col, float* y, i64 y_stride, const float* res) {
    int rblk, c0;
    col_block(n_col, MV_COLS, &rblk, &c0);
    int row = rblk * MV_WARPS + (threadIdx.x >> 5), lane = threadIdx.x & 31;
    if (row < rows) prefetch_l2(W + (i64)row * row_bytes, row_bytes, lane);
    pdl_start();
    if (row >= rows) return;
    int live = min(MV_COLS, n_col - c0);
    i64 xr = (i64)c0 * x_stride;
#define MV_COLS_GROUP(CW) \
    cols_group<CW>(ty, W + (i64)row * row_bytes, row_bytes, cols, x + xr, qk ? qk + xr : qk, dk + xr / 32, qz ? qz + xr : qz, dz + xr / 32, x_stride, live, lane, y, y_stride, \
                   res, c0, row, nullptr, 0, nullptr, 0, nullptr)
    WITH_COLS(live, MV_COLS_GROUP);
#undef MV_COLS_GROUP
}

// y[slot][r] = W_e[r]·x[slot / x_div] (+ res[slot][r]) where e = ids[slot] (an expert of a stack)
// or 0: a warp MV_ROWS rows, blockIdx.y a slot (x_div = k: a token's k routed slots share its
// input). y may alias res (each row read, then written, by one lane).
// qk/dk, qz/dz (may be null): x quantized by quant_q8 (q8_K, q8_0), rows x_stride bytes /
// x_stride / 32 scales apart.
#define MV_ARGS                                                                                                                     \
    const u8 *W, int ty, int rows, int cols, i64 row_bytes, i64 mat_bytes, const int *ids, const float *x, const i8 *qk, const float2 *dk, \
        const i8 *qz, const float2 *dz, i64 x_stride, int x_div, float *y, i64 y_stride, const float *res
#define MV_PASS W, ty, rows, cols, row_bytes, mat_bytes, ids, x, qk, dk, qz, dz, x_stride, x_div, y, y_stride, res
__device__ __forceinline__ void mv_body(MV_ARGS) {
    int slot = blockIdx.y, lane = threadIdx.x & 31;
    int g = blockIdx.x * MV_WARPS + (threadIdx.x >> 5);
    if (!ids && g * MV_ROWS < rows) prefetch_l2(W + (i64)g * MV_ROWS * row_bytes, min(MV_ROWS, rows - g * MV_ROWS) * row_bytes, lane);
    pdl_start();
    i64 e = ids ? ids[slot] : 0;
    if (e < 0) return; // a slot another round of a VRAM expert cache computes
    i64 xr = (slot / x_div) * x_stride;
    // (one row group a warp: a loop over groups here doubles the registers the product holds)
    if (g * MV_ROWS < rows) {
        int r0 = g * MV_ROWS, live = min(MV_ROWS, rows - r0);
        float sum[MV_ROWS];
        dot_any_rows<MV_ROWS>(ty, W + e * mat_bytes + (i64)r0 * row_bytes, row_bytes, live, x + xr, qk ? qk + xr : qk, dk + xr / 32, qz ? qz + xr : qz,
                              dz + xr / 32, cols, lane, sum);
        #pragma unroll
        for (int r = 0; r < MV_ROWS; r++) {
            float v = warp_sum(sum[r]);
            if (lane == 0 && r < live) {
                i64 o = slot * y_stride + r0 + r;
                y[o] = res ? res[o] + v : v;
            }
        }
    }
}
extern "C" __global__ void mv(MV_ARGS) { mv_body(MV_PASS); }

// -DFUSE_NORM=1: `mv` of one row writing the residual stream (a decode step's out or down
// projection, y = x + W·h) followed by the next RMSNorm of that row: the last block to finish
// (count, zero before and after) normalizes y as rms_norm does (norm_row_block: the same bits)
// into xn and its q8 copies. One launch and its gap fewer a norm.
extern "C" __global__ void mv_norm(MV_ARGS, u32* count, const float* nw, float eps, float* xn, i8* yq, float2* yd, i8* yqz, float2* ydz) {
    mv_body(MV_PASS);
    if (!last_block(count, gridDim.x * gridDim.y)) return;
    norm_row_block(y, nw, xn, rows, eps, yq, yd, yqz, ydz);
    if (threadIdx.x == 0) *count = 0;
}

// h[slot][r] = silu(G_e[r]·x) · (U_e[r]·x): an FFN's or expert's gate, up and SwiGLU in one pass.
extern "C" __global__ void mv_glu(const u8* G, const u8* U, int ty_g, int ty_u, int rows, int cols, i64 rb_g, i64 rb_u,
                                  i64 mb_g, i64 mb_u, const int* ids, const float* x, const i8* qk, const float2* dk, const i8* qz,
                                  const float2* dz, i64 x_stride, int x_div, float* h, i64 h_stride) {
    int slot = blockIdx.y;
    int row = blockIdx.x * MV_WARPS + (threadIdx.x >> 5), lane = threadIdx.x & 31;
    if (!ids && row < rows) {
        prefetch_l2(G + (i64)row * rb_g, rb_g, lane);
        prefetch_l2(U + (i64)row * rb_u, rb_u, lane);
    }
    pdl_start();
    if (row >= rows) return;
    i64 e = ids ? ids[slot] : 0;
    if (e < 0) return; // a slot another round of a VRAM expert cache computes
    i64 xr = (slot / x_div) * x_stride;
    const float* xs = x + xr;
    const i8 *qks = qk ? qk + xr : qk, *qzs = qz ? qz + xr : qz;
    float g = dot_any(ty_g, G + e * mb_g + (i64)row * rb_g, xs, qks, dk + xr / 32, qzs, dz + xr / 32, cols, lane);
    float u = dot_any(ty_u, U + e * mb_u + (i64)row * rb_u, xs, qks, dk + xr / 32, qzs, dz + xr / 32, cols, lane);
    g = warp_sum(g);
    u = warp_sum(u);
    if (lane == 0) h[slot * h_stride + row] = g / (1.0f + expf(-g)) * u;
}

// mv_glu_cols' products and SwiGLU for a group of C columns from c0, `live` of them real.
template <int C>
__device__ __forceinline__ void mv_glu_cols_group(int ty_g, const u8* grow, i64 rb_g, int ty_u, const u8* urow, i64 rb_u, int cols, const float* xs, const i8* qks,
                                                  const float2* dks, const i8* qzs, const float2* dzs, i64 x_stride, int live, int lane, float* h, i64 h_stride,
                                                  int c0, int row) {
    float g[C], u[C];
    dot_any_rows<1, C>(ty_g, grow, rb_g, 1, xs, qks, dks, qzs, dzs, cols, lane, g, x_stride, live);
    dot_any_rows<1, C>(ty_u, urow, rb_u, 1, xs, qks, dks, qzs, dzs, cols, lane, u, x_stride, live);
    #pragma unroll
    for (int c = 0; c < C; c++) {
        float gv = warp_sum(g[c]), uv = warp_sum(u[c]);
        if (lane == 0 && c < live) h[(i64)(c0 + c) * h_stride + row] = gv / (1.0f + expf(-gv)) * uv;
    }
}

// h[c][r] = silu(G[r]·x[c]) · (U[r]·x[c]) for a decode batch's n_col rows of x (x_stride values
// apart; h rows h_stride apart): a dense FFN's gate, up and SwiGLU as mv_glu computes each row
// alone, a warp a weight row and MV_COLS batch rows (blocks column group fastest, col_block),
// the weights' words loaded once for all of them.
extern "C" __global__ void mv_glu_cols(const u8* G, const u8* U, int ty_g, int ty_u, int rows, int cols, i64 rb_g, i64 rb_u, const float* x,
                                       const i8* qk, const float2* dk, const i8* qz, const float2* dz, i64 x_stride, int n_col, float* h,
                                       i64 h_stride) {
    int rblk, c0;
    col_block(n_col, MV_COLS, &rblk, &c0);
    int row = rblk * MV_WARPS + (threadIdx.x >> 5), lane = threadIdx.x & 31;
    if (row < rows) {
        prefetch_l2(G + (i64)row * rb_g, rb_g, lane);
        prefetch_l2(U + (i64)row * rb_u, rb_u, lane);
    }
    pdl_start();
    if (row >= rows) return;
    int live = min(MV_COLS, n_col - c0);
    i64 xr = (i64)c0 * x_stride;
    const float* xs = x + xr;
    const i8 *qks = qk ? qk + xr : qk, *qzs = qz ? qz + xr : qz;
#define GLU_COLS_GROUP(CW) \
    mv_glu_cols_group<CW>(ty_g, G + (i64)row * rb_g, rb_g, ty_u, U + (i64)row * rb_u, rb_u, cols, xs, qks, dk + xr / 32, qzs, dz + xr / 32, x_stride, live, lane, h, h_stride, c0, row)
    WITH_COLS(live, GLU_COLS_GROUP);
#undef GLU_COLS_GROUP
}

// Rows a warp of moe_glu takes (gpu.rs `Knobs` defines it; the launch's grid follows).
#ifndef MOE_GLU_ROWS
#define MOE_GLU_ROWS 2
#endif

// A decode step's routed experts' gate, up and SwiGLU (slots blockIdx.y < k, expert ids[slot],
// rows into h[slot]) and the shared expert's (slot k, into hs) in one launch, each row as
// mv_glu computes it. One token: every slot reads the same x. A warp a (row group, matrix):
// warps 2i and 2i + 1 take row group 2·blockIdx.x + i (MOE_GLU_ROWS rows) of the gate and of the
// up matrix, every row's loads in flight at once (dot_rows_q8); the gate's warp applies the
// SwiGLU. blockIdx.z is a decode batch's row: its input row z of x (q8 copies likewise), its
// ids k from z·k, its hidden rows h from z·k·rows and hs from z·rows_s.
extern "C" __global__ void moe_glu(const u8* G, const u8* U, int ty_g, int ty_u, int rows, i64 rb_g, i64 rb_u, i64 mb_g, i64 mb_u, const int* ids, int k,
                                   const u8* SG, const u8* SU, int ty_sg, int ty_su, int rows_s, i64 rb_sg, i64 rb_su, int cols, const float* x,
                                   const i8* qk, const float2* dk, const i8* qz, const float2* dz, float* h, float* hs, u32* count, int kind,
                                   i8* hq, float2* hd, int kind_s, i8* hsq, float2* hsd) {
    constexpr int R = MOE_GLU_ROWS;
    __shared__ float s_up[2][R];
    int slot = blockIdx.y, warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    int r0 = (blockIdx.x * 2 + (warp >> 1)) * R;
    bool up = warp & 1, shared = slot == k;
    {
        i64 t = blockIdx.z, xr = t * cols;
        ids += t * k;
        x += xr;
        if (qk) qk += xr;
        if (qz) qz += xr;
        dk += xr / 32;
        dz += xr / 32;
        h += t * k * rows;
        hs += t * rows_s;
    }
    int live = min(R, (shared ? rows_s : rows) - r0);
    i64 rb = shared ? (up ? rb_su : rb_sg) : (up ? rb_u : rb_g);
    const u8* m_row = nullptr;
    int ty = 0;
    if (shared && live > 0) {
        m_row = (up ? SU : SG) + (i64)r0 * rb;
        ty = up ? ty_su : ty_sg;
        prefetch_l2(m_row, live * rb, lane);
    }
    pdl_start();
    float v[R];
    #pragma unroll
    for (int r = 0; r < R; r++) v[r] = 0.0f;
    if (live > 0) {
        if (!shared) {
            i64 e = ids[slot];
            m_row = up ? U + e * mb_u + (i64)r0 * rb : G + e * mb_g + (i64)r0 * rb;
            ty = up ? ty_u : ty_g;
        }
        dot_any_rows<R>(ty, m_row, rb, live, x, qk, dk, qz, dz, cols, lane, v);
        #pragma unroll
        for (int r = 0; r < R; r++) v[r] = warp_sum(v[r]);
    }
    if (up && lane == 0)
        #pragma unroll
        for (int r = 0; r < R; r++) s_up[warp >> 1][r] = v[r];
    __syncthreads();
    float* out = shared ? hs : h + (i64)slot * rows;
    if (!up && lane == 0)
        #pragma unroll
        for (int r = 0; r < R; r++)
            if (r < live) out[r0 + r] = v[r] / (1.0f + expf(-v[r])) * s_up[warp >> 1][r];
    // -DFUSE_MIDS=1 (count given): the last block of this slot's row quantizes it for the down
    // products, as quant_q8_2 does (quant_row_all: the same blocks, the same bits); the routed
    // slots' rows into hq/hd (kind) at row t·k + slot, the shared expert's into hsq/hsd (kind_s)
    // at row t
    if (!count) return;
    if (!last_block(count + (i64)blockIdx.z * gridDim.y + slot, gridDim.x)) return;
    i64 t = blockIdx.z;
    if (shared) quant_row_all(hs, rows_s, hsq + t * rows_s, hsd + t * (rows_s / 32), kind_s);
    else quant_row_all(out, rows, hq + (t * k + slot) * rows, hd + (t * k + slot) * (rows / 32), kind);
    if (threadIdx.x == 0) count[(i64)blockIdx.z * gridDim.y + slot] = 0;
}

// Routed slots a tile of a decode batch's experts grouped per expert (moe_sort's tile): the
// expert's weights loaded once for them (gpu.rs `Knobs` defines it; the launch's grid follows).
#ifndef MOE_TILE
#define MOE_TILE 4
#endif

// A decode batch's routed experts grouped per expert (moe_sort into tiles of up to MOE_TILE
// slots of one expert: (expert, first, count) into order): gate, up and SwiGLU of each tile's
// slots, each slot's row as moe_glu computes it (dot_rows_q8 with the tile's slots as columns,
// each column gathered from its token's row of x: the bits of the slot alone), the expert's
// words loaded once for the tile. Warps as moe_glu's: 2i and 2i + 1 take row group
// 2·blockIdx.x + i (MOE_GLU_ROWS rows) of the gate and of the up matrix; blockIdx.y a tile
// (an empty one: none). h rows a slot, rows apart.
extern "C" __global__ void moe_glu_tiles(const u8* G, const u8* U, int ty_g, int ty_u, int rows, i64 rb_g, i64 rb_u, i64 mb_g, i64 mb_u, const int4* tiles,
                                         const int* order, int k, int cols, const float* x, const i8* qk, const float2* dk, const i8* qz, const float2* dz,
                                         float* h) {
    constexpr int R = MOE_GLU_ROWS, C = MOE_TILE;
    __shared__ float s_up[2][R * C];
    int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    int r0 = (blockIdx.x * 2 + (warp >> 1)) * R;
    bool up = warp & 1;
    pdl_start();
    int4 tl = tiles[blockIdx.y];
    int ncol = tl.z;
    if (ncol == 0) return;
    const int* ci = order + tl.y;
    int live = min(R, rows - r0);
    float v[R * C];
    #pragma unroll
    for (int i = 0; i < R * C; i++) v[i] = 0.0f;
    if (live > 0) {
        i64 e = tl.x;
        const u8* m_row = up ? U + e * mb_u + (i64)r0 * rb_u : G + e * mb_g + (i64)r0 * rb_g;
        dot_any_rows<R, C>(up ? ty_u : ty_g, m_row, up ? rb_u : rb_g, live, x, qk, dk, qz, dz, cols, lane, v, cols, ncol, ci, k);
        #pragma unroll
        for (int i = 0; i < R * C; i++) v[i] = warp_sum(v[i]);
    }
    if (up && lane == 0)
        #pragma unroll
        for (int i = 0; i < R * C; i++) s_up[warp >> 1][i] = v[i];
    __syncthreads();
    if (up || lane != 0) return;
    #pragma unroll
    for (int c = 0; c < C; c++) {
        if (c >= ncol) break;
        float* out = h + (i64)ci[c] * rows;
        #pragma unroll
        for (int r = 0; r < R; r++) {
            float g = v[r * C + c];
            if (r < live) out[r0 + r] = g / (1.0f + expf(-g)) * s_up[warp >> 1][r * C + c];
        }
    }
}

// y[slot][r] = W_e[r]·x[slot] for a decode batch's routed slots grouped per expert (moe_sort's
// tiles, as moe_glu_tiles): a warp a weight row and a tile's slots, each slot's row as mv
// computes it alone (its own row of x: the experts' hidden rows), the row's words loaded once
// for the tile. blockIdx.y a tile (an empty one: none).
extern "C" __global__ void mv_tiles(const u8* W, int ty, int rows, int cols, i64 row_bytes, i64 mat_bytes, const int4* tiles, const int* order,
                                    const float* x, const i8* qk, const float2* dk, const i8* qz, const float2* dz, float* y, i64 y_stride) {
    constexpr int C = MOE_TILE;
    int row = blockIdx.x * MV_WARPS + (threadIdx.x >> 5), lane = threadIdx.x & 31;
    pdl_start();
    int4 tl = tiles[blockIdx.y];
    int ncol = tl.z;
    if (ncol == 0 || row >= rows) return;
    const int* ci = order + tl.y;
    float sum[C];
    dot_any_rows<1, C>(ty, W + (i64)tl.x * mat_bytes + (i64)row * row_bytes, row_bytes, 1, x, qk, dk, qz, dz, cols, lane, sum, cols, ncol, ci, 1);
    #pragma unroll
    for (int c = 0; c < C; c++) {
        float v = warp_sum(sum[c]);
        if (lane == 0 && c < ncol) y[(i64)ci[c] * y_stride + row] = v;
    }
}

// Up to four products of one input in one launch (a DeltaNet layer's qkv, z, β and α; an
// attention layer's q, k and v): the rows of the parts one after another, a warp a row, each
// row as `mv` computes it. A part with rows = 0 is absent. Over a decode batch of n_col rows
// (inputs cols values apart, outputs rows_i values apart in each y), a warp takes MV_COLS of
// them as mv_cols does (blocks column group fastest): each batch row's bits are its alone. (mv4
// takes one batch row a warp, mv4_cols MV_COLS.) With taps, part 0 is a DeltaNet layer's qkv
// product and each of its outputs is also convolved as conv_step convolves it (conv_channel:
// batch row t's conv state tab's, row_state; its output into conv_out's row t), saving the
// convolution's launch: decode rows only, each row the next token of its own sequence.
template <int C>
__device__ __forceinline__ void mv4_body(int cols, const float* x, const i8* qk, const float2* dk, const i8* qz, const float2* dz,
                               const u8* W0, int ty0, int rows0, i64 rb0, float* y0, const u8* W1, int ty1, int rows1, i64 rb1, float* y1,
                               const u8* W2, int ty2, int rows2, i64 rb2, float* y2, const u8* W3, int ty3, int rows3, i64 rb3, float* y3, int n_col,
                               const float* taps, float* conv_out, int kernel, const unsigned long long* ctab) {
    int rblk, c0;
    col_block(n_col, C, &rblk, &c0);
    int row = rblk * MV_WARPS + (threadIdx.x >> 5), lane = threadIdx.x & 31;
    const u8* W = nullptr;
    int ty = 0;
    i64 rb = 0, ys = 0;
    float* y = nullptr;
    bool conv = taps && row < rows0;
    if (row < rows0) { W = W0; ty = ty0; rb = rb0; y = y0; ys = rows0; }
    else if ((row -= rows0) < rows1) { W = W1; ty = ty1; rb = rb1; y = y1; ys = rows1; }
    else if ((row -= rows1) < rows2) { W = W2; ty = ty2; rb = rb2; y = y2; ys = rows2; }
    else if ((row -= rows2) < rows3) { W = W3; ty = ty3; rb = rb3; y = y3; ys = rows3; }
    if (W) prefetch_l2(W + (i64)row * rb, rb, lane);
    pdl_start();
    if (!W) return;
    int live = min(C, n_col - c0);
    i64 xr = (i64)c0 * cols;
#define MV4_GROUP(CW) \
    cols_group<CW>(ty, W + (i64)row * rb, rb, cols, x + xr, qk ? qk + xr : qk, dk + xr / 32, qz ? qz + xr : qz, dz + xr / 32, cols, live, lane, y, ys, nullptr, c0, row, \
                   conv ? conv_out : nullptr, rows0, taps, kernel, ctab)
    // mv4 (one row) at its own width; mv4_cols at the width its live columns need (WITH_COLS)
    if constexpr (C == 1) MV4_GROUP(1);
    else WITH_COLS(live, MV4_GROUP);
#undef MV4_GROUP
}

#define MV4_ARGS                                                                                                                                   \
    int cols, const float *x, const i8 *qk, const float2 *dk, const i8 *qz, const float2 *dz, const u8 *W0, int ty0, int rows0, i64 rb0, float *y0, \
        const u8 *W1, int ty1, int rows1, i64 rb1, float *y1, const u8 *W2, int ty2, int rows2, i64 rb2, float *y2, const u8 *W3, int ty3, int rows3,   \
        i64 rb3, float *y3, int n_col, const float *taps, float *conv_out, int kernel, const unsigned long long *ctab
#define MV4_PASS cols, x, qk, dk, qz, dz, W0, ty0, rows0, rb0, y0, W1, ty1, rows1, rb1, y1, W2, ty2, rows2, rb2, y2, W3, ty3, rows3, rb3, y3, n_col, taps, conv_out, kernel, ctab
extern "C" __global__ void mv4(MV4_ARGS) { mv4_body<1>(MV4_PASS); }
extern "C" __global__ void mv4_cols(MV4_ARGS) { mv4_body<MV_COLS>(MV4_PASS); }

// y = x / sqrt(mean(x²) + eps) · w, one block a row (ops::rms_norm); where yq is given, y
// quantized as q8_K for the decode products too (quant_q8 kind 0; n % 256 == 0), where yqz is
// given as q8_0 (kind 1). With n / 8 threads (n % 256 == 0, rms_norm_threads) a thread holds
// eight values in registers from its one load to its stores: a decode step's norms are a chain
// of dependent latencies, not of bytes, and this one has no second pass over x.
extern "C" __global__ void rms_norm(const float* x, const float* w, float* y, int n, float eps, i8* yq, float2* yd, i8* yqz, float2* ydz) {
    pdl_start();
    const float* xr = x + (i64)blockIdx.x * n;
    float* yr = y + (i64)blockIdx.x * n;
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
    if (n % 256 == 0 && (int)blockDim.x * 8 == n) {
        int i0 = 8 * threadIdx.x;
        float4 a = *(const float4*)(xr + i0), b = *(const float4*)(xr + i0 + 4);
        float4 wa = *(const float4*)(w + i0), wb = *(const float4*)(w + i0 + 4);
        float v8[8] = {a.x, a.y, a.z, a.w, b.x, b.y, b.z, b.w};
        float w8[8] = {wa.x, wa.y, wa.z, wa.w, wb.x, wb.y, wb.z, wb.w};
        double s = 0.0;
        #pragma unroll
        for (int e = 0; e < 8; e++) s += (double)(v8[e] * v8[e]);
        s = block_sum_d(s);
        float scale = 1.0f / sqrtf((float)(s / n) + eps);
        #pragma unroll
        for (int e = 0; e < 8; e++) v8[e] = (v8[e] * scale) * w8[e];
        *(float4*)(yr + i0) = make_float4(v8[0], v8[1], v8[2], v8[3]);
        *(float4*)(yr + i0 + 4) = make_float4(v8[4], v8[5], v8[6], v8[7]);
        i64 q0 = (i64)blockIdx.x * n;
        if (yq) quant_block_k(v8, lane, yq + q0 + 256 * warp, yd + q0 / 32 + 8 * warp);
        if (yqz) quant_8_z(v8, lane, yqz + q0 + i0, ydz + q0 / 32 + i0 / 32);
        return;
    }
    double s = 0.0;
    for (int i = threadIdx.x; i < n; i += blockDim.x) s += (double)(xr[i] * xr[i]);
    s = block_sum_d(s);
    float scale = 1.0f / sqrtf((float)(s / n) + eps);
    if (yqz)
        for (int b = warp; b < n / 32; b += nw) {
            int i = 32 * b + lane;
            quant_block_z((xr[i] * scale) * w[i], lane, yqz + (i64)blockIdx.x * n + 32 * b, ydz + (i64)blockIdx.x * (n / 32) + b);
        }
    if (!yq) {
        for (int i = threadIdx.x; i < n; i += blockDim.x) yr[i] = (xr[i] * scale) * w[i];
        return;
    }
    for (int b = warp; b < n / 256; b += nw) {
        int i0 = 256 * b + 8 * lane;
        float v8[8];
        #pragma unroll
        for (int e = 0; e < 8; e++) {
            v8[e] = (xr[i0 + e] * scale) * w[i0 + e];
            yr[i0 + e] = v8[e];
        }
        quant_block_k(v8, lane, yq + (i64)blockIdx.x * n + 256 * b, yd + (i64)blockIdx.x * (n / 32) + 8 * b);
    }
}

// x[t] = row ids[t] of the embedding matrix, dequantized; blockIdx.y = t.
extern "C" __global__ void embed(const u8* E, int ty, int cols, i64 row_bytes, const int* ids, float* x) {
    pdl_start();
    const u8* row = E + (i64)ids[blockIdx.y] * row_bytes;
    float* xt = x + (i64)blockIdx.y * cols;
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < cols; i += gridDim.x * blockDim.x) xt[i] = deq1(ty, row, i);
}

// Gated attention's heads of token blockIdx.y at position step[0] + blockIdx.y: q (from qg's per-head [q | gate]) and k RMS-normed
// and roped (NeoX pairs over n_rot dims, `still` pairs held: interleaved M-RoPE's text rows); k
// and v written to the f16 caches' row step[0]. One block a head, one thread a dim. With tab, a
// decode batch: token t at row_pos[t], its caches tab's (row_state).
extern "C" __global__ void attn_heads(const float* qg, const float* k, const float* v, const float* q_norm, const float* k_norm,
                                      const int* still, const int* step, float* q_out, u16* k_cache, u16* v_cache,
                                      int n_head, int n_head_kv, int hd, int n_rot, float theta_scale, float eps,
                                      const int* row_pos, const unsigned long long* tab) {
    int b = blockIdx.x, i = threadIdx.x, t = blockIdx.y;
    k_cache = (u16*)row_state(tab, t, 0, k_cache);
    v_cache = (u16*)row_state(tab, t, 1, v_cache);
    int pos = row_pos ? row_pos[t] : -1;
    pdl_start();
    extern __shared__ float sh[];
    if (!row_pos) pos = step[0] + t;
    int kvw = n_head_kv * hd;
    qg += (i64)t * n_head * 2 * hd;
    k += (i64)t * kvw;
    v += (i64)t * kvw;
    q_out += (i64)t * n_head * hd;
    bool is_q = b < n_head;
    int h = is_q ? b : b - n_head;
    const float* src = is_q ? qg + (i64)h * 2 * hd : k + (i64)h * hd;
    const float* w = is_q ? q_norm : k_norm;
    float xv = i < hd ? src[i] : 0.0f;
    double s = block_sum_d(i < hd ? (double)(xv * xv) : 0.0);
    float scale = 1.0f / sqrtf((float)(s / hd) + eps);
    if (i < hd) sh[i] = (xv * scale) * w[i];
    __syncthreads();
    if (i >= hd) return;
    int half = n_rot / 2;
    float out = sh[i];
    if (i < n_rot) {
        int p = i < half ? i : i - half;
        float c = 1.0f, sn = 0.0f;
        if (!(still && still[p])) {
            float theta = (float)pos * powf(theta_scale, (float)p);
            c = cosf(theta);
            sn = sinf(theta);
        }
        float x0 = sh[p], x1 = sh[p + half];
        out = i < half ? fmaf(x0, c, -(x1 * sn)) : fmaf(x0, sn, x1 * c);
    }
    if (is_q) {
        q_out[(i64)h * hd + i] = out;
    } else {
        k_cache[(i64)pos * kvw + (i64)h * hd + i] = f2h(out);
        v_cache[(i64)pos * kvw + (i64)h * hd + i] = f2h(v[(i64)h * hd + i]);
    }
}

#define ATTN_WARPS 4

// Split-KV attention: the n = step[0] + t + 1 positions token t sees (causal) are cut into
// gridDim.y equal chunks of ceil(n / gridDim.y), so every split has work at any depth (a
// chunk per fixed 256 positions left most blocks idle and each busy one 64 positions a warp
// deep, ~60 µs a layer at 600 positions); block (head, split, token t) takes its chunk, each
// warp an online softmax over its positions, merged in the block; the partial (max, sum,
// unnormalized output) goes to `part` for attn_merge. A row's chunks follow its own position
// only (batch invariance). hd ≤ 256. With tab, a decode batch: token t at row_pos[t], its
// caches tab's (row_state).
extern "C" __global__ void attn_split(const float* q, const u16* k_cache, const u16* v_cache, const int* step, float* part_o,
                                      float* part_ml, int n_head, int n_head_kv, int hd, float scale, const int* row_pos,
                                      const unsigned long long* tab) {
    int h = blockIdx.x, sp = blockIdx.y, n_split = gridDim.y, t = blockIdx.z;
    k_cache = (const u16*)row_state(tab, t, 0, (void*)k_cache);
    v_cache = (const u16*)row_state(tab, t, 1, (void*)v_cache);
    int n_kv = row_pos ? row_pos[t] + 1 : 0;
    pdl_start();
    __shared__ float s_o[ATTN_WARPS][256];
    __shared__ float s_m[ATTN_WARPS], s_l[ATTN_WARPS];
    int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    if (!row_pos) n_kv = step[0] + t + 1;
    int chunk = (n_kv + n_split - 1) / n_split;
    int p0 = sp * chunk, p1 = min(p0 + chunk, n_kv);
    i64 pi = ((i64)t * n_head + h) * n_split + sp;
    q += (i64)t * n_head * hd;
    if (p0 >= n_kv) {
        if (threadIdx.x == 0) {
            part_ml[2 * pi] = NEG_INF;
            part_ml[2 * pi + 1] = 0.0f;
        }
        return;
    }
    int kvh = h / (n_head / n_head_kv), kvw = n_head_kv * hd, E = hd / 32;
    float qr[8], acc[8];
    EACH_E {
        qr[e] = q[(i64)h * hd + lane + 32 * e];
        acc[e] = 0.0f;
    }
    float m = NEG_INF, l = 0.0f;
    for (int p = p0 + warp; p < p1; p += ATTN_WARPS) {
        const u16* kr = k_cache + (i64)p * kvw + (i64)kvh * hd;
        float d = 0.0f;
        EACH_E d += qr[e] * h2f(kr[lane + 32 * e]);
        float s = warp_sum(d) * scale;
        float mn = fmaxf(m, s);
        float a = expf(m - mn), pw = expf(s - mn);
        const u16* vr = v_cache + (i64)p * kvw + (i64)kvh * hd;
        EACH_E acc[e] = acc[e] * a + pw * h2f(vr[lane + 32 * e]);
        l = l * a + pw;
        m = mn;
    }
    EACH_E s_o[warp][lane + 32 * e] = acc[e];
    if (lane == 0) {
        s_m[warp] = m;
        s_l[warp] = l;
    }
    __syncthreads();
    float mm = NEG_INF;
    for (int w = 0; w < ATTN_WARPS; w++) mm = fmaxf(mm, s_m[w]);
    for (int i = threadIdx.x; i < hd; i += blockDim.x) {
        float o = 0.0f;
        for (int w = 0; w < ATTN_WARPS; w++)
            if (s_m[w] > NEG_INF) o += s_o[w][i] * expf(s_m[w] - mm);
        part_o[pi * hd + i] = o;
    }
    if (threadIdx.x == 0) {
        float ll = 0.0f;
        for (int w = 0; w < ATTN_WARPS; w++)
            if (s_m[w] > NEG_INF) ll += s_l[w] * expf(s_m[w] - mm);
        part_ml[2 * pi] = mm;
        part_ml[2 * pi + 1] = ll;
    }
}

// Merges a head's splits and applies the output gate: out = softmax·V ⊙ sigmoid(gate), the gate
// the second half of qg's per-head [q | gate]. One block a (head, token); where yq is given, a
// block of 256 threads takes 256 / hd heads and also quantizes their 256 outputs for the output
// projection (q8_K, as quant_q8 kind 0).
extern "C" __global__ void attn_merge(const float* part_o, const float* part_ml, const float* qg, float* out, int hd, int n_split, i8* yq, float2* yd,
                                      i8* yqz, float2* ydz) {
    pdl_start();
    __shared__ __align__(16) float s_y[256];
    bool quant = yq || yqz;
    int G = quant ? 256 / hd : 1;
    int g = quant ? threadIdx.x / hd : 0, tl = quant ? threadIdx.x % hd : threadIdx.x, stride = quant ? hd : blockDim.x;
    int t = blockIdx.y, n_head = gridDim.x * G;
    int h = t * n_head + blockIdx.x * G + g;  // (token, head) as one index: parts, qg rows and out rows follow it
    float mm = NEG_INF;
    for (int s = 0; s < n_split; s++) mm = fmaxf(mm, part_ml[2 * ((i64)h * n_split + s)]);
    for (int i = tl; i < hd; i += stride) {
        float o = 0.0f, l = 0.0f;
        for (int s = 0; s < n_split; s++) {
            i64 pi = (i64)h * n_split + s;
            float ms = part_ml[2 * pi];
            if (ms == NEG_INF) continue;
            float f = expf(ms - mm);
            o += part_o[pi * hd + i] * f;
            l += part_ml[2 * pi + 1] * f;
        }
        float gt = qg[(i64)h * 2 * hd + hd + i];
        float v = (o / l) * (1.0f / (1.0f + expf(-gt)));
        out[(i64)h * hd + i] = v;
        if (quant) s_y[g * hd + i] = v;
    }
    if (!quant) return;
    __syncthreads();
    quant_256(s_y, ((i64)t * n_head + (i64)blockIdx.x * G) * hd, yq, yd, yqz, ydz);
}

// The causal depthwise convolution of n_tok new rows against the conv state, then SiLU, token
// after token; the state shifts a row each (rowwise::conv_silu). taps are tap-major [kernel][cd].
// With tab, blockIdx.y is a decode batch's row (n_tok = 1): its input and output rows y, its
// state tab's (row_state). With hist (a verify's rows of one sequence, n_tok of them), the state
// after token t < n_tok − 1 is also written to hist[2t] (the state before row t + 1, kept for a
// rollback).
extern "C" __global__ void conv_step(const float* x, float* state, const float* taps, float* out, int cd, int kernel, int n_tok,
                                     const unsigned long long* tab, const unsigned long long* hist) {
    int t0 = blockIdx.y;
    state = (float*)row_state(tab, t0, 0, state);
    x += (i64)t0 * cd;
    out += (i64)t0 * cd;
    pdl_start();
    int c = blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= cd) return;
    for (int t = 0; t < n_tok; t++) {
        out[(i64)t * cd + c] = conv_channel(state, taps, x[(i64)t * cd + c], cd, c, kernel);
        if (hist && t + 1 < n_tok) {
            float* h = (float*)hist[2 * t];
            for (int j = 0; j < kernel - 1; j++) h[(i64)j * cd + c] = state[(i64)j * cd + c];
        }
    }
}

// conv_step for a prompt pass, every (token, channel) at once: token t's window is inputs
// t − (kernel − 1) … t, those before the pass from the state; the same sums in the same order
// as conv_step's. conv_shift then moves the pass's last kernel − 1 inputs into the state.
// With row_off, a pass of several sequences' spans back to back: row t is token row_off[t] of
// its span, whose window stops at the span's start, and its state is tab's (row_state).
extern "C" __global__ void conv_prompt(const float* x, const float* state, const float* taps, float* out, int cd, int kernel, int n_tok,
                                       const int* row_off, const unsigned long long* tab) {
    pdl_start();
    i64 i = (i64)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= (i64)n_tok * cd) return;
    int t = (int)(i / cd), c = (int)(i % cd);
    int tl = row_off ? row_off[t] : t;
    state = (const float*)row_state(tab, t, 0, (void*)state);
    float acc = 0.0f;
    for (int j = 0; j < kernel - 1; j++) {
        int src = tl - (kernel - 1) + j;
        float v = src < 0 ? state[(i64)(kernel - 1 + src) * cd + c] : x[(i64)(t - tl + src) * cd + c];
        acc = __fmaf_rn(v, taps[(i64)j * cd + c], acc);
    }
    acc = __fmaf_rn(x[(i64)t * cd + c], taps[(i64)(kernel - 1) * cd + c], acc);
    out[i] = acc / (1.0f + expf(-acc));
}

// state[j] ← input n_tok − (kernel − 1) + j of the pass (or the older state row where that is
// before it); row j is written after every read of rows above it, so in place. With seg, span
// blockIdx.y of a pass of several: its (first row, tokens) seg's, its state tab's at its first row.
extern "C" __global__ void conv_shift(const float* x, float* state, int cd, int kernel, int n_tok, const int2* seg, const unsigned long long* tab) {
    pdl_start();
    if (seg) {
        int2 sg = seg[blockIdx.y];
        x += (i64)sg.x * cd;
        n_tok = sg.y;
        state = (float*)row_state(tab, sg.x, 0, state);
    }
    int c = blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= cd) return;
    for (int j = 0; j < kernel - 1; j++) {
        int src = n_tok - (kernel - 1) + j;
        state[(i64)j * cd + c] = src < 0 ? state[(i64)(kernel - 1 + src) * cd + c] : x[(i64)src * cd + c];
    }
}

// q and k of a K-head L2-normed as build_gdn_l2_norm norms them (sums of squares in f64, eps
// scaled by 1/sd) and scaled by 1/√sd, E = sd / 32 values a lane: the DeltaNet step, the prompt
// scan's prep and the decode scan all take them from here, so their bits agree.
__device__ __forceinline__ void delta_qk(const float* q, const float* k, int sd, float eps, int lane, float* qr, float* kr) {
    int E = sd / 32;
    double sq = 0.0, sk = 0.0;
    EACH_E {
        qr[e] = q[lane + 32 * e];
        kr[e] = k[lane + 32 * e];
        sq += (double)(qr[e] * qr[e]);
        sk += (double)(kr[e] * kr[e]);
    }
    sq = warp_sum_d(sq);
    sk = warp_sum_d(sk);
    float n = (float)sd, post = 1.0f / sqrtf(n);
    float scq = 1.0f / sqrtf((float)(sq / sd) + eps / n), sck = 1.0f / sqrtf((float)(sk / sd) + eps / n);
    EACH_E {
        qr[e] = (qr[e] * scq) * post;
        kr[e] = (kr[e] * sck) * post;
    }
}

// A V-head's gates: β = sigmoid(β_in), decay = e^g with g = softplus(α + dt)·a.
__device__ __forceinline__ void delta_gates(float beta_in, float alpha_in, float dt, float a, float* beta, float* decay) {
    *beta = 1.0f / (1.0f + expf(-beta_in));
    float gx = alpha_in + dt;
    float sp = gx > 20.0f ? gx : logf(1.0f + expf(gx));
    *decay = expf(sp * a);
}

#define DELTA_WARPS 8

// A token of Gated DeltaNet for V-head blockIdx.x: q and k of its K-head L2-normed, β =
// sigmoid, g = softplus(α + dt)·a; S ← S·e^g; d = (v − S k)·β; S ← S + d kᵀ; o = S q / √sd; then
// the gated output norm o ← rms_norm(o)·w ⊙ silu(z). S is [sd rows (value)][sd cols (key)].
// sd ≤ 256, a multiple of 32.
__device__ void delta_token(const float* conv, const float* z, const float* beta_in, const float* alpha_in,
                            const float* dt_bias, const float* a, float* S, const float* norm_w, float* out,
                            int hk, int hv, int sd, int tiled, float eps, float* s_o) {
    int h = blockIdx.x, warp = threadIdx.x >> 5, lane = threadIdx.x & 31, E = sd / 32;
    int kh = tiled ? h % hk : h / (hv / hk);
    const float* q = conv + (i64)kh * sd;
    const float* k = conv + (i64)hk * sd + (i64)kh * sd;
    const float* v = conv + 2 * (i64)hk * sd + (i64)h * sd;
    float qr[8], kr[8], beta, decay;
    delta_qk(q, k, sd, eps, lane, qr, kr);
    delta_gates(beta_in[h], alpha_in[h], dt_bias[h], a[h], &beta, &decay);
    float n = (float)sd, oscale = 1.0f / sqrtf(n);
    float* Sh = S + (i64)h * sd * sd;
    for (int j = warp; j < sd; j += DELTA_WARPS) {
        float* row = Sh + (i64)j * sd;
        float s[8], kv = 0.0f;
        EACH_E {
            s[e] = row[lane + 32 * e] * decay;
            kv += s[e] * kr[e];
        }
        kv = warp_sum(kv);
        float d = (v[j] - kv) * beta;
        float o = 0.0f;
        EACH_E {
            s[e] += d * kr[e];
            row[lane + 32 * e] = s[e];
            o += s[e] * qr[e];
        }
        o = warp_sum(o);
        if (lane == 0) s_o[j] = o * oscale;
    }
    __syncthreads();
    double ss = 0.0;
    for (int i = threadIdx.x; i < sd; i += blockDim.x) ss += (double)(s_o[i] * s_o[i]);
    ss = block_sum_d(ss);
    float scale = 1.0f / sqrtf((float)(ss / sd) + eps);
    for (int i = threadIdx.x; i < sd; i += blockDim.x) {
        float zv = z[(i64)h * sd + i];
        out[(i64)h * sd + i] = ((s_o[i] * scale) * norm_w[i]) * (zv / (1.0f + expf(-zv)));
    }
}

// n_tok tokens in order: each warp keeps its rows of S from token to token, so only s_o is
// shared between them.
extern "C" __global__ void delta_step(const float* conv, const float* z, const float* beta_in, const float* alpha_in,
                                      const float* dt_bias, const float* a, float* S, const float* norm_w, float* out,
                                      int hk, int hv, int sd, int tiled, float eps, int n_tok) {
    pdl_start();
    __shared__ float s_o[256];
    int cd = 2 * hk * sd + hv * sd;
    for (int t = 0; t < n_tok; t++) {
        delta_token(conv + (i64)t * cd, z + (i64)t * hv * sd, beta_in + (i64)t * hv, alpha_in + (i64)t * hv, dt_bias, a, S, norm_w,
                    out + (i64)t * hv * sd, hk, hv, sd, tiled, eps, s_o);
        __syncthreads();
    }
}

// A softmax router's top-k (route::route_with, softmax, no bias): probabilities, the k largest
// (ties to the lower id), renormalized (f64 sum, clamped) and scaled. One block a token.
extern "C" __global__ void moe_route(const float* logits, int n_expert, int k, int norm_w, float w_scale, int* ids, float* weights) {
    pdl_start();
    extern __shared__ float p[];
    logits += (i64)blockIdx.x * n_expert;
    ids += (i64)blockIdx.x * k;
    weights += (i64)blockIdx.x * k;
    __shared__ float s_v[32];
    __shared__ int s_i[32];
    __shared__ float s_max;
    int t = threadIdx.x, lane = t & 31, w = t >> 5, nw = (blockDim.x + 31) >> 5;
    float mx = NEG_INF;
    for (int i = t; i < n_expert; i += blockDim.x) mx = fmaxf(mx, logits[i]);
    mx = warp_max(mx);
    if (lane == 0) s_v[w] = mx;
    __syncthreads();
    if (t == 0) {
        float m = NEG_INF;
        for (int i = 0; i < nw; i++) m = fmaxf(m, s_v[i]);
        s_max = m;
    }
    __syncthreads();
    double sum = 0.0;
    for (int i = t; i < n_expert; i += blockDim.x) {
        float e = expf(logits[i] - s_max);
        p[i] = e;
        sum += e;
    }
    sum = block_sum_d(sum);
    float inv = (float)(1.0 / sum);
    for (int i = t; i < n_expert; i += blockDim.x) p[i] *= inv;
    __syncthreads();
    for (int r = 0; r < k; r++) {
        float bv = NEG_INF;
        int bi = 0x7fffffff;
        for (int i = t; i < n_expert; i += blockDim.x) {
            float v = p[i];
            if (v > bv || (v == bv && i < bi)) { bv = v; bi = i; }
        }
        for (int o = 16; o > 0; o >>= 1) {
            float ov = __shfl_xor_sync(0xffffffffu, bv, o);
            int oi = __shfl_xor_sync(0xffffffffu, bi, o);
            if (ov > bv || (ov == bv && oi < bi)) { bv = ov; bi = oi; }
        }
        if (lane == 0) { s_v[w] = bv; s_i[w] = bi; }
        __syncthreads();
        if (t == 0) {
            float v = s_v[0];
            int id = s_i[0];
            for (int i = 1; i < nw; i++)
                if (s_v[i] > v || (s_v[i] == v && s_i[i] < id)) { v = s_v[i]; id = s_i[i]; }
            ids[r] = id;
            weights[r] = v;
            p[id] = NEG_INF;
        }
        __syncthreads();
    }
    if (t == 0) {
        if (norm_w) {
            double s = 0.0;
            for (int r = 0; r < k; r++) s += weights[r];
            float sf = fmaxf((float)s, 6.103515625e-5f);
            for (int r = 0; r < k; r++) weights[r] /= sf;
        }
        if (w_scale != 0.0f && w_scale != 1.0f)
            for (int r = 0; r < k; r++) weights[r] *= w_scale;
    }
}

// The router's top-k reduction by __reduce_max / __reduce_min (1) or by shuffle rounds (0): the
// same pick either way (gpu.rs `Knobs`; measured on an H100: 35B-A3B tg128 +2.3%).
#ifndef ROUTE_REDUX
#define ROUTE_REDUX 1
#endif

// moe_route_warp's work for one token, a warp's: its n_expert logits (read through L2: another
// block of the same grid may have written them, see mv4_route) into k ids and weights.
__device__ __forceinline__ void route_token(const float* logits, int n_expert, int k, int norm_w, float w_scale, int* ids, float* weights, int lane) {
    float p[16];
    float mx = NEG_INF;
    #pragma unroll
    for (int e = 0; e < 16; e++) {
        int i = lane + 32 * e;
        p[e] = i < n_expert ? __ldcg(logits + i) : NEG_INF;
        mx = fmaxf(mx, p[e]);
    }
    mx = warp_max(mx);
    double sum = 0.0;
    #pragma unroll
    for (int e = 0; e < 16; e++) {
        int i = lane + 32 * e;
        p[e] = i < n_expert ? expf(p[e] - mx) : 0.0f;
        sum += p[e];
    }
    sum = warp_sum_d(sum);
    float inv = (float)(1.0 / sum);
    #pragma unroll
    for (int e = 0; e < 16; e++) p[e] = lane + 32 * e < n_expert ? p[e] * inv : NEG_INF;
    double wsum = 0.0;
    float picked = 0.0f;
    for (int r = 0; r < k; r++) {
        float bv = NEG_INF;
        int bi = 0x7fffffff;
        #pragma unroll
        for (int e = 0; e < 16; e++) {
            int i = lane + 32 * e;
            if (p[e] > bv || (p[e] == bv && i < bi)) { bv = p[e]; bi = i; }
        }
#if ROUTE_REDUX && __CUDA_ARCH__ >= 800
        // (a knob, XWEN_CUDA_DEFINES=-DROUTE_REDUX=0 for the shuffle rounds) the warp's best in
        // two reductions instead of five shuffle rounds, the same pick: probabilities are ≥ 0, so their
        // bits order as they do (+1: a taken or absent entry ranks below 0.0), then the lowest
        // index among the lanes that hold that value
        u32 key = bv >= 0.0f ? __float_as_uint(bv) + 1u : 0u;
        u32 top = __reduce_max_sync(0xffffffffu, key);
        bi = (int)__reduce_min_sync(0xffffffffu, key == top ? (u32)bi : 0xffffffffu);
        bv = top ? __uint_as_float(top - 1u) : NEG_INF;
#else
        for (int o = 16; o > 0; o >>= 1) {
            float ov = __shfl_xor_sync(0xffffffffu, bv, o);
            int oi = __shfl_xor_sync(0xffffffffu, bi, o);
            if (ov > bv || (ov == bv && oi < bi)) { bv = ov; bi = oi; }
        }
#endif
        #pragma unroll
        for (int e = 0; e < 16; e++)
            if (lane + 32 * e == bi) p[e] = NEG_INF;
        if (lane == r) picked = bv;
        if (lane == 0) ids[r] = bi;
        wsum += bv;
    }
    // k ≤ 32 (host-checked): lane r holds pick r
    float w = picked;
    if (norm_w) w /= fmaxf((float)wsum, 6.103515625e-5f);
    if (w_scale != 0.0f && w_scale != 1.0f) w *= w_scale;
    if (lane < k) weights[lane] = w;
}

// moe_route for up to 512 experts in one warp (16 a lane, in registers): no block barriers
// between the k picks. The same picks (ties to the lower id) and weights up to the order of
// the softmax's double sum. One warp a token.
extern "C" __global__ void moe_route_warp(const float* logits, int n_expert, int k, int norm_w, float w_scale, int* ids, float* weights) {
    pdl_start();
    i64 t = blockIdx.x;
    route_token(logits + t * n_expert, n_expert, k, norm_w, w_scale, ids + t * k, weights + t * k, threadIdx.x);
}

// mv4 / mv4_cols whose part 0 is a MoE layer's router, with the router's top-k in the same
// launch (-DFUSE_ROUTE=1): the last block to finish (count, zero before and after) routes each
// of the n_col tokens from the logits every block wrote, a warp a token (route_token: the
// picks and weights of moe_route_warp, which the same logits give bit for bit). One launch and
// its gap fewer a MoE layer of a decode step.
template <int C>
__device__ __forceinline__ void mv4_route_body(MV4_ARGS, u32* count, int k, int norm_w, float w_scale, int* ids, float* weights) {
    mv4_body<C>(MV4_PASS);
    if (!last_block(count, gridDim.x * gridDim.y)) return;
    int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    for (int t = warp; t < n_col; t += blockDim.x >> 5)
        route_token(y0 + (i64)t * rows0, rows0, k, norm_w, w_scale, ids + (i64)t * k, weights + (i64)t * k, lane);
    if (threadIdx.x == 0) *count = 0;
}
#define MV4_ROUTE_ARGS MV4_ARGS, u32 *count, int k, int norm_w, float w_scale, int *ids, float *weights
#define MV4_ROUTE_PASS MV4_PASS, count, k, norm_w, w_scale, ids, weights
extern "C" __global__ void mv4_route(MV4_ROUTE_ARGS) { mv4_route_body<1>(MV4_ROUTE_PASS); }
extern "C" __global__ void mv4_cols_route(MV4_ROUTE_ARGS) { mv4_route_body<MV_COLS>(MV4_ROUTE_PASS); }

// x ← x + (Σ_s w_s·ys[s] + sigmoid(sg)·shared) — a MoE layer's weighted sum (slot order, each
// product rounded), its shared expert's gate and the residual add, token blockIdx.y. shared may
// be null.
extern "C" __global__ void moe_combine(float* x, const float* ys, const float* weights, int k, int n, const float* shared, const float* sg) {
    pdl_start();
    int i = blockIdx.x * blockDim.x + threadIdx.x, t = blockIdx.y;
    if (i >= n) return;
    x += (i64)t * n;
    ys += (i64)t * k * n;
    weights += (i64)t * k;
    if (shared) shared += (i64)t * n;
    if (sg) sg += t;
    float f = __fmul_rn(weights[0], ys[i]);
    for (int s = 1; s < k; s++) f = __fadd_rn(f, __fmul_rn(weights[s], ys[(i64)s * n + i]));
    if (shared) {
        float g = sg ? 1.0f / (1.0f + expf(-sg[0])) : 1.0f;
        f = __fadd_rn(f, __fmul_rn(g, shared[i]));
    }
    x[i] = __fadd_rn(x[i], f);
}

// Rows a block of moe_down_combine takes (gpu.rs `Knobs` defines it; the launch's grid follows).
#ifndef MOE_DOWN_ROWS
#define MOE_DOWN_ROWS 2
#endif

// A decode step's MoE output in one launch: x[r] ← x[r] + (Σ_s w_s·(D_{ids[s]}[r]·h[s]) +
// sigmoid(sg)·(S[r]·hs)) — the routed experts' down products, the shared expert's, the weighted
// sum and the residual, each term computed and rounded as `mv` and moe_combine compute them
// (the same bits). A block MOE_DOWN_ROWS rows: warp s < k takes slot s's expert rows, warp k
// the shared expert's (S null: none; sg null: ungated), each warp all its rows' loads in flight
// at once (dot_rows_q8); thread t then sums row t's k + 1 terms in slot order. h holds the k
// slots' rows (cols values each), hs the shared expert's. blockIdx.y is a decode batch's row t:
// its ids and weights k from t·k, h (and its q8 copies) from t·k·cols, hs from t·cols_s, sg[t],
// x's row t.
// ids is read before pdl_start, through L2: the router wrote it at least two launches before
// this one (the expert gate/up launch sits between), and that launch's blocks all passed their
// wait — the router had finished — before this grid could start. So the rows this step reads
// are pulled into L2 while its predecessor still runs.
#define MDC_ARGS                                                                                                                                     \
    const u8 *D, int ty, int rows, int cols, i64 rb, i64 mb, const int *ids, const float *weights, int k, const float *h, const i8 *qk, const float2 *dk, \
        const i8 *qz, const float2 *dz, const u8 *S, int ty_s, int cols_s, i64 rb_s, const float *hs, const i8 *qks, const float2 *dks, const i8 *qzs,       \
        const float2 *dzs, const float *sg, float *x
#define MDC_PASS D, ty, rows, cols, rb, mb, ids, weights, k, h, qk, dk, qz, dz, S, ty_s, cols_s, rb_s, hs, qks, dks, qzs, dzs, sg, x
__device__ __forceinline__ void moe_down_combine_body(MDC_ARGS) {
    constexpr int RD = MOE_DOWN_ROWS;
    __shared__ float ys[33][RD];
    int r0 = blockIdx.x * RD, s = threadIdx.x >> 5, lane = threadIdx.x & 31;
    {
        i64 t = blockIdx.y, xr = t * k * cols, sr = t * cols_s;
        ids += t * k;
        weights += t * k;
        h += xr;
        if (qk) qk += xr;
        if (qz) qz += xr;
        dk += xr / 32;
        dz += xr / 32;
        hs += sr;
        if (qks) qks += sr;
        if (qzs) qzs += sr;
        dks += sr / 32;
        dzs += sr / 32;
        if (sg) sg += t;
        x += t * rows;
    }
    int live = min(RD, rows - r0);
    const u8* w = nullptr;
    i64 wb = 0;
    if (s < k) {
        w = D + (i64)__ldcg(ids + s) * mb + (i64)r0 * rb;
        wb = rb;
    } else if (s == k && S) {
        w = S + (i64)r0 * rb_s;
        wb = rb_s;
    }
    if (w) prefetch_l2(w, live * wb, lane);
    pdl_start();
    if (w) {
        i64 xr = (i64)s * cols;
        const float* xf = s < k ? h + xr : hs;
        const i8* xk = s < k ? (qk ? qk + xr : qk) : qks;
        const float2* xdk = s < k ? dk + xr / 32 : dks;
        const i8* xz = s < k ? (qz ? qz + xr : qz) : qzs;
        const float2* xdz = s < k ? dz + xr / 32 : dzs;
        int t = s < k ? ty : ty_s, c = s < k ? cols : cols_s;
        float y[RD];
        dot_any_rows<RD>(t, w, wb, live, xf, xk, xdk, xz, xdz, c, lane, y);
        #pragma unroll
        for (int r = 0; r < RD; r++) {
            float v = warp_sum(y[r]);
            if (lane == 0) ys[s][r] = v;
        }
    }
    __syncthreads();
    int t = threadIdx.x;
    if (t >= live) return;
    float f = 0.0f;
    for (int q = 0; q < k; q++) f = q == 0 ? __fmul_rn(weights[0], ys[0][t]) : __fadd_rn(f, __fmul_rn(weights[q], ys[q][t]));
    if (S) {
        float gt = sg ? 1.0f / (1.0f + expf(-sg[0])) : 1.0f;
        f = __fadd_rn(f, __fmul_rn(gt, ys[k][t]));
    }
    x[r0 + t] = __fadd_rn(x[r0 + t], f);
}
extern "C" __global__ void moe_down_combine(MDC_ARGS) { moe_down_combine_body(MDC_PASS); }

// -DFUSE_NORM=1: moe_down_combine followed by the next RMSNorm of each decode row (the next
// layer's input norm, or the output norm): the last block of row blockIdx.y (count[y], zero
// before and after) normalizes it as rms_norm does (norm_row_block: the same bits) into row y
// of xn and of its q8 copies.
extern "C" __global__ void moe_down_combine_norm(MDC_ARGS, u32* count, const float* nw, float eps, float* xn, i8* yq, float2* yd, i8* yqz, float2* ydz) {
    moe_down_combine_body(MDC_PASS);
    i64 t = blockIdx.y;
    if (!last_block(count + t, gridDim.x)) return;
    norm_row_block(x + t * rows, nw, xn + t * rows, rows, eps, yq ? yq + t * rows : yq, yd + t * (rows / 32), yqz ? yqz + t * rows : yqz, ydz + t * (rows / 32));
    if (threadIdx.x == 0) count[t] = 0;
}

// Tokens a greedy row's argmax may skip at most (forward.rs MAX_BANS).
#define MAX_BANS 16

// (v, i) ← the better of (v, i) and (ov, oi): the larger value, the first index of equals.
__device__ __forceinline__ void arg_better(float* v, int* i, float ov, int oi) {
    if (ov > *v || (ov == *v && oi < *i)) { *v = ov; *i = oi; }
}

// (m, s) ← the merge of two online-softmax partials: m the larger maximum, s the sum of
// exp(v − m) over both stretches. An empty stretch is (−inf, 0).
__device__ __forceinline__ void max_sum_merge(float* m, float* s, float om, float os) {
    float mn = fmaxf(*m, om);
    if (mn == NEG_INF) return;
    *s = *s * expf(*m - mn) + os * expf(om - mn);
    *m = mn;
}

// A block's merge of its threads' pairs (a, b) by `merge` — across each warp by shuffles, then
// over the warps by thread 0 in warp order — to thread 0. (Each merge a type of its own: its
// shared words are its own.)
template <typename A, typename B, typename M>
__device__ __forceinline__ void block_merge(A* a, B* b, M merge) {
    __shared__ A s_a[32];
    __shared__ B s_b[32];
    int t = threadIdx.x, lane = t & 31, w = t >> 5, nw = (blockDim.x + 31) >> 5;
    for (int o = 16; o > 0; o >>= 1) merge(a, b, __shfl_xor_sync(0xffffffffu, *a, o), __shfl_xor_sync(0xffffffffu, *b, o));
    if (lane == 0) { s_a[w] = *a; s_b[w] = *b; }
    __syncthreads();
    if (t == 0)
        for (int i = 1; i < nw; i++) merge(a, b, s_a[i], s_b[i]);
}

// A block's best (value, index) of its threads' (bv, bi), to thread 0.
__device__ void block_argmax(float* bv, int* bi) {
    block_merge(bv, bi, [](float* v, int* i, float ov, int oi) { arg_better(v, i, ov, oi); });
}

// A block's merged (max, sum) of its threads' partials, to thread 0.
__device__ void block_max_sum(float* m, float* s) {
    block_merge(m, s, [](float* m, float* s, float om, float os) { max_sum_merge(m, s, om, os); });
}

// The first index of the largest value (greedy sampling), into out[0]. Each block takes a
// stretch of v; with more than one block, each writes its best to part_v/part_i, and the last
// block to finish (count, zero before and after) picks among them in block order — the same
// answer for any grid, as ties go to the first index. blockIdx.y is a row of v (n values), its
// answer out[y], its parts gridDim.x from y·gridDim.x, its counter count[y]. With bans (n_bans
// a row, from y·n_bans; negative entries none): the indices a greedy sampler bans are skipped
// (ops::argmax_except; every index banned: 0).
// With `answer` (one row, no bans: an MTP draft step's, model/mtp.rs): also the probability
// softmax gives the pick, 1 / Σ exp(v − max) (each block's online (max, sum) in part_ms, merged
// by the last), written into `answer` as the drafter reads it back — the h values of `hidden`,
// the probability, the token's bits: one copy — without a second pass over the logits (a 248k
// vocabulary's in one block took ~0.1 ms a draft step).
__device__ __forceinline__ void argmax_body(const float* v, int n, int* out, float* part_v, int* part_i, u32* count, const int* bans, int n_bans,
                                            const float* hidden, int h, float* answer, float* part_ms) {
    pdl_start();
    __shared__ int s_bans[MAX_BANS];
    {
        i64 t = blockIdx.y;
        v += t * n;
        out += t;
        part_v += t * gridDim.x;
        part_i += t * gridDim.x;
        count += t;
        if (bans) bans += t * n_bans;
    }
    int nb = bans ? min(n_bans, MAX_BANS) : 0;
    if (threadIdx.x < nb) s_bans[threadIdx.x] = bans[threadIdx.x];
    __syncthreads();
    __shared__ bool last;
    int per = (n + gridDim.x - 1) / gridDim.x, lo = blockIdx.x * per, hi = min(n, lo + per);
    float bv = NEG_INF, sm = NEG_INF, ss = 0.0f;
    int bi = 0x7fffffff;
    for (int i = lo + threadIdx.x; i < hi; i += blockDim.x) {
        bool banned = false;
        for (int j = 0; j < nb; j++) banned |= s_bans[j] == i;
        if (!banned) arg_better(&bv, &bi, v[i], i);
        if (answer) max_sum_merge(&sm, &ss, v[i], 1.0f);
    }
    block_argmax(&bv, &bi);
    if (answer) block_max_sum(&sm, &ss);
    if (gridDim.x > 1) {
        // each block's best to the parts; the last block to finish picks among them
        if (threadIdx.x == 0) {
            part_v[blockIdx.x] = bv;
            part_i[blockIdx.x] = bi;
            if (answer) { part_ms[2 * blockIdx.x] = sm; part_ms[2 * blockIdx.x + 1] = ss; }
            __threadfence();
            last = atomicAdd(count, 1u) == gridDim.x - 1;
        }
        __syncthreads();
        if (!last) return;
        __threadfence();
        bv = NEG_INF;
        bi = 0x7fffffff;
        sm = NEG_INF;
        ss = 0.0f;
        for (int b = threadIdx.x; b < gridDim.x; b += blockDim.x) {
            arg_better(&bv, &bi, ((volatile float*)part_v)[b], ((volatile int*)part_i)[b]);
            if (answer) max_sum_merge(&sm, &ss, ((volatile float*)part_ms)[2 * b], ((volatile float*)part_ms)[2 * b + 1]);
        }
        block_argmax(&bv, &bi);
        if (answer) block_max_sum(&sm, &ss);
        if (threadIdx.x == 0) *count = 0;
    }
    int tok = bi == 0x7fffffff ? 0 : bi;
    if (threadIdx.x == 0) out[0] = tok;
    if (!answer) return;
    // the answer's row: the hidden row, then the probability and the token (thread 0's)
    for (int i = threadIdx.x; i < h; i += blockDim.x) answer[i] = hidden[i];
    if (threadIdx.x == 0) {
        answer[h] = ss > 0.0f ? 1.0f / ss : 0.0f;
        answer[h + 1] = __int_as_float(tok);
    }
}

extern "C" __global__ void argmax(const float* v, int n, int* out, float* part_v, int* part_i, u32* count, const int* bans, int n_bans) {
    argmax_body(v, n, out, part_v, part_i, count, bans, n_bans, nullptr, 0, nullptr, nullptr);
}

// argmax of one row with an MTP draft step's answer (argmax_body).
extern "C" __global__ void argmax_answer(const float* v, int n, int* out, float* part_v, int* part_i, u32* count, const float* hidden, int h,
                                         float* answer, float* part_ms) {
    argmax_body(v, n, out, part_v, part_i, count, nullptr, 0, hidden, h, answer, part_ms);
}

// The MTP head's input rows (model/mtp.rs): [rms_norm(e)·enorm | rms_norm(h)·hnorm], 2n values a
// row, e the tokens' embeddings (row ids[row] of the embedding matrix E, of type ty, dequantized
// here: no launch of its own) and h the hidden rows it pairs them with; a block a (row, half).
// Drafts only: the verify decides the output, so its bits need not be the CPU's.
extern "C" __global__ void mtp_concat_norm(const u8* E, int ty, i64 row_bytes, const int* ids, const float* h, const float* we, const float* wh, float* out,
                                           int n, float eps) {
    pdl_start();
    int row = blockIdx.x, half = blockIdx.y;
    const u8* er = E + (i64)ids[row] * row_bytes;
    const float* x = h + (i64)row * n;
    const float* w = half ? wh : we;
    float* y = out + (i64)row * 2 * n + (i64)half * n;
    double s = 0.0;
    for (int i = threadIdx.x; i < n; i += blockDim.x) {
        float v = half ? x[i] : deq1(ty, er, i);
        s += (double)(v * v);
    }
    s = block_sum_d(s);
    float scale = 1.0f / sqrtf((float)(s / n) + eps);
    for (int i = threadIdx.x; i < n; i += blockDim.x) y[i] = ((half ? x[i] : deq1(ty, er, i)) * scale) * w[i];
}

// ---- prompt batches: a warp a row, up to MM_T tokens a pass, each weight dequantized once ----

#define MM_T 8

// Unit u of a row: up to 4 groups of 4 consecutive weights (values) and where each group
// starts in the row (off); returns the group count. A row has units(ty, cols) units.
__device__ __forceinline__ int units(int ty, int cols) {
    switch (ty) {
    case T_Q4_K: case T_Q5_K: return cols / 256 * 32;
    case T_Q6_K: return cols / 256 * 16;
    case T_Q8_0: return cols / 32 * 8;
    case T_Q4_0: return cols / 32 * 4;
    default: return cols / 4;  // F32 / F16 / BF16: cols % 4 == 0 (checked at load)
    }
}

__device__ __forceinline__ int unit(int ty, const u8* row, int u, float* w, int* off) {
    switch (ty) {
    case T_Q4_K:
    case T_Q5_K: {
        int b = u >> 5, j = (u >> 3) & 3, g = u & 7;
        bool q5 = ty == T_Q5_K;
        const u8* blk = row + b * (q5 ? 176 : 144);
        u32 q = *(const u32*)(blk + (q5 ? 48 : 16) + 32 * j + 4 * g);
        u32 hb = q5 ? *(const u32*)(blk + 16 + 4 * g) : 0u;
        int sc0, m0, sc1, m1;
        scale_min_k4(2 * j, blk + 4, &sc0, &m0);
        scale_min_k4(2 * j + 1, blk + 4, &sc1, &m1);
        float d = h2f(ld16(blk)), dm = h2f(ld16(blk + 2));
        float d0 = d * sc0, d1 = d * sc1, n0 = dm * m0, n1 = dm * m1;
        #pragma unroll
        for (int e = 0; e < 4; e++) {
            u32 qb = (q >> (8 * e)) & 0xFF, h = (hb >> (8 * e)) & 0xFF;
            int lo = (qb & 0xF) | (q5 ? (((h >> (2 * j)) & 1) << 4) : 0);
            int hi = (qb >> 4) | (q5 ? (((h >> (2 * j + 1)) & 1) << 4) : 0);
            w[e] = d0 * lo - n0;
            w[4 + e] = d1 * hi - n1;
        }
        off[0] = b * 256 + 64 * j + 4 * g;
        off[1] = off[0] + 32;
        return 2;
    }
    case T_Q6_K: {
        int b = u >> 4, n = (u >> 3) & 1, g = u & 7;
        const u8* blk = row + b * Q6_K_BYTES;
        u32 qa = *(const u32*)(blk + 64 * n + 4 * g), qb = *(const u32*)(blk + 64 * n + 32 + 4 * g), qh = *(const u32*)(blk + 128 + 32 * n + 4 * g);
        const i8* sc = (const i8*)(blk + 192) + 8 * n + (g >> 2);
        float d = h2f(ld16(blk + 208));
        float d1 = d * sc[0], d2 = d * sc[2], d3 = d * sc[4], d4 = d * sc[6];
        #pragma unroll
        for (int e = 0; e < 4; e++) {
            int a = (qa >> (8 * e)) & 0xFF, c = (qb >> (8 * e)) & 0xFF, hh = (qh >> (8 * e)) & 0xFF;
            w[e] = d1 * (((a & 0xF) | ((hh & 3) << 4)) - 32);
            w[4 + e] = d2 * (((c & 0xF) | (((hh >> 2) & 3) << 4)) - 32);
            w[8 + e] = d3 * (((a >> 4) | (((hh >> 4) & 3) << 4)) - 32);
            w[12 + e] = d4 * (((c >> 4) | (((hh >> 6) & 3) << 4)) - 32);
        }
        off[0] = b * 256 + 128 * n + 4 * g;
        off[1] = off[0] + 32;
        off[2] = off[0] + 64;
        off[3] = off[0] + 96;
        return 4;
    }
    case T_Q8_0: {
        int b = u >> 3, g = u & 7;
        const u8* blk = row + b * Q8_0_BYTES;
        u32 q = *(const u32*)(blk + Q8_0_QS + 4 * g);
        float d = h2f(ld16(blk));
        #pragma unroll
        for (int e = 0; e < 4; e++) w[e] = d * (float)(i8)(q >> (8 * e));
        off[0] = b * 32 + 4 * g;
        return 1;
    }
    case T_Q4_0: {
        int b = u >> 2, g = u & 3;
        const u8* blk = row + b * 18;
        u32 q = ld32_2(blk + 2 + 4 * g);
        float d = h2f(ld16(blk));
        #pragma unroll
        for (int e = 0; e < 4; e++) {
            w[e] = d * (float)((int)((q >> (8 * e)) & 0xF) - 8);
            w[4 + e] = d * (float)((int)((q >> (8 * e + 4)) & 0xF) - 8);
        }
        off[0] = b * 32 + 4 * g;
        off[1] = off[0] + 16;
        return 2;
    }
    case T_F16:
    case T_BF16: {
        u32 p0 = ((const u32*)row)[2 * u], p1 = ((const u32*)row)[2 * u + 1];
        u16 hs[4] = {(u16)p0, (u16)(p0 >> 16), (u16)p1, (u16)(p1 >> 16)};
        #pragma unroll
        for (int e = 0; e < 4; e++) w[e] = ty == T_F16 ? h2f(hs[e]) : bf2f(hs[e]);
        off[0] = 4 * u;
        return 1;
    }
    default: {
        float4 v = ((const float4*)row)[u];
        w[0] = v.x; w[1] = v.y; w[2] = v.z; w[3] = v.w;
        off[0] = 4 * u;
        return 1;
    }
    }
}

// y[t][r] = W[r]·x[t] (+ res[t][r]) for the n_tok rows of x: warp a row, blockIdx.y a group of
// MM_T tokens. y may alias res.
extern "C" __global__ void mm(const u8* W, int ty, int rows, int cols, i64 row_bytes, const float* x, i64 x_stride, int n_tok,
                              float* y, i64 y_stride, const float* res) {
    pdl_start();
    int row = blockIdx.x * MV_WARPS + (threadIdx.x >> 5), lane = threadIdx.x & 31;
    int t0 = blockIdx.y * MM_T, nt = min(MM_T, n_tok - t0);
    if (row >= rows || nt <= 0) return;
    const u8* wr = W + (i64)row * row_bytes;
    const float* xs = x + (i64)t0 * x_stride;
    float acc[MM_T];
    #pragma unroll
    for (int t = 0; t < MM_T; t++) acc[t] = 0.0f;
    int nu = units(ty, cols);
    for (int u = lane; u < nu; u += 32) {
        float w[16];
        int off[4];
        int ng = unit(ty, wr, u, w, off);
        #pragma unroll
        for (int t = 0; t < MM_T; t++) {
            if (t < nt) {
                const float* xt = xs + (i64)t * x_stride;
                float a = 0.0f;
                for (int gi = 0; gi < ng; gi++) {
                    float4 xv = *(const float4*)(xt + off[gi]);
                    a += w[4 * gi] * xv.x + w[4 * gi + 1] * xv.y + w[4 * gi + 2] * xv.z + w[4 * gi + 3] * xv.w;
                }
                acc[t] += a;
            }
        }
    }
    #pragma unroll
    for (int t = 0; t < MM_T; t++) {
        float s = warp_sum(acc[t]);
        if (t < nt && lane == 0) {
            i64 o = (i64)(t0 + t) * y_stride + row;
            y[o] = res ? res[o] + s : s;
        }
    }
}

// h[t][r] = silu(G[r]·x[t]) · (U[r]·x[t]) for the n_tok rows of x (gate and up of one type).
extern "C" __global__ void mm_glu(const u8* G, const u8* U, int ty, int rows, int cols, i64 row_bytes, const float* x, i64 x_stride,
                                  int n_tok, float* h, i64 h_stride) {
    pdl_start();
    int row = blockIdx.x * MV_WARPS + (threadIdx.x >> 5), lane = threadIdx.x & 31;
    int t0 = blockIdx.y * MM_T, nt = min(MM_T, n_tok - t0);
    if (row >= rows || nt <= 0) return;
    const u8* gr = G + (i64)row * row_bytes;
    const u8* ur = U + (i64)row * row_bytes;
    const float* xs = x + (i64)t0 * x_stride;
    float ag[MM_T], au[MM_T];
    #pragma unroll
    for (int t = 0; t < MM_T; t++) ag[t] = au[t] = 0.0f;
    int nu = units(ty, cols);
    for (int u = lane; u < nu; u += 32) {
        float wg[16], wu[16];
        int off[4];
        int ng = unit(ty, gr, u, wg, off);
        unit(ty, ur, u, wu, off);
        #pragma unroll
        for (int t = 0; t < MM_T; t++) {
            if (t < nt) {
                const float* xt = xs + (i64)t * x_stride;
                float a = 0.0f, b = 0.0f;
                for (int gi = 0; gi < ng; gi++) {
                    float4 xv = *(const float4*)(xt + off[gi]);
                    a += wg[4 * gi] * xv.x + wg[4 * gi + 1] * xv.y + wg[4 * gi + 2] * xv.z + wg[4 * gi + 3] * xv.w;
                    b += wu[4 * gi] * xv.x + wu[4 * gi + 1] * xv.y + wu[4 * gi + 2] * xv.z + wu[4 * gi + 3] * xv.w;
                }
                ag[t] += a;
                au[t] += b;
            }
        }
    }
    #pragma unroll
    for (int t = 0; t < MM_T; t++) {
        float g = warp_sum(ag[t]), u = warp_sum(au[t]);
        if (t < nt && lane == 0) h[(i64)(t0 + t) * h_stride + row] = g / (1.0f + expf(-g)) * u;
    }
}

// ---- prompt batches on tensor cores: f16 tiles, f32 accumulation (mma.sync m16n8k16) ----

#define TC_M 64   // tokens a block
#define TC_N 64   // weight rows a block
#define TC_K 128  // columns a step
#define TC_LD (TC_K + 8)  // padded row: fragment loads hit 32 different banks

// Units (see `unit`) of a row that cover 128 consecutive columns.
__device__ __forceinline__ int units_per_128(int ty) {
    switch (ty) {
    case T_Q4_K: case T_Q5_K: case T_Q4_0: return 16;
    case T_Q6_K: return 8;
    default: return 32;  // Q8_0 and the float types: 4 values a unit
    }
}

__device__ __forceinline__ void mma16816(float* c, const u32* a, const u32* b) {
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
                 : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}

// y[t][r] = W[r]·x[t] (+ res[t][r]) for n_tok rows of x: a block a tile of 64 tokens × 64 rows,
// each step 128 columns of x (rounded to f16) and of W (dequantized to f16) staged in shared
// memory, four warps each 32 × 32 of the tile on tensor cores. cols % 128 == 0. y may alias res.
extern "C" __global__ void __launch_bounds__(128) mm_tc(const u8* W, int ty, int rows, int cols, i64 row_bytes, const float* x, i64 x_stride,
                                                        int n_tok, float* y, i64 y_stride, const float* res) {
    pdl_start();
    __shared__ __align__(16) u16 xs[TC_M][TC_LD];
    __shared__ __align__(16) u16 ws[TC_N][TC_LD];
    int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, gid = lane >> 2, tig = lane & 3;
    int n0 = blockIdx.x * TC_N, m0 = blockIdx.y * TC_M;
    int wm = (warp & 1) * 32, wn = (warp >> 1) * 32;
    float c[2][4][4];
    #pragma unroll
    for (int i = 0; i < 2; i++)
        #pragma unroll
        for (int j = 0; j < 4; j++)
            #pragma unroll
            for (int e = 0; e < 4; e++) c[i][j][e] = 0.0f;
    int upk = units_per_128(ty);
    for (int k0 = 0; k0 < cols; k0 += TC_K) {
        for (int i = tid; i < TC_M * (TC_K / 4); i += blockDim.x) {
            int r = i / (TC_K / 4), c4 = i % (TC_K / 4);
            float4 v = make_float4(0.f, 0.f, 0.f, 0.f);
            if (m0 + r < n_tok) v = *(const float4*)(x + (i64)(m0 + r) * x_stride + k0 + 4 * c4);
            u16* d = &xs[r][4 * c4];
            d[0] = f2h(v.x); d[1] = f2h(v.y); d[2] = f2h(v.z); d[3] = f2h(v.w);
        }
        for (int i = tid; i < TC_N * upk; i += blockDim.x) {
            int r = i / upk, uu = i % upk, row = n0 + r;
            if (row >= rows) continue;  // its tile column is never written out
            float w[16];
            int off[4];
            int ng = unit(ty, W + (i64)row * row_bytes, (k0 / TC_K) * upk + uu, w, off);
            for (int gi = 0; gi < ng; gi++)
                #pragma unroll
                for (int e = 0; e < 4; e++) ws[r][off[gi] - k0 + e] = f2h(w[4 * gi + e]);
        }
        __syncthreads();
        #pragma unroll
        for (int kk = 0; kk < TC_K; kk += 16) {
            u32 a[2][4], b[4][2];
            #pragma unroll
            for (int mi = 0; mi < 2; mi++) {
                int r = wm + mi * 16 + gid;
                a[mi][0] = *(const u32*)&xs[r][kk + tig * 2];
                a[mi][1] = *(const u32*)&xs[r + 8][kk + tig * 2];
                a[mi][2] = *(const u32*)&xs[r][kk + tig * 2 + 8];
                a[mi][3] = *(const u32*)&xs[r + 8][kk + tig * 2 + 8];
            }
            #pragma unroll
            for (int ni = 0; ni < 4; ni++) {
                int n = wn + ni * 8 + gid;
                b[ni][0] = *(const u32*)&ws[n][kk + tig * 2];
                b[ni][1] = *(const u32*)&ws[n][kk + tig * 2 + 8];
            }
            #pragma unroll
            for (int mi = 0; mi < 2; mi++)
                #pragma unroll
                for (int ni = 0; ni < 4; ni++) mma16816(c[mi][ni], a[mi], b[ni]);
        }
        __syncthreads();
    }
    #pragma unroll
    for (int mi = 0; mi < 2; mi++)
        #pragma unroll
        for (int ni = 0; ni < 4; ni++)
            #pragma unroll
            for (int e = 0; e < 4; e++) {
                int tok = m0 + wm + mi * 16 + gid + (e >= 2 ? 8 : 0);
                int row = n0 + wn + ni * 8 + tig * 2 + (e & 1);
                if (tok < n_tok && row < rows) {
                    i64 o = (i64)tok * y_stride + row;
                    y[o] = res ? res[o] + c[mi][ni][e] : c[mi][ni][e];
                }
            }
}

// h ← silu(h) · u, element-wise over n values (a GLU after two tensor-core products).
extern "C" __global__ void silu_mul(float* h, const float* u, i64 n) {
    pdl_start();
    i64 i = (i64)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) {
        float g = h[i];
        h[i] = g / (1.0f + expf(-g)) * u[i];
    }
}

// ---- the DeltaNet scan of a prompt pass: S's rows are independent given each token's q, k,
// v, β and decay, so rows spread over many blocks and stay in registers across the tokens ----

// Per (K-head blockIdx.x, token blockIdx.y): q and k L2-normed (build_gdn_l2_norm) into qn, kn;
// per V-head of this K-head (tiled or grouped pairing), β = sigmoid and the decay e^g,
// g = softplus(α + dt)·a, into gb[t][h] = (β, decay). One warp.
extern "C" __global__ void delta_prep(const float* conv, const float* beta_in, const float* alpha_in, const float* dt_bias, const float* a,
                                      float* qn, float* kn, float* gb, int hk, int hv, int sd, int tiled, float eps) {
    pdl_start();
    int kh = blockIdx.x, t = blockIdx.y, lane = threadIdx.x, E = sd / 32;
    int cd = 2 * hk * sd + hv * sd;
    const float* q = conv + (i64)t * cd + (i64)kh * sd;
    const float* k = conv + (i64)t * cd + (i64)hk * sd + (i64)kh * sd;
    float qr[8], kr[8];
    delta_qk(q, k, sd, eps, lane, qr, kr);
    EACH_E {
        qn[((i64)t * hk + kh) * sd + lane + 32 * e] = qr[e];
        kn[((i64)t * hk + kh) * sd + lane + 32 * e] = kr[e];
    }
    int r = hv / hk;
    for (int i = lane; i < r; i += 32) {
        int h = tiled ? kh + i * hk : kh * r + i;
        i64 th = (i64)t * hv + h;
        delta_gates(beta_in[th], alpha_in[th], dt_bias[h], a[h], &gb[th * 2], &gb[th * 2 + 1]);
    }
}

#define DR_ROWS 2   // rows of S a warp keeps
#define DR_WARPS 4

// Rows [blockIdx.y·8, +8) of V-head blockIdx.x's S through the pass's n_tok tokens, each warp
// two rows in registers: S_j ← S_j·decay; d = (v_j − S_j·k)·β; S_j ← S_j + d·k; o_j = S_j·q/√sd
// into o (before the output norm, delta_out).
// With tab, S is tab's row 0 (row_state: a verify's sequence); with hist, S after token
// t < n_tok − 1 is also written to hist[2t + 1] (the state before row t + 1, kept for a rollback).
// With seg, a pass of several sequences' spans back to back: blockIdx.z a span, its (first row,
// tokens) seg's, its S tab's at its first row; each span's tokens in the one-span arithmetic.
extern "C" __global__ void __launch_bounds__(128) delta_rows(const float* qn, const float* kn, const float* conv, const float* gb, float* S,
                                                             float* o, int hk, int hv, int sd, int tiled, int n_tok, const unsigned long long* tab,
                                                             const unsigned long long* hist, const int2* seg) {
    int first = 0;
    if (seg) {
        int2 sg = seg[blockIdx.z];
        first = sg.x;
        n_tok = sg.y;
    }
    S = (float*)row_state(tab, first, 1, S);
    pdl_start();
    int h = blockIdx.x, warp = threadIdx.x >> 5, lane = threadIdx.x & 31, E = sd / 32;
    int kh = tiled ? h % hk : h / (hv / hk);
    int j0 = (blockIdx.y * DR_WARPS + warp) * DR_ROWS;
    if (j0 >= sd) return;
    int cd = 2 * hk * sd + hv * sd;
    qn += (i64)first * hk * sd;
    kn += (i64)first * hk * sd;
    conv += (i64)first * cd;
    gb += (i64)first * hv * 2;
    o += (i64)first * hv * sd;
    float s[DR_ROWS][8];
    float* Sh = S + (i64)h * sd * sd;
    _Pragma("unroll") for (int r = 0; r < DR_ROWS; r++)
        EACH_E s[r][e] = Sh[(i64)(j0 + r) * sd + lane + 32 * e];
    float oscale = 1.0f / sqrtf((float)sd);
    // token t + 1's operands are loaded while token t computes
    float kn_[8], qn_[8], vn_[DR_ROWS], bn_, dn_;
    auto fetch = [&](int t) {
        const float* k = kn + ((i64)t * hk + kh) * sd;
        const float* q = qn + ((i64)t * hk + kh) * sd;
        EACH_E {
            kn_[e] = k[lane + 32 * e];
            qn_[e] = q[lane + 32 * e];
        }
        bn_ = gb[((i64)t * hv + h) * 2];
        dn_ = gb[((i64)t * hv + h) * 2 + 1];
        const float* v = conv + (i64)t * cd + 2 * (i64)hk * sd + (i64)h * sd;
        _Pragma("unroll") for (int r = 0; r < DR_ROWS; r++) vn_[r] = v[j0 + r];
    };
    if (n_tok > 0) fetch(0);
    for (int t = 0; t < n_tok; t++) {
        float kr[8], qr[8], vv[DR_ROWS];
        EACH_E {
            kr[e] = kn_[e];
            qr[e] = qn_[e];
        }
        _Pragma("unroll") for (int r = 0; r < DR_ROWS; r++) vv[r] = vn_[r];
        float beta = bn_, decay = dn_;
        if (t + 1 < n_tok) fetch(t + 1);
        #pragma unroll
        for (int r = 0; r < DR_ROWS; r++) {
            float kv = 0.0f;
            EACH_E {
                s[r][e] *= decay;
                kv += s[r][e] * kr[e];
            }
            kv = warp_sum(kv);
            float d = (vv[r] - kv) * beta;
            float oo = 0.0f;
            EACH_E {
                s[r][e] += d * kr[e];
                oo += s[r][e] * qr[e];
            }
            oo = warp_sum(oo);
            if (lane == 0) o[((i64)t * hv + h) * sd + j0 + r] = oo * oscale;
        }
        if (hist && t + 1 < n_tok) {
            float* Hh = (float*)hist[2 * t + 1] + (i64)h * sd * sd;
            _Pragma("unroll") for (int r = 0; r < DR_ROWS; r++)
                EACH_E Hh[(i64)(j0 + r) * sd + lane + 32 * e] = s[r][e];
        }
    }
    _Pragma("unroll") for (int r = 0; r < DR_ROWS; r++)
        EACH_E Sh[(i64)(j0 + r) * sd + lane + 32 * e] = s[r][e];
}

// A decode step's scan in one launch: delta_prep's norms and gates (the same sums, so the same
// bits) computed by each warp for its head, then delta_rows' update of its rows for the one
// token. Grid and block as delta_rows; blockIdx.z a decode batch's row t (its conv, β, α and o
// rows t, its S tab's: row_state).
extern "C" __global__ void __launch_bounds__(128) delta_step_rows(const float* conv, const float* beta_in, const float* alpha_in, const float* dt_bias,
                                                                  const float* a, float* S, float* o, int hk, int hv, int sd, int tiled, float eps,
                                                                  const unsigned long long* tab) {
    int h = blockIdx.x, warp = threadIdx.x >> 5, lane = threadIdx.x & 31, E = sd / 32;
    {
        i64 t = blockIdx.z;
        S = (float*)row_state(tab, (int)t, 1, S);
        conv += t * (2 * hk + hv) * sd;
        beta_in += t * hv;
        alpha_in += t * hv;
        o += t * hv * sd;
    }
    int kh = tiled ? h % hk : h / (hv / hk);
    int j0 = (blockIdx.y * DR_WARPS + warp) * DR_ROWS;
    // the state's rows were last written by this layer's previous step, long finished
    if (j0 < sd) prefetch_l2(S + ((i64)h * sd + j0) * sd, (i64)min(DR_ROWS, sd - j0) * sd * 4, lane);
    pdl_start();
    if (j0 >= sd) return;
    const float* q = conv + (i64)kh * sd;
    const float* k = conv + (i64)hk * sd + (i64)kh * sd;
    const float* v = conv + 2 * (i64)hk * sd + (i64)h * sd;
    float qr[8], kr[8], beta, decay;
    delta_qk(q, k, sd, eps, lane, qr, kr);
    delta_gates(beta_in[h], alpha_in[h], dt_bias[h], a[h], &beta, &decay);
    float oscale = 1.0f / sqrtf((float)sd);
    float* Sh = S + (i64)h * sd * sd;
    #pragma unroll
    for (int r = 0; r < DR_ROWS; r++) {
        float* row = Sh + (i64)(j0 + r) * sd;
        float sr[8], kv = 0.0f;
        EACH_E {
            sr[e] = row[lane + 32 * e] * decay;
            kv += sr[e] * kr[e];
        }
        kv = warp_sum(kv);
        float d = (v[j0 + r] - kv) * beta;
        float oo = 0.0f;
        EACH_E {
            sr[e] += d * kr[e];
            row[lane + 32 * e] = sr[e];
            oo += sr[e] * qr[e];
        }
        oo = warp_sum(oo);
        if (lane == 0) o[(i64)h * sd + j0 + r] = oo * oscale;
    }
}

// The gated output norm of V-heads (token blockIdx.y): out = rms_norm(o)·w ⊙ silu(z), 128
// threads a head, blockDim / 128 heads a block. Where yq is given the block's outputs are 256
// values (blockDim / 128 · sd = 256) and are also quantized for the out projection (q8_K, as
// quant_q8 kind 0), saving that launch.
extern "C" __global__ void delta_out(const float* o, const float* z, const float* norm_w, float* out, int hv, int sd, float eps, i8* yq, float2* yd,
                                     i8* yqz, float2* ydz) {
    pdl_start();
    __shared__ double red[8][4];
    __shared__ __align__(16) float s_y[256];
    int G = blockDim.x >> 7, g = threadIdx.x >> 7, tl = threadIdx.x & 127, lane = threadIdx.x & 31;
    int h = blockIdx.x * G + g, t = blockIdx.y;
    i64 base = ((i64)t * hv + h) * sd;
    double ss = 0.0;
    for (int i = tl; i < sd; i += 128) ss += (double)(o[base + i] * o[base + i]);
    // the head's sum as block_sum_d over a block of 128 sums it: its four warps in order
    ss = warp_sum_d(ss);
    if (lane == 0) red[g][tl >> 5] = ss;
    __syncthreads();
    double tot = 0.0;
    for (int w = 0; w < 4; w++) tot += red[g][w];
    float scale = 1.0f / sqrtf((float)(tot / sd) + eps);
    for (int i = tl; i < sd; i += 128) {
        float zv = z[base + i];
        float v = ((o[base + i] * scale) * norm_w[i]) * (zv / (1.0f + expf(-zv)));
        out[base + i] = v;
        if (yq || yqz) s_y[g * sd + i] = v;
    }
    if (!yq && !yqz) return;
    __syncthreads();
    quant_256(s_y, (i64)t * hv * sd + (i64)blockIdx.x * 256, yq, yd, yqz, ydz);
}

// ---- prompt batches through cuBLAS: weights dequantized to f16 rows, activations to f16 ----

// out[r][c] = W[r][c] as f16, for rows × cols (each thread one `unit` of a row).
extern "C" __global__ void dequant_f16(const u8* W, int ty, int rows, int cols, i64 row_bytes, u16* out) {
    pdl_start();
    int upr = units(ty, cols);
    i64 i = (i64)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= (i64)rows * upr) return;
    int row = (int)(i / upr), u = (int)(i % upr);
    float w[16];
    int off[4];
    int ng = unit(ty, W + (i64)row * row_bytes, u, w, off);
    u16* o = out + (i64)row * cols;
    for (int gi = 0; gi < ng; gi++) {
        u32 lo = (u32)f2h(w[4 * gi]) | ((u32)f2h(w[4 * gi + 1]) << 16);
        u32 hi = (u32)f2h(w[4 * gi + 2]) | ((u32)f2h(w[4 * gi + 3]) << 16);
        *(uint2*)(o + off[gi]) = make_uint2(lo, hi);
    }
}

// out[t][c] = x[t][c] as f16 for n_tok rows of cols values (x rows x_stride apart).
extern "C" __global__ void to_f16(const float* x, int cols, i64 x_stride, int n_tok, u16* out) {
    pdl_start();
    i64 i = (i64)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= (i64)n_tok * cols) return;
    i64 t = i / cols, c = i % cols;
    out[i] = f2h(x[t * x_stride + c]);
}

// ---- routed experts of a prompt pass, grouped per expert (tensor cores, weights dequantized
// in registers straight into the MMA's B fragments) ----

// Slots (token·k + s) grouped by expert: counts[e], offsets[e] and order[] (slots of expert 0,
// then 1, ...), and the tiles of mm_ex: (expert, start in order[], count ≤ EX_M) for each
// expert's slots, padded with empty tiles to max_tiles (the grid is sized on the host without
// reading the counts back). One block; 2·n_expert ints of shared memory.
extern "C" __global__ void moe_sort(const int* ids, int n_slots, int n_expert, int* counts, int* offsets, int* order, int4* tiles, int max_tiles, int tile) {
    pdl_start();
    // an expert's slots land in any order (atomics): each slot's products do not depend on
    // its place in a tile
    extern __shared__ int s_sort[];
    int* s_cnt = s_sort;
    int* s_cur = s_sort + n_expert;
    for (int e = threadIdx.x; e < n_expert; e += blockDim.x) s_cnt[e] = 0;
    __syncthreads();
    // a negative id: a slot another round of a VRAM expert cache computes
    for (int i = threadIdx.x; i < n_slots; i += blockDim.x)
        if (ids[i] >= 0) atomicAdd(&s_cnt[ids[i]], 1);
    __syncthreads();
    if (threadIdx.x == 0) {
        int o = 0, t = 0;
        for (int e = 0; e < n_expert; e++) {
            int c = s_cnt[e];
            s_cur[e] = o;
            offsets[e] = o;
            counts[e] = c;
            for (int st = 0; st < c && t < max_tiles; st += tile) tiles[t++] = make_int4(e, o + st, min(tile, c - st), 0);
            o += c;
        }
        for (; t < max_tiles; t++) tiles[t] = make_int4(0, 0, 0, 0);
    }
    __syncthreads();
    for (int i = threadIdx.x; i < n_slots; i += blockDim.x)
        if (ids[i] >= 0) order[atomicAdd(&s_cur[ids[i]], 1)] = i;
}

#define EX_M 16          // tokens a tile (one m16 MMA row block)
#define EX_NT 4          // n-tiles of 8 rows a warp
#define EX_WARPS 4       // a block: 4 warps × 32 rows = 128 rows
#define EX_K 128         // columns a step
#define EX_LD (EX_K + 8) // padded smem row of x (f16)

__device__ __forceinline__ u32 pack_h2(float a, float b) { return (u32)f2h(a) | ((u32)f2h(b) << 16); }

// Where step s (0..7) of a 128-column chunk puts lane tig's two column pairs: the k order inside
// a step is free (a dot product), so each type's pairs are the ones its quants pack together;
// A (x) and B (W) use the same map. Returns (first column of pair A, of pair B), chunk-relative.
__device__ __forceinline__ int2 ex_cols(int ty, int tig, int s) {
    switch (ty) {
    case T_Q4_K: case T_Q5_K: {
        int p = 64 * (s >> 2) + 8 * tig + 2 * (s & 3);
        return make_int2(p, p + 32);
    }
    case T_Q6_K: {
        int p = (s >> 2) * 32 + 8 * tig + 2 * (s & 3);
        return make_int2(p, p + 64);
    }
    case T_Q8_0: {
        int p = 32 * (s >> 1) + 8 * tig + 4 * (s & 1);
        return make_int2(p, p + 2);
    }
    default: {
        int p = 16 * s + 2 * tig;
        return make_int2(p, p + 8);
    }
    }
}

// A row's raw words for chunk kc (loaded for every n-tile before any is dequantized, so the
// loads of a chunk are in flight together): Q4_K / Q5_K: d|dmin, 3 scale words, the two
// sub-block pairs' 8 quant bytes each, Q5_K's 8 high-bit bytes; Q6_K: ql A, ql B, qh (8 bytes
// each), the half's 8 scale bytes, d; Q8_0: per block d, 8 quant bytes. Other types: none.
#define EX_RAW 12
__device__ __forceinline__ void ex_load(int ty, const u8* row, int kc, int tig, u32* r) {
    switch (ty) {
    case T_Q4_K:
    case T_Q5_K: {
        bool q5 = ty == T_Q5_K;
        const u8* blk = row + (i64)(kc >> 1) * (q5 ? 176 : 144);
        const u32* w = (const u32*)blk;
        r[0] = w[0]; r[1] = w[1]; r[2] = w[2]; r[3] = w[3];
        #pragma unroll
        for (int jl = 0; jl < 2; jl++) {
            uint2 q = *(const uint2*)(blk + (q5 ? 48 : 16) + 32 * (2 * (kc & 1) + jl) + 8 * tig);
            r[4 + 2 * jl] = q.x;
            r[5 + 2 * jl] = q.y;
        }
        if (q5) {
            uint2 h = *(const uint2*)(blk + 16 + 8 * tig);
            r[8] = h.x;
            r[9] = h.y;
        }
        return;
    }
    case T_Q6_K: {
        const u8* blk = row + (i64)(kc >> 1) * Q6_K_BYTES;
        int n = kc & 1;
        uint2 la = *(const uint2*)(blk + 64 * n + 8 * tig), lb = *(const uint2*)(blk + 64 * n + 32 + 8 * tig);
        uint2 qh = *(const uint2*)(blk + 128 + 32 * n + 8 * tig), sc = *(const uint2*)(blk + 192 + 8 * n);
        r[0] = la.x; r[1] = la.y; r[2] = lb.x; r[3] = lb.y; r[4] = qh.x; r[5] = qh.y; r[6] = sc.x; r[7] = sc.y;
        r[8] = *(const u32*)(blk + 208);
        return;
    }
    case T_Q8_0: {
        #pragma unroll
        for (int bl = 0; bl < 4; bl++) {
            const u8* blk = row + (i64)(4 * kc + bl) * Q8_0_BYTES;
            r[3 * bl] = *(const u32*)blk;
            r[3 * bl + 1] = *(const u32*)(blk + Q8_0_QS + 8 * tig);
            r[3 * bl + 2] = *(const u32*)(blk + Q8_0_QS + 8 * tig + 4);
        }
        return;
    }
    }
}

// B fragments (f16 pairs) for the 8 steps of chunk kc from ex_load's words: b[s][0] = pair A,
// b[s][1] = pair B of ex_cols. Types without raw words dequantize from the row.
__device__ __forceinline__ void ex_deq(int ty, const u8* row, int kc, int tig, const u32* r, u32 b[8][2]) {
    switch (ty) {
    case T_Q4_K:
    case T_Q5_K: {
        bool q5 = ty == T_Q5_K;
        float d = h2f((u16)r[0]), dm = h2f((u16)(r[0] >> 16));
        #pragma unroll
        for (int jl = 0; jl < 2; jl++) {
            int j = 2 * (kc & 1) + jl;
            int sc0, m0, sc1, m1;
            scales_k4_words(r[1], r[2], r[3], j, &sc0, &m0, &sc1, &m1);
            float a0 = d * sc0, c0 = dm * m0, a1 = d * sc1, c1 = dm * m1;
            #pragma unroll
            for (int s4 = 0; s4 < 4; s4++) {
                u32 qw = r[4 + 2 * jl + (s4 >> 1)], hw = q5 ? r[8 + (s4 >> 1)] : 0u;
                int sh = 16 * (s4 & 1);
                int l0 = (qw >> sh) & 0xF, l1 = (qw >> (sh + 8)) & 0xF;
                int h0 = (qw >> (sh + 4)) & 0xF, h1 = (qw >> (sh + 12)) & 0xF;
                if (q5) {
                    l0 |= ((hw >> (sh + 2 * j)) & 1) << 4;
                    l1 |= ((hw >> (sh + 8 + 2 * j)) & 1) << 4;
                    h0 |= ((hw >> (sh + 2 * j + 1)) & 1) << 4;
                    h1 |= ((hw >> (sh + 8 + 2 * j + 1)) & 1) << 4;
                }
                b[4 * jl + s4][0] = pack_h2(a0 * l0 - c0, a0 * l1 - c0);
                b[4 * jl + s4][1] = pack_h2(a1 * h0 - c1, a1 * h1 - c1);
            }
        }
        return;
    }
    case T_Q6_K: {
        float d = h2f((u16)r[8]);
        // scale of quarter q: byte (tig >> 1) + 2q of the half's 8
        float ds[4];
        #pragma unroll
        for (int q = 0; q < 4; q++) {
            int bi = (tig >> 1) + 2 * q;
            ds[q] = d * (float)(i8)(r[6 + (bi >> 2)] >> (8 * (bi & 3)));
        }
        #pragma unroll
        for (int s = 0; s < 8; s++) {
            int part = s >> 2, s4 = s & 3;
            u32 lw = r[2 * part + (s4 >> 1)];
            u32 hw = r[4 + (s4 >> 1)];
            int sh = 16 * (s4 & 1);
            // pair A: quarter `part` (low nibbles, qh bits 2·part); pair B: quarter part + 2
            // (high nibbles, qh bits 2·part + 4)
            int qa = 2 * part, qb = 2 * part + 4;
            int a0 = (((lw >> sh) & 0xF) | (((hw >> (sh + qa)) & 3) << 4)) - 32;
            int a1 = (((lw >> (sh + 8)) & 0xF) | (((hw >> (sh + 8 + qa)) & 3) << 4)) - 32;
            int b0 = (((lw >> (sh + 4)) & 0xF) | (((hw >> (sh + qb)) & 3) << 4)) - 32;
            int b1 = (((lw >> (sh + 12)) & 0xF) | (((hw >> (sh + 8 + qb)) & 3) << 4)) - 32;
            b[s][0] = pack_h2(ds[part] * a0, ds[part] * a1);
            b[s][1] = pack_h2(ds[part + 2] * b0, ds[part + 2] * b1);
        }
        return;
    }
    case T_Q8_0: {
        #pragma unroll
        for (int bl = 0; bl < 4; bl++) {
            float d = h2f((u16)r[3 * bl]);
            #pragma unroll
            for (int s2 = 0; s2 < 2; s2++) {
                u32 w = r[3 * bl + 1 + s2];
                b[2 * bl + s2][0] = pack_h2(d * (float)(i8)w, d * (float)(i8)(w >> 8));
                b[2 * bl + s2][1] = pack_h2(d * (float)(i8)(w >> 16), d * (float)(i8)(w >> 24));
            }
        }
        return;
    }
    default: {
        #pragma unroll
        for (int s = 0; s < 8; s++) {
            int c = kc * EX_K + 16 * s + 2 * tig;
            b[s][0] = pack_h2(deq1(ty, row, c), deq1(ty, row, c + 1));
            b[s][1] = pack_h2(deq1(ty, row, c + 8), deq1(ty, row, c + 9));
        }
        return;
    }
    }
}

// y[slot][r] = W_e[r]·x[slot / x_div] for the slots of tile blockIdx.y: tiles[t] = (expert e,
// start in order[], count ≤ 16); rows [blockIdx.x·128, +128). cols % 128 == 0.
extern "C" __global__ void __launch_bounds__(128) mm_ex(const u8* W, int ty, int rows, int cols, i64 row_bytes, i64 mat_bytes, const int4* tiles,
                                                        const int* order, const float* x, i64 x_stride, int x_div, float* y, i64 y_stride) {
    pdl_start();
    __shared__ __align__(16) u16 xs[EX_M][EX_LD];
    __shared__ int s_slot[EX_M];
    int4 tile = tiles[blockIdx.y];
    int e = tile.x, start = tile.y, cnt = tile.z;
    if (cnt <= 0) return;  // a padding tile
    int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, gid = lane >> 2, tig = lane & 3;
    if (tid < EX_M) s_slot[tid] = tid < cnt ? order[start + tid] : -1;
    const u8* We = W + (i64)e * mat_bytes;
    int r0 = blockIdx.x * (EX_WARPS * EX_NT * 8) + warp * (EX_NT * 8);
    float c[EX_NT][4];
    #pragma unroll
    for (int nt = 0; nt < EX_NT; nt++)
        #pragma unroll
        for (int i = 0; i < 4; i++) c[nt][i] = 0.0f;
    __syncthreads();
    for (int kc = 0; kc < cols / EX_K; kc++) {
        // x: 16 rows × 128 columns as f16 (zeros past the tile's count)
        for (int i = tid; i < EX_M * (EX_K / 4); i += blockDim.x) {
            int t = i / (EX_K / 4), c4 = i % (EX_K / 4);
            int slot = s_slot[t];
            float4 v = make_float4(0.f, 0.f, 0.f, 0.f);
            if (slot >= 0) v = *(const float4*)(x + (i64)(slot / x_div) * x_stride + kc * EX_K + 4 * c4);
            *(uint2*)&xs[t][4 * c4] = make_uint2(pack_h2(v.x, v.y), pack_h2(v.z, v.w));
        }
        __syncthreads();
        u32 a[8][4];
        #pragma unroll
        for (int s = 0; s < 8; s++) {
            int2 p = ex_cols(ty, tig, s);
            a[s][0] = *(const u32*)&xs[gid][p.x];
            a[s][1] = *(const u32*)&xs[gid + 8][p.x];
            a[s][2] = *(const u32*)&xs[gid][p.y];
            a[s][3] = *(const u32*)&xs[gid + 8][p.y];
        }
        u32 raw[EX_NT][EX_RAW];
        #pragma unroll
        for (int nt = 0; nt < EX_NT; nt++) {
            int row = min(r0 + nt * 8 + gid, rows - 1);  // rows past the end: computed, not written
            ex_load(ty, We + (i64)row * row_bytes, kc, tig, raw[nt]);
        }
        #pragma unroll
        for (int nt = 0; nt < EX_NT; nt++) {
            int row = min(r0 + nt * 8 + gid, rows - 1);
            u32 b[8][2];
            ex_deq(ty, We + (i64)row * row_bytes, kc, tig, raw[nt], b);
            #pragma unroll
            for (int s = 0; s < 8; s++) mma16816(c[nt], a[s], b[s]);
        }
        __syncthreads();
    }
    #pragma unroll
    for (int nt = 0; nt < EX_NT; nt++)
        #pragma unroll
        for (int i = 0; i < 4; i++) {
            int t = gid + (i >= 2 ? 8 : 0);
            int row = r0 + nt * 8 + tig * 2 + (i & 1);
            int slot = t < cnt ? s_slot[t] : -1;
            if (slot >= 0 && row < rows) y[(i64)slot * y_stride + row] = c[nt][i];
        }
}

// A rank of a sharded model (xwen_engine::shard), after the router: the picks in this rank's
// block [lo, hi) become indices into its stacks, the others -1 (the rank holding them computes
// them; the products skip -1), and the slots' outputs ys are zeroed, so after the products each
// slot holds its owner's bits or zero and a sum over the ranks is exact.
extern "C" __global__ void moe_local_ids(int* ids, int n, int lo, int hi, float* ys, i64 ys_len) {
    pdl_start();
    i64 i = (i64)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) {
        int e = ids[i];
        ids[i] = (e >= lo && e < hi) ? e - lo : -1;
    }
    for (i64 j = i; j < ys_len; j += (i64)gridDim.x * blockDim.x) ys[j] = 0.0f;
}
