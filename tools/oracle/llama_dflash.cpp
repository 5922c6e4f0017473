// llama_dflash: llama.cpp's DFlash block drafter as its speculative driver runs it, for xwen's
// DFlash parity test (never in xwen's inference path).
//
// For each prompt (a line of space-separated token ids), with the steps of common/speculative.cpp's
// draft-dflash (common_speculative_impl_draft_dflash):
//   1. the target decodes the whole prompt in one llama_decode with the sidecar's target layers'
//      inputs extracted (llama_set_embeddings_layer_inp); the features, each row the tapped
//      layers' inputs concatenated in target_layers order, are OUT_PREFIX.p<i>.feat.npy
//      [n, n_tap * n_embd];
//   2. process(): the features injected into the draft context's KV cache at positions 0..n-1
//      (an embd batch: fc, enc.output_norm, each layer's K/V);
//   3. draft(): the noise block [id_last, mask * (B-1)] at positions n..n+B-1 in one decode,
//      non-causal: the logits of every block row are OUT_PREFIX.p<i>.block.npy [B, n_vocab],
//      and on stdout "p<i> drafts: id ..." (argmax of rows 1..B-1, which the top-k sampler picks).
// B is the sidecar's dflash.block_size unless --block B; KV caches f32 and flash attention off
// (the parity suite's oracle settings).
//
// usage: llama_dflash MODEL.gguf SIDECAR.gguf PROMPTS.txt OUT_PREFIX [--block B] [--threads N]

#include "llama.h"
#include "llama-ext.h"
#include "ggml.h"

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

static int argmax(const float * v, int n) {
    int best = 0;
    for (int i = 1; i < n; i++) {
        if (v[i] > v[best]) best = i;
    }
    return best;
}

