// T=1 greedy-computed decode through llama.cpp (libllama), default mmap: the llama.cpp side of
// benchmarks/model/bench_scale.py and bench_e2e --model scaleN. Decodes the first PROMPT token ids as one
// batch (the prompt; default 1), then the rest one at a time (real attention and KV cache), takes the
// argmax of every step's logits, and prints one JSON line per step: wall time of the decode call,
// cumulative major/minor faults (getrusage), the process's cumulative bytes read from disk (/proc/self/io
// read_bytes), the model file's disk's cumulative busy milliseconds (io_ticks of /sys/dev/block/MAJ:MIN/stat),
// and the wall clock at its end (for time to first token from process start, measured by the parent). The
// "loaded" line's load_s is llama_model_load_from_file + llama_init_from_model (the model ready to decode).
//   llama_decode MODEL.gguf THREADS TOKENS(comma separated) [PROMPT] [--no-repack]
// --no-repack: use_extra_bufts = false (llama.cpp's --no-repack): every weight stays in the file's mapping;
// by default llama.cpp copies the weights of the types it repacks (q4_0, q4_K, iq4_nl, ... for AVX2 / AVX-512)
// into anonymous memory at load.
#include "llama.h"

#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
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

// /proc/self/io's read_bytes (bytes this process caused to be read from storage), -1 if unreadable.
static long long read_bytes() {
    FILE * f = fopen("/proc/self/io", "r");
    if (!f) return -1;
    char key[64];
    long long v = -1, out = -1;
    while (fscanf(f, "%63s %lld", key, &v) == 2) if (!strcmp(key, "read_bytes:")) out = v;
    fclose(f);
    return out;
}

// The disk's io_ticks (ms it had I/O in flight) from /sys/dev/block/MAJ:MIN/stat of the file's device, -1 if none.
static long long disk_busy_ms(const std::string & stat_path) {
    FILE * f = fopen(stat_path.c_str(), "r");
    if (!f) return -1;
    long long v[10] = {0};
    int n = 0;
    while (n < 10 && fscanf(f, "%lld", &v[n]) == 1) n++;
    fclose(f);
    return n == 10 ? v[9] : -1;
}

static void quiet(ggml_log_level level, const char * text, void *) {
    if (level >= GGML_LOG_LEVEL_WARN) fputs(text, stderr);
}

int main(int argc, char ** argv) {
    bool no_repack = false;
    if (argc > 4 && !strcmp(argv[argc - 1], "--no-repack")) { no_repack = true; argc--; }
    if (argc < 4) {
        fprintf(stderr, "usage: %s MODEL.gguf THREADS TOKENS [PROMPT] [--no-repack]\n", argv[0]);
        return 2;
    }
    std::string stat_path;
    struct stat st;
    if (stat(argv[1], &st) == 0) {
        stat_path = "/sys/dev/block/" + std::to_string(major(st.st_dev)) + ":" + std::to_string(minor(st.st_dev)) + "/stat";
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
    mp.use_extra_bufts = !no_repack;
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
    const double load_s = now_s() - t_start;
    printf("{\"event\": \"loaded\", \"load_s\": %.3f, \"majflt\": %ld, \"minflt\": %ld, \"t\": %.6f, "
           "\"repack\": %s, \"read_bytes\": %lld, \"disk_ms\": %lld}\n", load_s, ru.ru_majflt, ru.ru_minflt, now_s(),
           no_repack ? "false" : "true", read_bytes(), disk_busy_ms(stat_path));
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
        printf("{\"i\": %zu, \"dt\": %.6f, \"majflt\": %ld, \"minflt\": %ld, \"argmax\": %d, \"t\": %.6f, "
               "\"read_bytes\": %lld, \"disk_ms\": %lld}\n", i, t1 - t0, ru.ru_majflt, ru.ru_minflt, best, t1,
               read_bytes(), disk_busy_ms(stat_path));
        fflush(stdout);
    }
    llama_free(ctx);
    llama_model_free(model);
    return 0;
}
