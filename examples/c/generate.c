/* Complete a prompt with xwen from C: the text streams as it is generated (a callback), then
 * the token ids, the finish reason and the usage are printed.
 *
 *   cc -I include examples/c/generate.c target/release/libxwen_capi.a -lpthread -ldl -lm -o generate
 *   ./generate                       # the embedded demo model, greedy, its default prompt
 *   ./generate -m MODEL.gguf -p "Once upon a time" -n 64 -t 0.7
 *   ./generate --ids                 # only the token ids, one line (as `xwen run --print-ids`)
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "xwen.h"

static bool print_piece(void *user_data, const xwen_event *ev) {
    (void)user_data;
    if (ev->kind == XWEN_EVENT_TOKEN) {
        fwrite(ev->text, 1, ev->text_len, stdout);
        fflush(stdout);
    }
    return true; /* false would stop the generation here */
}

static int fail(const char *what) {
    fprintf(stderr, "generate: %s: %s\n", what, xwen_last_error());
    return 1;
}

int main(int argc, char **argv) {
    const char *model_path = NULL; /* NULL: the embedded demo model */
    const char *prompt = "def fibonacci(n):\n";
    long n_predict = 32;
    float temperature = -1.0f; /* the model's default; the demo model is greedy */
    bool ids_only = false;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "-m") && i + 1 < argc) model_path = argv[++i];
        else if (!strcmp(argv[i], "-p") && i + 1 < argc) prompt = argv[++i];
        else if (!strcmp(argv[i], "-n") && i + 1 < argc) n_predict = strtol(argv[++i], NULL, 10);
        else if (!strcmp(argv[i], "-t") && i + 1 < argc) temperature = strtof(argv[++i], NULL);
        else if (!strcmp(argv[i], "--ids")) ids_only = true;
        else {
            fprintf(stderr, "usage: %s [-m MODEL] [-p PROMPT] [-n N] [-t TEMP] [--ids]\n", argv[0]);
            return 2;
        }
    }

    xwen_model *model = NULL;
    if (xwen_model_load(model_path, NULL, &model) != XWEN_OK) return fail("load");

    xwen_generate_options opts;
    xwen_generate_options_init(&opts);
    opts.max_tokens = n_predict;
    opts.temperature = temperature;

    xwen_completion *done = NULL;
    if (!ids_only) fputs(prompt, stdout);
    if (xwen_generate(model, prompt, &opts, ids_only ? NULL : print_piece, NULL, &done) != XWEN_OK) {
        xwen_model_free(model);
        return fail("generate");
    }

    size_t n = 0;
    const uint32_t *ids = xwen_completion_tokens(done, &n);
    if (ids_only) {
        for (size_t i = 0; i < n; i++) printf(i ? " %u" : "%u", ids[i]);
        printf("\n");
    } else {
        xwen_usage usage;
        xwen_completion_usage(done, &usage);
        printf("\n[%zu tokens, finish: %s, prompt %zu tokens, decode %.3f s]\n", n,
               xwen_completion_finish_reason(done), usage.prompt_tokens, usage.decode_secs);
    }
    xwen_completion_free(done);
    xwen_model_free(model);
    return 0;
}
