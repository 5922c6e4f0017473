// Dumps llama.cpp's intermediate tensors for one prompt, to bisect a parity difference layer by
// layer (docs/parity.md, "How the mismatches were found"): every F32 contiguous tensor of the
// graph whose name contains one of the filters is written as raw float32 to OUTDIR/NAME.bin,
// and OUTDIR/index.txt lists `NAME ne0 ne1 ne2 ne3` (ggml order: ne0 is the fastest axis).
// A tensor computed more than once (one decode per token with --ubatch 1) keeps its last value,
// i.e. the last token's.
//
//   llama_dump MODEL PROMPT.txt OUTDIR [--filter l_out-,attn_output-,...] [--ubatch 1]
//              [--threads 2] [--kv f32|f16|q8_0] [--fa on|off]
// PROMPT.txt: token ids, space-separated. KV cache F32, flash attention off by default, as
// llama_logits.
// Build: TOOL=llama_dump tools/oracle/build_llama_logits.sh
#include "ggml-backend.h"
#include "ggml.h"
#include "llama.h"

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

static std::string g_out;
static std::vector<std::string> g_filters;
static FILE * g_index = nullptr;

static bool want(const std::string & n) {
    if (g_filters.empty()) return true;
    for (const auto & f : g_filters) {
        if (n.find(f) != std::string::npos) return true;
    }
    return false;
}

static bool cb(struct ggml_tensor * t, bool ask, void *) {
    const std::string n = t->name;
    if (ask) return want(n);
    if (!want(n) || t->type != GGML_TYPE_F32 || !ggml_is_contiguous(t)) return true;
    std::vector<float> buf(ggml_nelements(t));
    ggml_backend_tensor_get(t, buf.data(), 0, buf.size() * sizeof(float));
    std::string safe = n;
    for (auto & c : safe) if (c == '/' || c == ' ' || c == '(' || c == ')') c = '_';
    FILE * f = fopen((g_out + "/" + safe + ".bin").c_str(), "wb");
    if (f) { fwrite(buf.data(), sizeof(float), buf.size(), f); fclose(f); }
    fprintf(g_index, "%s %lld %lld %lld %lld\n", safe.c_str(), (long long) t->ne[0], (long long) t->ne[1],
            (long long) t->ne[2], (long long) t->ne[3]);
    return true;
}

int main(int argc, char ** argv) {
    if (argc < 4) {
        fprintf(stderr, "usage: %s MODEL PROMPT.txt OUTDIR [--filter a,b] [--ubatch 1] [--threads N]\n", argv[0]);
        return 1;
    }
    g_out = argv[3];
    int ubatch = 0, threads = 2;
    ggml_type kv = GGML_TYPE_F32;
    bool fa = false;
    for (int i = 4; i + 1 < argc; i += 2) {
        if (!strcmp(argv[i], "--filter")) {
            std::stringstream ss(argv[i + 1]);
            std::string s;
            while (std::getline(ss, s, ',')) if (!s.empty()) g_filters.push_back(s);
        } else if (!strcmp(argv[i], "--ubatch")) {
            ubatch = atoi(argv[i + 1]);
        } else if (!strcmp(argv[i], "--threads")) {
            threads = atoi(argv[i + 1]);
        } else if (!strcmp(argv[i], "--kv")) {
            kv = !strcmp(argv[i + 1], "f16") ? GGML_TYPE_F16 : !strcmp(argv[i + 1], "q8_0") ? GGML_TYPE_Q8_0 : GGML_TYPE_F32;
        } else if (!strcmp(argv[i], "--fa")) {
            fa = !strcmp(argv[i + 1], "on");
        } else {
            fprintf(stderr, "unknown option %s\n", argv[i]);
            return 1;
        }
    }
    std::vector<llama_token> ids;
    {
        std::ifstream in(argv[2]);
        long t;
        while (in >> t) ids.push_back((llama_token) t);
    }
    if (ids.empty()) { fprintf(stderr, "no token ids in %s\n", argv[2]); return 1; }
    g_index = fopen((g_out + "/index.txt").c_str(), "w");
    if (!g_index) { fprintf(stderr, "cannot write %s/index.txt\n", g_out.c_str()); return 1; }
    llama_backend_init();
    llama_model * m = llama_model_load_from_file(argv[1], llama_model_default_params());
    if (!m) { fprintf(stderr, "cannot load %s\n", argv[1]); return 1; }
    auto cp = llama_context_default_params();
    const int n = (int) ids.size();
    cp.n_ctx = n < 256 ? 256 : n;
    cp.n_batch = cp.n_ubatch = ubatch > 0 ? ubatch : n;
    cp.n_threads = cp.n_threads_batch = threads;
    cp.type_k = cp.type_v = kv;
    cp.flash_attn_type = fa ? LLAMA_FLASH_ATTN_TYPE_ENABLED : LLAMA_FLASH_ATTN_TYPE_DISABLED;
    cp.cb_eval = cb;
    llama_context * c = llama_init_from_model(m, cp);
    const int step = ubatch > 0 ? ubatch : n;
    for (int p0 = 0; p0 < n; p0 += step) {
        const int k = (n - p0) < step ? (n - p0) : step;
        llama_batch b = llama_batch_init(k, 0, 1);
        for (int i = 0; i < k; i++) {
            b.token[i] = ids[p0 + i];
            b.pos[i] = p0 + i;
            b.n_seq_id[i] = 1;
            b.seq_id[i][0] = 0;
            b.logits[i] = 1;
        }
        b.n_tokens = k;
        if (llama_decode(c, b)) { fprintf(stderr, "llama_decode failed at %d\n", p0); return 1; }
        llama_batch_free(b);
    }
    fclose(g_index);
    llama_free(c);
    llama_model_free(m);
    fprintf(stderr, "wrote %s/index.txt\n", g_out.c_str());
    return 0;
}
