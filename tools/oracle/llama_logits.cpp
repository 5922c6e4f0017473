// llama_logits: the llama.cpp side of the parity oracle (never in xwen's inference path).
//
// For each prompt (a line of space-separated token ids) it decodes the whole prompt in ONE
// llama_decode with an output at every position, writes those logits as float32 .npy
// [n_prompt, n_vocab], then greedy-generates N tokens one decode at a time and prints them.
// A fresh context per prompt, so no recurrent or KV state can leak between prompts.
//
// KV cache is F32 by default: with the default F16 cache the f32 tier would measure f16
// rounding of K/V, not the model arithmetic xwen is compared on. Flash attention is off by
// default for the same reason (ggml's CPU FA path converts Q to the K type's vec-dot type).
//
// usage: llama_logits MODEL.gguf PROMPTS.txt OUT_PREFIX [--n-gen N] [--threads N]
//                     [--kv f32|f16|q8_0] [--fa on|off] [--repack on|off] [--ubatch N]
// writes OUT_PREFIX.p<i>.npy for prompt i and prints "p<i> greedy: id id ..." and
// "p<i> gap: g g ..." (top-1 minus top-2 logit at each greedy step) on stdout.

#include "llama.h"
#include "ggml.h"

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

static void quiet_log(enum ggml_log_level level, const char * text, void *) {
    if (level == GGML_LOG_LEVEL_ERROR || level == GGML_LOG_LEVEL_WARN) {
        fputs(text, stderr);
    }
}

static bool write_npy_f32(const std::string & path, const std::vector<float> & data, size_t rows, size_t cols) {
    std::string header = "{'descr': '<f4', 'fortran_order': False, 'shape': (" +
                         std::to_string(rows) + ", " + std::to_string(cols) + "), }";
    // npy v1: magic(6) + version(2) + len(2) + header, padded with spaces to a multiple of 64, ending in '\n'
    size_t total = 10 + header.size() + 1;
    size_t pad = (64 - total % 64) % 64;
    header += std::string(pad, ' ');
    header += '\n';
    FILE * f = fopen(path.c_str(), "wb");
    if (!f) return false;
    const unsigned char magic[8] = {0x93, 'N', 'U', 'M', 'P', 'Y', 1, 0};
    fwrite(magic, 1, 8, f);
    unsigned short hlen = (unsigned short) header.size();
    unsigned char hl[2] = {(unsigned char) (hlen & 0xff), (unsigned char) (hlen >> 8)};
    fwrite(hl, 1, 2, f);
    fwrite(header.data(), 1, header.size(), f);
    fwrite(data.data(), sizeof(float), data.size(), f);
    return fclose(f) == 0;
}

static int argmax(const float * v, int n, float * gap) {
    int best = 0;
    for (int i = 1; i < n; i++) {
        if (v[i] > v[best]) best = i;  // first index wins ties, like numpy/torch argmax
    }
    float second = -INFINITY;
    for (int i = 0; i < n; i++) {
        if (i != best && v[i] > second) second = v[i];
    }
    *gap = v[best] - second;
    return best;
}

