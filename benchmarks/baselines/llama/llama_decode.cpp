// T=1 greedy-computed decode through llama.cpp (libllama), default mmap: the llama.cpp side of
// benchmarks/model/bench_scale.py and bench_e2e --model scaleN. Decodes the first PROMPT token ids as one
// batch (the prompt; default 1), then the rest one at a time (real attention and KV cache), takes the
// argmax of every step's logits, and prints one JSON line per step: wall time of the decode call,
// cumulative major/minor faults (getrusage), and the wall clock at its end (for time to first token
// from process start, measured by the parent).
//   llama_decode MODEL.gguf THREADS TOKENS(comma separated) [PROMPT]
#include "llama.h"

#include <sys/resource.h>
#include <sys/time.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

static double now_s() {
    struct timeval tv;
    gettimeofday(&tv, nullptr);
    return tv.tv_sec + tv.tv_usec * 1e-6;
}

static void quiet(ggml_log_level level, const char * text, void *) {
    if (level >= GGML_LOG_LEVEL_WARN) fputs(text, stderr);
}

int main(int argc, char ** argv) {
    if (argc < 4) {
        fprintf(stderr, "usage: %s MODEL.gguf THREADS TOKENS [PROMPT]\n", argv[0]);
        return 2;
    }
    const int threads = atoi(argv[2]);
    std::vector<llama_token> tokens;
    for (char * p = strtok(argv[3], ","); p; p = strtok(nullptr, ",")) tokens.push_back(atoi(p));
    const size_t prompt = argc > 4 ? (size_t) atoi(argv[4]) : 1;
    if (prompt < 1 || prompt > tokens.size() || prompt > 512) {
        fprintf(stderr, "PROMPT must be 1..min(512, number of tokens), got %s\n", argc > 4 ? argv[4] : "1");
        return 2;
    }
    llama_log_set(quiet, nullptr);
    llama_backend_init();
    const double t_start = now_s();
    llama_model_params mp = llama_model_default_params();  // use_mmap = true: llama.cpp's default
    llama_model * model = llama_model_load_from_file(argv[1], mp);
    if (!model) { fprintf(stderr, "load failed\n"); return 1; }
    llama_context_params cp = llama_context_default_params();
    cp.n_ctx = 512;
    cp.n_batch = 512;
    cp.n_threads = threads;
    cp.n_threads_batch = threads;
    llama_context * ctx = llama_init_from_model(model, cp);
    if (!ctx) { fprintf(stderr, "context failed\n"); return 1; }
    const int n_vocab = llama_vocab_n_tokens(llama_model_get_vocab(model));
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    printf("{\"event\": \"loaded\", \"load_s\": %.3f, \"majflt\": %ld, \"minflt\": %ld, \"t\": %.6f}\n",
           now_s() - t_start, ru.ru_majflt, ru.ru_minflt, now_s());
    fflush(stdout);
    for (size_t i = 0, pos = 0; pos < tokens.size(); i++) {
        const int n = i == 0 ? (int) prompt : 1;
        const double t0 = now_s();
        if (llama_decode(ctx, llama_batch_get_one(&tokens[pos], n)) != 0) { fprintf(stderr, "decode failed\n"); return 1; }
        pos += n;
        const float * logits = llama_get_logits_ith(ctx, -1);
        int best = 0;
        for (int v = 1; v < n_vocab; v++) if (logits[v] > logits[best]) best = v;
        const double t1 = now_s();
        getrusage(RUSAGE_SELF, &ru);
        printf("{\"i\": %zu, \"dt\": %.6f, \"majflt\": %ld, \"minflt\": %ld, \"argmax\": %d, \"t\": %.6f}\n",
               i, t1 - t0, ru.ru_majflt, ru.ru_minflt, best, t1);
        fflush(stdout);
    }
    llama_free(ctx);
    llama_model_free(model);
    return 0;
}
