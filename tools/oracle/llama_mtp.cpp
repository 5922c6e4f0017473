// llama_mtp: llama.cpp's MTP (NextN) draft head as its speculative driver runs it, for xwen's
// MTP parity test (never in xwen's inference path).
//
// For each prompt (a line of space-separated token ids), with the pairing of
// common/speculative.cpp's draft-mtp (common_speculative_impl_draft_mtp):
//   1. the target decodes the whole prompt in one llama_decode; its h_nextn rows (the hidden
//      after output_norm, every row) are written as OUT_PREFIX.p<i>.h.npy [n, n_embd];
//   2. the MTP context decodes the prompt's tokens at the same positions, token k paired with
//      the target's hidden row k-1 (row 0 with zeros: the driver's pending_h starts at zero) —
//      process() — with an output at every row: OUT_PREFIX.p<i>.mtp.npy [n, n_vocab];
//   3. draft(): the target's greedy next token at position n with pending_h = h row n-1, then
//      each drafted token with the MTP's own h_nextn of the step before, one decode each, for
//      --draft D steps: their logits OUT_PREFIX.p<i>.draft.npy [D, n_vocab], and on stdout
//      "p<i> drafts: id ..." (the argmax of each step, which the draft sampler's top-k picks).
// KV caches f32 and flash attention off by default (the parity suite's oracle settings).
//
// usage: llama_mtp MODEL.gguf PROMPTS.txt OUT_PREFIX [--mtp SIDECAR.gguf] [--draft D]
//                  [--threads N] [--kv f32|f16] [--fa on|off]
// With --mtp the head is the sidecar's (an MTP-only GGUF: convert_hf_to_gguf.py --mtp), as
// llama.cpp loads a separate draft model; without it, MODEL.gguf's own nextn block.

#include "llama.h"
#include "llama-ext.h"
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

// one entry of an MTP batch: a token at a position with the hidden row it is paired with
// (common_batch::add + set_embd, rendered as common_batch::get_sub_batch does)
static void add_entry(llama_batch_ext * b, llama_token id, llama_pos pos, const float * h, int n_embd, bool out) {
    const int32_t idx = llama_batch_ext_add_token(b, 0, id);
    if (idx < 0) { fprintf(stderr, "batch add failed (%d)\n", idx); exit(1); }
    llama_pos p[4] = {pos, 0, 0, 0};
    llama_batch_ext_set_pos(b, idx, p);
    if (!llama_batch_ext_set_embd_token(b, idx, {h, 1, (size_t) n_embd})) { fprintf(stderr, "set_embd failed\n"); exit(1); }
    if (out) llama_batch_ext_set_output_logits(b, idx, true);
}