int main(int argc, char ** argv) {
    if (argc < 5) {
        fprintf(stderr, "usage: %s MODEL.gguf SIDECAR.gguf PROMPTS.txt OUT_PREFIX [--block B] [--threads N]\n", argv[0]);
        return 2;
    }
    const char * model_path = argv[1];
    const char * dft_path = argv[2];
    const char * prompts_path = argv[3];
    std::string out_prefix = argv[4];
    int block = 0;
    int n_threads = 2;
    for (int i = 5; i < argc; i++) {
        std::string a = argv[i];
        if (i + 1 >= argc) { fprintf(stderr, "missing value for %s\n", a.c_str()); return 2; }
        std::string v = argv[++i];
        if (a == "--block") block = atoi(v.c_str());
        else if (a == "--threads") n_threads = atoi(v.c_str());
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
    llama_model * model = llama_model_load_from_file(model_path, mp);
    if (!model) { fprintf(stderr, "failed to load %s\n", model_path); return 1; }
    llama_model * model_dft = llama_model_load_from_file(dft_path, mp);
    if (!model_dft) { fprintf(stderr, "failed to load %s\n", dft_path); return 1; }
    const int32_t * taps = llama_model_target_layer_ids(model_dft);
    const uint32_t n_tap = llama_model_target_layer_ids_n(model_dft);
    if (n_tap == 0) { fprintf(stderr, "the sidecar has no target_layers\n"); return 1; }
    if (block <= 0) {
        char buf[32] = {};
        block = llama_model_meta_val_str(model_dft, "dflash.block_size", buf, sizeof(buf)) >= 0 ? atoi(buf) : 16;
    }
    const llama_token mask = llama_vocab_mask(llama_model_get_vocab(model_dft));
    const int n_vocab = llama_vocab_n_tokens(llama_model_get_vocab(model));
    const int n_embd = llama_model_n_embd(model);
    const size_t n_enc = (size_t) n_tap * n_embd;

    for (size_t p = 0; p < prompts.size(); p++) {
        const auto & ids = prompts[p];
        const int n = (int) ids.size();

        llama_context_params cp = llama_context_default_params();
        cp.n_ctx = (uint32_t) (n + block + 16);
        cp.n_batch = (uint32_t) (n + block);
        cp.n_ubatch = (uint32_t) (n + block);
        cp.n_seq_max = 1;
        cp.n_threads = n_threads;
        cp.n_threads_batch = n_threads;
        cp.type_k = GGML_TYPE_F32;
        cp.type_v = GGML_TYPE_F32;
        cp.flash_attn_type = LLAMA_FLASH_ATTN_TYPE_DISABLED;
        cp.no_perf = true;
        llama_context * tgt = llama_init_from_model(model, cp);
        if (!tgt) { fprintf(stderr, "failed to create the target context\n"); return 1; }
        for (uint32_t k = 0; k < n_tap; k++) llama_set_embeddings_layer_inp(tgt, (uint32_t) taps[k], true);

        llama_context_params cd = cp;
        cd.ctx_other = tgt;
        llama_context * dft = llama_init_from_model(model_dft, cd);
        if (!dft) { fprintf(stderr, "failed to create the draft context\n"); return 1; }
        llama_set_embeddings_nextn(dft, true, /*masked*/ true);
        llama_set_causal_attn(dft, false);

        // 1. the target over the prompt, the tapped layers' inputs of every row
        llama_batch batch = llama_batch_init(n, 0, 1);
        batch.n_tokens = n;
        for (int i = 0; i < n; i++) {
            batch.token[i] = ids[i];
            batch.pos[i] = i;
            batch.n_seq_id[i] = 1;
            batch.seq_id[i][0] = 0;
            batch.logits[i] = i == n - 1;
        }
        if (llama_decode(tgt, batch) != 0) { fprintf(stderr, "target decode failed\n"); return 1; }
        llama_batch_free(batch);
        const int id_last = argmax(llama_get_logits_ith(tgt, -1), n_vocab);
        std::vector<float> feat((size_t) n * n_enc);
        for (uint32_t k = 0; k < n_tap; k++) {
            const float * layer = llama_get_embeddings_layer_inp(tgt, (uint32_t) taps[k]);
            if (!layer) { fprintf(stderr, "layer %d input not extracted\n", taps[k]); return 1; }
            for (int i = 0; i < n; i++) memcpy(&feat[(size_t) i * n_enc + (size_t) k * n_embd], layer + (size_t) i * n_embd, sizeof(float) * n_embd);
        }
        std::string pre = out_prefix + ".p" + std::to_string(p);
        if (!write_npy_f32(pre + ".feat.npy", feat, n, n_enc)) { fprintf(stderr, "cannot write %s.feat.npy\n", pre.c_str()); return 1; }

        // 2. process(): the features into the draft KV cache at the prompt's positions
        llama_batch_ext * b = llama_batch_ext_init(dft);
        llama_batch_ext_clear(b);
        for (int i = 0; i < n; i++) {
            const int32_t idx = llama_batch_ext_add_embd(b, 0, {&feat[(size_t) i * n_enc], 1, n_enc});
            if (idx < 0) { fprintf(stderr, "batch add failed (%d)\n", idx); return 1; }
            llama_pos ps[4] = {i, i, i, 0};
            llama_batch_ext_set_pos(b, idx, ps);
        }
        if (llama_process(dft, LLAMA_PROCESS_TYPE_DECODE, b) != 0) { fprintf(stderr, "DFlash injection failed\n"); return 1; }

        // 3. draft(): the noise block in one decode
        llama_batch_ext_clear(b);
        for (int i = 0; i < block; i++) {
            const int32_t idx = llama_batch_ext_add_token(b, 0, i == 0 ? id_last : mask);
            if (idx < 0) { fprintf(stderr, "batch add failed (%d)\n", idx); return 1; }
            llama_pos ps[4] = {n + i, 0, 0, 0};
            llama_batch_ext_set_pos(b, idx, ps);
            llama_batch_ext_set_output_logits(b, idx, true);
        }
        if (llama_process(dft, LLAMA_PROCESS_TYPE_DECODE, b) != 0) { fprintf(stderr, "DFlash block decode failed\n"); return 1; }
        std::vector<float> rows((size_t) block * n_vocab);
        std::vector<int> drafts;
        for (int i = 0; i < block; i++) {
            const float * lg = llama_get_logits_ith(dft, i);
            memcpy(&rows[(size_t) i * n_vocab], lg, sizeof(float) * n_vocab);
            if (i > 0) drafts.push_back(argmax(lg, n_vocab));
        }
        if (!write_npy_f32(pre + ".block.npy", rows, block, n_vocab)) { fprintf(stderr, "cannot write %s.block.npy\n", pre.c_str()); return 1; }
        printf("p%zu last: %d\n", p, id_last);
        printf("p%zu drafts:", p);
        for (int t : drafts) printf(" %d", t);
        printf("\n");
        fflush(stdout);
        llama_batch_ext_free(b);
        llama_free(dft);
        llama_free(tgt);
    }
    llama_model_free(model_dft);
    llama_model_free(model);
    llama_backend_free();
    return 0;
}
