// llama.cpp's tokenization of test inputs, in the format of its models/ggml-vocab-*.gguf.inp/.out
// (tests/test-tokenizer-0.cpp: add_special = false, parse_special = false): one line of
// space-separated ids per input. Used to make reference vectors for a pre-tokenizer no committed
// vocabulary carries (tools/oracle/vocab_refs.sh).
//   usage: tokenize_vectors VOCAB.gguf INPUTS.inp OUTPUT.out
#include "llama.h"

#include <cstdio>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

static void quiet_log(ggml_log_level, const char *, void *) {}

int main(int argc, char ** argv) {
    if (argc != 4) {
        fprintf(stderr, "usage: %s VOCAB.gguf INPUTS.inp OUTPUT.out\n", argv[0]);
        return 2;
    }
    std::ifstream in(argv[2], std::ios::binary);
    if (!in) { fprintf(stderr, "cannot read %s\n", argv[2]); return 1; }
    std::stringstream ss;
    ss << in.rdbuf();
    const std::string raw = ss.str();
    const std::string sep = "\n__ggml_vocab_test__\n";
    std::vector<std::string> inputs;
    size_t pos = 0;
    while (pos < raw.size()) {
        size_t n = raw.find(sep, pos);
        if (n == std::string::npos) { inputs.push_back(raw.substr(pos)); break; }
        inputs.push_back(raw.substr(pos, n - pos));
        pos = n + sep.size();
    }

    llama_log_set(quiet_log, nullptr);
    llama_backend_init();
    llama_model_params mp = llama_model_default_params();
    mp.vocab_only = true;
    llama_model * model = llama_model_load_from_file(argv[1], mp);
    if (!model) { fprintf(stderr, "failed to load %s\n", argv[1]); return 1; }
    const llama_vocab * vocab = llama_model_get_vocab(model);

    FILE * out = fopen(argv[3], "w");
    if (!out) { fprintf(stderr, "cannot write %s\n", argv[3]); return 1; }
    for (const auto & text : inputs) {
        std::vector<llama_token> ids(text.size() + 8);
        int n = llama_tokenize(vocab, text.data(), (int) text.size(), ids.data(), (int) ids.size(), false, false);
        if (n < 0) { ids.resize(-n); n = llama_tokenize(vocab, text.data(), (int) text.size(), ids.data(), (int) ids.size(), false, false); }
        for (int i = 0; i < n; i++) fprintf(out, i ? " %d" : "%d", ids[i]);
        fprintf(out, "\n");
    }
    fclose(out);
    llama_model_free(model);
    return 0;
}