int main(int argc, char ** argv) {
    if (argc < 4) {
        fprintf(stderr, "usage: %s MODEL.gguf PROMPTS.txt OUT_PREFIX [--mtp SIDECAR.gguf] [--draft D] [--threads N] [--kv f32|f16] [--fa on|off]\n", argv[0]);
        return 2;
    }
    const char * model_path = argv[1];
    const char * prompts_path = argv[2];
    std::string out_prefix = argv[3];
    std::string mtp_path;
    int n_draft = 4;
    int n_threads = 2;
    ggml_type kv_type = GGML_TYPE_F32;
    bool fa = false;
    for (int i = 4; i < argc; i++) {
        std::string a = argv[i];
        if (i + 1 >= argc) { fprintf(stderr, "missing value for %s\n", a.c_str()); return 2; }
        std::string v = argv[++i];
        if (a == "--mtp") mtp_path = v;
        else if (a == "--draft") n_draft = atoi(v.c_str());
        else if (a == "--threads") n_threads = atoi(v.c_str());
        else if (a == "--kv") kv_type = (v == "f16") ? GGML_TYPE_F16 : GGML_TYPE_F32;
        else if (a == "--fa") fa = (v == "on");
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
    mp.load_mtp = true;  // llama.cpp skips the nextn block unless asked
    llama_model * model = llama_model_load_from_file(model_path, mp);
    if (!model) { fprintf(stderr, "failed to load %s\n", model_path); return 1; }
    llama_model * model_dft = model;
    if (!mtp_path.empty()) {
        model_dft = llama_model_load_from_file(mtp_path.c_str(), mp);
        if (!model_dft) { fprintf(stderr, "failed to load %s\n", mtp_path.c_str()); return 1; }
    }
    if (llama_model_n_layer_nextn(model_dft) < 1) { fprintf(stderr, "the draft model has no nextn block\n"); return 1; }
    const int n_vocab = llama_vocab_n_tokens(llama_model_get_vocab(model));
    const int n_embd = llama_model_n_embd_out(model);

    for (size_t p = 0; p < prompts.size(); p++) {
        const auto & ids = prompts[p];
        const int n = (int) ids.size();

        llama_context_params cp = llama_context_default_params();
        cp.n_ctx = (uint32_t) (n + n_draft + 16);
        cp.n_batch = (uint32_t) (n + n_draft);
        cp.n_ubatch = (uint32_t) (n + n_draft);
        cp.n_seq_max = 1;
        cp.n_threads = n_threads;
        cp.n_threads_batch = n_threads;
        cp.type_k = kv_type;
        cp.type_v = kv_type;
        cp.flash_attn_type = fa ? LLAMA_FLASH_ATTN_TYPE_ENABLED : LLAMA_FLASH_ATTN_TYPE_DISABLED;
        cp.no_perf = true;
        llama_context * tgt = llama_init_from_model(model, cp);
        if (!tgt) { fprintf(stderr, "failed to create the target context\n"); return 1; }
        llama_set_embeddings_nextn(tgt, true, /*masked*/ false);

        llama_context_params cd = cp;
        cd.ctx_type = LLAMA_CONTEXT_TYPE_MTP;
        cd.n_rs_seq = 0;
        cd.ctx_other = tgt;
        llama_context * dft = llama_init_from_model(model_dft, cd);
        if (!dft) { fprintf(stderr, "failed to create the MTP context\n"); return 1; }
        llama_set_embeddings_nextn(dft, true, /*masked*/ true);

        // 1. the target over the prompt
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
        std::vector<float> h((size_t) n * n_embd);
        memcpy(h.data(), llama_get_embeddings_nextn(tgt), h.size() * sizeof(float));
        std::string pre = out_prefix + ".p" + std::to_string(p);
        if (!write_npy_f32(pre + ".h.npy", h, n, n_embd)) { fprintf(stderr, "cannot write %s.h.npy\n", pre.c_str()); return 1; }

        // 2. process(): token k with the target's hidden k-1 (zeros for the first)
        std::vector<float> zeros(n_embd, 0.0f);
        llama_batch_ext * b = llama_batch_ext_init(dft);
        llama_batch_ext_clear(b);
        for (int k = 0; k < n; k++) {
            add_entry(b, ids[k], k, k == 0 ? zeros.data() : &h[(size_t) (k - 1) * n_embd], n_embd, true);
        }
        if (llama_process(dft, LLAMA_PROCESS_TYPE_DECODE, b) != 0) { fprintf(stderr, "MTP process failed\n"); return 1; }
        std::vector<float> mtp((size_t) n * n_vocab);
        for (int k = 0; k < n; k++) {
            memcpy(&mtp[(size_t) k * n_vocab], llama_get_logits_ith(dft, k), sizeof(float) * n_vocab);
        }
        if (!write_npy_f32(pre + ".mtp.npy", mtp, n, n_vocab)) { fprintf(stderr, "cannot write %s.mtp.npy\n", pre.c_str()); return 1; }

        // 3. draft(): (id_last, h[n-1]) at n, then each draft with the head's own h_nextn
        std::vector<float> rows((size_t) n_draft * n_vocab);
        std::vector<int> drafts;
        std::vector<float> hp(h.end() - n_embd, h.end());
        int tok = id_last;
        for (int s = 0; s < n_draft; s++) {
            llama_batch_ext_clear(b);
            add_entry(b, tok, n + s, hp.data(), n_embd, true);
            if (llama_process(dft, LLAMA_PROCESS_TYPE_DECODE, b) != 0) { fprintf(stderr, "MTP draft step %d failed\n", s); return 1; }
            const float * lg = llama_get_logits_ith(dft, 0);
            memcpy(&rows[(size_t) s * n_vocab], lg, sizeof(float) * n_vocab);
            tok = argmax(lg, n_vocab);
            drafts.push_back(tok);
            memcpy(hp.data(), llama_get_embeddings_nextn_ith(dft, 0), sizeof(float) * n_embd);
        }
        if (!write_npy_f32(pre + ".draft.npy", rows, n_draft, n_vocab)) { fprintf(stderr, "cannot write %s.draft.npy\n", pre.c_str()); return 1; }
        printf("p%zu last: %d\n", p, id_last);
        printf("p%zu drafts:", p);
        for (int t : drafts) printf(" %d", t);
        printf("\n");
        fflush(stdout);
        llama_batch_ext_free(b);
        llama_free(dft);
        llama_free(tgt);
    }
    if (model_dft != model) llama_model_free(model_dft);
    llama_model_free(model);
    llama_backend_free();
    return 0;
}