int main(int argc, char ** argv) {
    if (argc < 4) {
        fprintf(stderr, "usage: %s MODEL.gguf PROMPTS.txt OUT_PREFIX [--n-gen N] [--threads N] [--kv f32|f16|q8_0] [--fa on|off] [--repack on|off] [--ubatch N]\n", argv[0]);
        return 2;
    }
    const char * model_path = argv[1];
    const char * prompts_path = argv[2];
    std::string out_prefix = argv[3];
    int n_gen = 32;
    int n_threads = 2;
    ggml_type kv_type = GGML_TYPE_F32;
    bool fa = false;
    bool repack = true;
    int ubatch = 0;  // 0: the whole prompt in one ubatch
    for (int i = 4; i < argc; i++) {
        std::string a = argv[i];
        if (i + 1 >= argc) { fprintf(stderr, "missing value for %s\n", a.c_str()); return 2; }
        std::string v = argv[++i];
        if (a == "--n-gen") n_gen = atoi(v.c_str());
        else if (a == "--threads") n_threads = atoi(v.c_str());
        else if (a == "--kv") kv_type = (v == "f16") ? GGML_TYPE_F16 : (v == "q8_0") ? GGML_TYPE_Q8_0 : GGML_TYPE_F32;
        else if (a == "--fa") fa = (v == "on");
        else if (a == "--repack") repack = (v == "on");
        else if (a == "--ubatch") ubatch = atoi(v.c_str());
        else { fprintf(stderr, "unknown option %s\n", a.c_str()); return 2; }
    }

    std::vector<std::vector<llama_token>> prompts;
    {
        std::ifstream in(prompts_path);
        if (!in) { fprintf(stderr, "cannot read %s\n", prompts_path); return 1; }
        std::string line;
        while (std::getline(in, line)) {
            std::istringstream ss(line);
            std::vector<llama_token> ids;
            long t;
            while (ss >> t) ids.push_back((llama_token) t);
            if (!ids.empty()) prompts.push_back(ids);
        }
    }

    llama_log_set(quiet_log, nullptr);
    llama_backend_init();

    llama_model_params mp = llama_model_default_params();
    mp.n_gpu_layers = 0;
    mp.use_extra_bufts = repack;  // ggml-cpu's runtime weight repacking (its default: on)
    llama_model * model = llama_model_load_from_file(model_path, mp);
    if (!model) { fprintf(stderr, "failed to load %s\n", model_path); return 1; }
    const llama_vocab * vocab = llama_model_get_vocab(model);
    const int n_vocab = llama_vocab_n_tokens(vocab);

    for (size_t p = 0; p < prompts.size(); p++) {
        const auto & ids = prompts[p];
        const int n = (int) ids.size();

        llama_context_params cp = llama_context_default_params();
        cp.n_ctx = (uint32_t) (n + n_gen + 16);
        cp.n_batch = (uint32_t) n;
        // default: the whole prompt is one ubatch (one graph, chunked DeltaNet over all of it)
        cp.n_ubatch = (uint32_t) (ubatch > 0 && ubatch < n ? ubatch : n);
        cp.n_seq_max = 1;
        cp.n_threads = n_threads;
        cp.n_threads_batch = n_threads;
        cp.type_k = kv_type;
        cp.type_v = kv_type;
        cp.flash_attn_type = fa ? LLAMA_FLASH_ATTN_TYPE_ENABLED : LLAMA_FLASH_ATTN_TYPE_DISABLED;
        cp.no_perf = true;
        llama_context * ctx = llama_init_from_model(model, cp);
        if (!ctx) { fprintf(stderr, "failed to create context\n"); return 1; }

        llama_batch batch = llama_batch_init(n, 0, 1);
        batch.n_tokens = n;
        for (int i = 0; i < n; i++) {
            batch.token[i] = ids[i];
            batch.pos[i] = i;
            batch.n_seq_id[i] = 1;
            batch.seq_id[i][0] = 0;
            batch.logits[i] = 1;
        }
        if (llama_decode(ctx, batch) != 0) { fprintf(stderr, "prompt decode failed\n"); return 1; }

        std::vector<float> all((size_t) n * n_vocab);
        for (int i = 0; i < n; i++) {
            const float * row = llama_get_logits_ith(ctx, i);
            memcpy(&all[(size_t) i * n_vocab], row, sizeof(float) * n_vocab);
        }
        std::string path = out_prefix + ".p" + std::to_string(p) + ".npy";
        if (!write_npy_f32(path, all, n, n_vocab)) { fprintf(stderr, "cannot write %s\n", path.c_str()); return 1; }
        llama_batch_free(batch);

        // the top-1 minus top-2 logit at each step: a divergence at a step with a tiny gap is a
        // near-tie, not a bug; the parity suite reads these to say which one it saw
        std::vector<int> gen;
        std::vector<float> gaps;
        float gap = 0.0f;
        int tok = argmax(&all[(size_t) (n - 1) * n_vocab], n_vocab, &gap);
        gen.push_back(tok);
        gaps.push_back(gap);
        llama_batch one = llama_batch_init(1, 0, 1);
        for (int s = 1; s < n_gen; s++) {
            one.n_tokens = 1;
            one.token[0] = tok;
            one.pos[0] = n + s - 1;
            one.n_seq_id[0] = 1;
            one.seq_id[0][0] = 0;
            one.logits[0] = 1;
            if (llama_decode(ctx, one) != 0) { fprintf(stderr, "decode failed at step %d\n", s); return 1; }
            tok = argmax(llama_get_logits_ith(ctx, -1), n_vocab, &gap);
            gen.push_back(tok);
            gaps.push_back(gap);
        }
        llama_batch_free(one);
        printf("p%zu greedy:", p);
        for (int t : gen) printf(" %d", t);
        printf("\n");
        printf("p%zu gap:", p);
        for (float g : gaps) printf(" %.6g", g);
        printf("\n");
        fflush(stdout);
        llama_free(ctx);
    }
    llama_model_free(model);
    llama_backend_free();
    return 0;
}
