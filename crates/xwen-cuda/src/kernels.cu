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
        const u8* b = row + (i / 32) * 34;
        return h2f(ld16(b)) * (float)((const i8*)(b + 2))[i % 32];
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
        const u8* b = row + (i / 256) * 210;
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
            for (int i = lane; i < cols / 4; i += 32) {
                float4 a = w4[i], b = x4[i];
                sum += a.x * b.x + a.y * b.y + a.z * b.z + a.w * b.w;
            }
            return sum;
        }
        break;
    case T_F16:
    case T_BF16:
        if ((cols & 1) == 0) {
            const u32* w2 = (const u32*)row;
            for (int i = lane; i < cols / 2; i += 32) {
                u32 p = w2[i];
                float a = ty == T_F16 ? h2f((u16)p) : bf2f((u16)p);
                float b = ty == T_F16 ? h2f((u16)(p >> 16)) : bf2f((u16)(p >> 16));
                sum += a * x[2 * i] + b * x[2 * i + 1];
            }
            return sum;
        }
        break;
    case T_Q8_0: {
        int nu = cols / 32 * 8;
        for (int u = lane; u < nu; u += 32) {
            int b = u >> 3, g = u & 7;
            const u8* blk = row + b * 34;
            u32 q = ld32_2(blk + 2 + 4 * g);
            float4 xv = *(const float4*)(x + b * 32 + 4 * g);
            float s = (float)(i8)(q) * xv.x + (float)(i8)(q >> 8) * xv.y + (float)(i8)(q >> 16) * xv.z + (float)(i8)(q >> 24) * xv.w;
            sum += h2f(ld16(blk)) * s;
        }
        return sum;
    }
    case T_Q4_K: {
        int nu = cols / 256 * 32;
        for (int u = lane; u < nu; u += 32) {
            int b = u >> 5, j = (u >> 3) & 3, g = u & 7;
            const u8* blk = row + b * 144;
            u32 q = *(const u32*)(blk + 16 + 32 * j + 4 * g);
            int sc0, m0, sc1, m1;
            scale_min_k4(2 * j, blk + 4, &sc0, &m0);
            scale_min_k4(2 * j + 1, blk + 4, &sc1, &m1);
            const float* xb = x + b * 256 + 64 * j + 4 * g;
            float4 x0 = *(const float4*)xb, x1 = *(const float4*)(xb + 32);
            float lo = (float)(q & 0xF) * x0.x + (float)((q >> 8) & 0xF) * x0.y + (float)((q >> 16) & 0xF) * x0.z + (float)((q >> 24) & 0xF) * x0.w;
            float hi = (float)((q >> 4) & 0xF) * x1.x + (float)((q >> 12) & 0xF) * x1.y + (float)((q >> 20) & 0xF) * x1.z + (float)((q >> 28) & 0xF) * x1.w;
            float s0 = x0.x + x0.y + x0.z + x0.w, s1 = x1.x + x1.y + x1.z + x1.w;
            float d = h2f(ld16(blk)), dm = h2f(ld16(blk + 2));
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
            const u8* blk = row + b * 210;
            u32 qa = ld32_2(blk + 64 * n + 4 * g);
            u32 qb = ld32_2(blk + 64 * n + 32 + 4 * g);
            u32 qh = ld32_2(blk + 128 + 32 * n + 4 * g);
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

#define MV_WARPS 4

// y[slot][r] = W_e[r]·x[slot / x_div] (+ res[slot][r]) where e = ids[slot] (an expert of a stack)
// or 0: one warp a row, blockIdx.y a slot (x_div = k: a token's k routed slots share its input). y may alias res (each row read, then written, by one lane).
extern "C" __global__ void mv(const u8* W, int ty, int rows, int cols, i64 row_bytes, i64 mat_bytes, const int* ids,
                              const float* x, i64 x_stride, int x_div, float* y, i64 y_stride, const float* res) {
    int slot = blockIdx.y;
    int row = blockIdx.x * MV_WARPS + (threadIdx.x >> 5), lane = threadIdx.x & 31;
    if (row >= rows) return;
    i64 e = ids ? ids[slot] : 0;
    const u8* w = W + e * mat_bytes + (i64)row * row_bytes;
    float s = warp_sum(dot_row(ty, w, x + (slot / x_div) * x_stride, cols, lane));
    if (lane == 0) {
        i64 o = slot * y_stride + row;
        y[o] = res ? res[o] + s : s;
    }
}

// h[slot][r] = silu(G_e[r]·x) · (U_e[r]·x): an FFN's or expert's gate, up and SwiGLU in one pass.
extern "C" __global__ void mv_glu(const u8* G, const u8* U, int ty_g, int ty_u, int rows, int cols, i64 rb_g, i64 rb_u,
                                  i64 mb_g, i64 mb_u, const int* ids, const float* x, i64 x_stride, int x_div, float* h, i64 h_stride) {
    int slot = blockIdx.y;
    int row = blockIdx.x * MV_WARPS + (threadIdx.x >> 5), lane = threadIdx.x & 31;
    if (row >= rows) return;
    i64 e = ids ? ids[slot] : 0;
    const float* xs = x + (slot / x_div) * x_stride;
    float g = warp_sum(dot_row(ty_g, G + e * mb_g + (i64)row * rb_g, xs, cols, lane));
    float u = warp_sum(dot_row(ty_u, U + e * mb_u + (i64)row * rb_u, xs, cols, lane));
    if (lane == 0) h[slot * h_stride + row] = g / (1.0f + expf(-g)) * u;
}

// y = x / sqrt(mean(x²) + eps) · w, one block a row (ops::rms_norm).
extern "C" __global__ void rms_norm(const float* x, const float* w, float* y, int n, float eps) {
    const float* xr = x + (i64)blockIdx.x * n;
    float* yr = y + (i64)blockIdx.x * n;
    double s = 0.0;
    for (int i = threadIdx.x; i < n; i += blockDim.x) s += (double)(xr[i] * xr[i]);
    s = block_sum_d(s);
    float scale = 1.0f / sqrtf((float)(s / n) + eps);
    for (int i = threadIdx.x; i < n; i += blockDim.x) yr[i] = (xr[i] * scale) * w[i];
}

// x[t] = row ids[t] of the embedding matrix, dequantized; blockIdx.y = t.
extern "C" __global__ void embed(const u8* E, int ty, int cols, i64 row_bytes, const int* ids, float* x) {
    const u8* row = E + (i64)ids[blockIdx.y] * row_bytes;
    float* xt = x + (i64)blockIdx.y * cols;
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < cols; i += gridDim.x * blockDim.x) xt[i] = deq1(ty, row, i);
}

// Gated attention's heads of token blockIdx.y at position step[0] + blockIdx.y: q (from qg's per-head [q | gate]) and k RMS-normed
// and roped (NeoX pairs over n_rot dims, `still` pairs held: interleaved M-RoPE's text rows); k
// and v written to the f16 caches' row step[0]. One block a head, one thread a dim.
extern "C" __global__ void attn_heads(const float* qg, const float* k, const float* v, const float* q_norm, const float* k_norm,
                                      const int* still, const int* step, float* q_out, u16* k_cache, u16* v_cache,
                                      int n_head, int n_head_kv, int hd, int n_rot, float theta_scale, float eps) {
    extern __shared__ float sh[];
    int b = blockIdx.x, i = threadIdx.x, t = blockIdx.y, pos = step[0] + t;
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

#define ATTN_CHUNK 256
#define ATTN_WARPS 4

// Split-KV attention: block (head, split, token t) covers positions [split·CHUNK, +CHUNK) of the
// step[0] + t + 1 that token t sees (causal); each warp an online softmax over its positions, merged in the block;
// the partial (max, sum, unnormalized output) goes to `part` for attn_merge. hd ≤ 256.
extern "C" __global__ void attn_split(const float* q, const u16* k_cache, const u16* v_cache, const int* step, float* part_o,
                                      float* part_ml, int n_head, int n_head_kv, int hd, float scale) {
    __shared__ float s_o[ATTN_WARPS][256];
    __shared__ float s_m[ATTN_WARPS], s_l[ATTN_WARPS];
    int h = blockIdx.x, sp = blockIdx.y, n_split = gridDim.y, t = blockIdx.z;
    int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    int n_kv = step[0] + t + 1;
    int p0 = sp * ATTN_CHUNK, p1 = min(p0 + ATTN_CHUNK, n_kv);
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
    for (int e = 0; e < E; e++) {
        qr[e] = q[(i64)h * hd + lane + 32 * e];
        acc[e] = 0.0f;
    }
    float m = NEG_INF, l = 0.0f;
    for (int p = p0 + warp; p < p1; p += ATTN_WARPS) {
        const u16* kr = k_cache + (i64)p * kvw + (i64)kvh * hd;
        float d = 0.0f;
        for (int e = 0; e < E; e++) d += qr[e] * h2f(kr[lane + 32 * e]);
        float s = warp_sum(d) * scale;
        float mn = fmaxf(m, s);
        float a = expf(m - mn), pw = expf(s - mn);
        const u16* vr = v_cache + (i64)p * kvw + (i64)kvh * hd;
        for (int e = 0; e < E; e++) acc[e] = acc[e] * a + pw * h2f(vr[lane + 32 * e]);
        l = l * a + pw;
        m = mn;
    }
    for (int e = 0; e < E; e++) s_o[warp][lane + 32 * e] = acc[e];
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
// the second half of qg's per-head [q | gate]. One block a (head, token).
extern "C" __global__ void attn_merge(const float* part_o, const float* part_ml, const float* qg, float* out, int hd, int n_split) {
    int t = blockIdx.y, n_head = gridDim.x;
    int h = t * n_head + blockIdx.x;  // (token, head) as one index: parts, qg rows and out rows follow it
    float mm = NEG_INF;
    for (int s = 0; s < n_split; s++) mm = fmaxf(mm, part_ml[2 * ((i64)h * n_split + s)]);
    for (int i = threadIdx.x; i < hd; i += blockDim.x) {
        float o = 0.0f, l = 0.0f;
        for (int s = 0; s < n_split; s++) {
            i64 pi = (i64)h * n_split + s;
            float ms = part_ml[2 * pi];
            if (ms == NEG_INF) continue;
            float f = expf(ms - mm);
            o += part_o[pi * hd + i] * f;
            l += part_ml[2 * pi + 1] * f;
        }
        float g = qg[(i64)h * 2 * hd + hd + i];
        out[(i64)h * hd + i] = (o / l) * (1.0f / (1.0f + expf(-g)));
    }
}

// The causal depthwise convolution of n_tok new rows against the conv state, then SiLU, token
// after token; the state shifts a row each (rowwise::conv_silu). taps are tap-major [kernel][cd].
extern "C" __global__ void conv_step(const float* x, float* state, const float* taps, float* out, int cd, int kernel, int n_tok) {
    int c = blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= cd) return;
    for (int t = 0; t < n_tok; t++) {
        float xc = x[(i64)t * cd + c];
        float acc = 0.0f;
        for (int j = 0; j < kernel - 1; j++) acc += state[(i64)j * cd + c] * taps[(i64)j * cd + c];
        acc += xc * taps[(i64)(kernel - 1) * cd + c];
        for (int j = 0; j + 1 < kernel - 1; j++) state[(i64)j * cd + c] = state[(i64)(j + 1) * cd + c];
        if (kernel > 1) state[(i64)(kernel - 2) * cd + c] = xc;
        out[(i64)t * cd + c] = acc / (1.0f + expf(-acc));
    }
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
    float qr[8], kr[8];
    double sq = 0.0, sk = 0.0;
    for (int e = 0; e < E; e++) {
        qr[e] = q[lane + 32 * e];
        kr[e] = k[lane + 32 * e];
        sq += (double)(qr[e] * qr[e]);
        sk += (double)(kr[e] * kr[e]);
    }
    sq = warp_sum_d(sq);
    sk = warp_sum_d(sk);
    float n = (float)sd, post = 1.0f / sqrtf(n);
    float scq = 1.0f / sqrtf((float)(sq / sd) + eps / n), sck = 1.0f / sqrtf((float)(sk / sd) + eps / n);
    for (int e = 0; e < E; e++) {
        qr[e] = (qr[e] * scq) * post;
        kr[e] = (kr[e] * sck) * post;
    }
    float beta = 1.0f / (1.0f + expf(-beta_in[h]));
    float gx = alpha_in[h] + dt_bias[h];
    float sp = gx > 20.0f ? gx : logf(1.0f + expf(gx));
    float decay = expf(sp * a[h]);
    float oscale = 1.0f / sqrtf(n);
    float* Sh = S + (i64)h * sd * sd;
    for (int j = warp; j < sd; j += DELTA_WARPS) {
        float* row = Sh + (i64)j * sd;
        float s[8], kv = 0.0f;
        for (int e = 0; e < E; e++) {
            s[e] = row[lane + 32 * e] * decay;
            kv += s[e] * kr[e];
        }
        kv = warp_sum(kv);
        float d = (v[j] - kv) * beta;
        float o = 0.0f;
        for (int e = 0; e < E; e++) {
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

// x ← x + (Σ_s w_s·ys[s] + sigmoid(sg)·shared) — a MoE layer's weighted sum (slot order, each
// product rounded), its shared expert's gate and the residual add, token blockIdx.y. shared may
// be null.
extern "C" __global__ void moe_combine(float* x, const float* ys, const float* weights, int k, int n, const float* shared, const float* sg) {
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

// The first index of the largest value (greedy sampling), into out[0]. One block of 1024.
extern "C" __global__ void argmax(const float* v, int n, int* out) {
    __shared__ float s_v[32];
    __shared__ int s_i[32];
    int t = threadIdx.x, lane = t & 31, w = t >> 5, nw = (blockDim.x + 31) >> 5;
    float bv = NEG_INF;
    int bi = 0x7fffffff;
    for (int i = t; i < n; i += blockDim.x) {
        float x = v[i];
        if (x > bv || (x == bv && i < bi)) { bv = x; bi = i; }
    }
    for (int o = 16; o > 0; o >>= 1) {
        float ov = __shfl_xor_sync(0xffffffffu, bv, o);
        int oi = __shfl_xor_sync(0xffffffffu, bi, o);
        if (ov > bv || (ov == bv && oi < bi)) { bv = ov; bi = oi; }
    }
    if (lane == 0) { s_v[w] = bv; s_i[w] = bi; }
    __syncthreads();
    if (t == 0) {
        for (int i = 1; i < nw; i++)
            if (s_v[i] > bv || (s_v[i] == bv && s_i[i] < bi)) { bv = s_v[i]; bi = s_i[i]; }
        out[0] = bi == 0x7fffffff ? 0 : bi;
    }
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
        const u8* blk = row + b * 210;
        u32 qa = ld32_2(blk + 64 * n + 4 * g), qb = ld32_2(blk + 64 * n + 32 + 4 * g), qh = ld32_2(blk + 128 + 32 * n + 4 * g);
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
        const u8* blk = row + b * 34;
        u32 q = ld32_2(blk + 2 + 4 * g);
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
    i64 i = (i64)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) {
        float g = h[i];
        h[i] = g / (1.0f + expf(-g)) * u[i];
    }
}
