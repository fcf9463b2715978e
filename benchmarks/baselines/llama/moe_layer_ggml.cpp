// [NOTE] llama.cpp's CPU backend as a benchmark peer: one MoE layer as one ggml graph.
//
// The graph is what llama.cpp's build_moe_ffn builds for a SiLU-gated MoE:
//   up   = mul_mat_id(up_exps   [H, I, E], x [H, 1, T], ids [k, T])   -> [I, k, T]
//   gate = mul_mat_id(gate_exps [H, I, E], x,            ids)         -> [I, k, T]
//   act  = swiglu_split(gate, up)                                     -> [I, k, T]
//   down = mul_mat_id(down_exps [I, H, E], act,          ids)         -> [H, k, T]
//   out  = sum_j down[:, j, :] * weights[j, :]                        -> [H, T]
// L such layers (distinct weights) are chained in one graph, and every repetition draws new
// routings, so the experts a pass reads are cold (not in the caches), as in serving.
// q4_0 / q4_K / MXFP4 weights go to the CPU_REPACK buffer type, as llama.cpp does at load time.
//
// Protocol (one process per weight type, kept alive so that a benchmark can alternate it with
// another implementation without paying the weight set-up again):
//   start:  moe_layer_ggml TYPE E K H I L [SEED]     prints "ready {json}" once weights are in
//   stdin:  "run T THREADS REPS"                     prints "ms t1 t2 ..." (per layer, per rep)
//           "quit"
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <map>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "ggml-alloc.h"
#include "ggml-backend.h"
#include "ggml-cpu.h"
#include "ggml.h"

namespace {

struct Shape {
    int64_t E, k, H, I, L;
};

struct Layer {
    ggml_tensor *gate, *up, *down;
};

ggml_type parse_type(const std::string& s) {
    if (s == "bf16") return GGML_TYPE_BF16;
    if (s == "q8_0") return GGML_TYPE_Q8_0;
    if (s == "q4_0") return GGML_TYPE_Q4_0;
    if (s == "q4_K") return GGML_TYPE_Q4_K;
    if (s == "mxfp4") return GGML_TYPE_MXFP4;
    std::fprintf(stderr, "unknown type %s (bf16|q8_0|q4_0|q4_K|mxfp4)\n", s.c_str());
    std::exit(2);
}

// The CPU_REPACK buffer type when ggml offers one for this type on this CPU, else plain CPU memory.
ggml_backend_buffer_type_t weight_buffer_type(ggml_backend_t backend, ggml_type type) {
    if (type == GGML_TYPE_Q4_0 || type == GGML_TYPE_Q4_K || type == GGML_TYPE_MXFP4) {
        ggml_backend_dev_t dev = ggml_backend_get_device(backend);
        auto get_extra = (ggml_backend_dev_get_extra_bufts_t)ggml_backend_reg_get_proc_address(
            ggml_backend_dev_backend_reg(dev), "ggml_backend_dev_get_extra_bufts");
        for (ggml_backend_buffer_type_t* b = get_extra ? get_extra(dev) : nullptr; b && *b; ++b)
            if (std::strcmp(ggml_backend_buft_name(*b), "CPU_REPACK") == 0) return *b;
    }
    return ggml_backend_cpu_buffer_type();
}

// Fills one [E, rows, cols] weight tensor with uniform values of variance 1/cols (a cheap
// xorshift: the timing does not depend on the values), quantized to its type.
void fill_weight(ggml_tensor* t, std::mt19937& rng) {
    const int64_t cols = t->ne[0], rows = t->ne[1], experts = t->ne[2];
    const float scale = std::sqrt(3.f / float(cols)) / float(1u << 31);
    uint32_t state = rng() | 1u;
    std::vector<float> dense(rows * cols);
    std::vector<uint8_t> packed(ggml_nbytes(t));
    for (int64_t e = 0; e < experts; ++e) {
        for (float& v : dense) {
            state ^= state << 13, state ^= state >> 17, state ^= state << 5;
            v = float(int32_t(state)) * scale;
        }
        ggml_quantize_chunk(t->type, dense.data(), packed.data() + e * t->nb[2], 0, rows, cols, nullptr);
    }
    ggml_backend_tensor_set(t, packed.data(), 0, packed.size());  // repack buffers take whole tensors
}

struct Graph {
    ggml_context* ctx = nullptr;
    ggml_cgraph* graph = nullptr;
    ggml_gallocr_t alloc = nullptr;
    ggml_tensor* x = nullptr;
    std::vector<ggml_tensor*> ids, weights;
};

// x [H, T] -> one layer's weighted sum of its k experts [H, T].
ggml_tensor* moe_layer(ggml_context* ctx, const Layer& w, ggml_tensor* x, ggml_tensor* ids, ggml_tensor* weights,
                       const Shape& s, int64_t T) {
    ggml_tensor* x3 = ggml_reshape_3d(ctx, x, s.H, 1, T);
    ggml_tensor* up = ggml_mul_mat_id(ctx, w.up, x3, ids);
    ggml_tensor* gate = ggml_mul_mat_id(ctx, w.gate, x3, ids);
    ggml_tensor* act = ggml_swiglu_split(ctx, gate, up);
    ggml_tensor* down = ggml_mul(ctx, ggml_mul_mat_id(ctx, w.down, act, ids), weights);
    ggml_tensor* out = nullptr;
    for (int64_t j = 0; j < s.k; ++j) {
        ggml_tensor* v = ggml_view_2d(ctx, down, s.H, T, down->nb[2], j * down->nb[1]);
        out = out ? ggml_add(ctx, out, v) : v;
    }
    return s.k == 1 ? ggml_cont(ctx, out) : out;
}

Graph build_graph(const std::vector<Layer>& layers, const Shape& s, int64_t T) {
    Graph g;
    const size_t nodes = 64 + layers.size() * (8 + 2 * s.k);
    ggml_init_params params = {ggml_tensor_overhead() * nodes + ggml_graph_overhead_custom(nodes, false), nullptr,
                               true};
    g.ctx = ggml_init(params);
    g.graph = ggml_new_graph_custom(g.ctx, nodes, false);
    g.x = ggml_new_tensor_2d(g.ctx, GGML_TYPE_F32, s.H, T);
    ggml_set_input(g.x);
    ggml_tensor* cur = g.x;
    for (const Layer& w : layers) {
        g.ids.push_back(ggml_new_tensor_2d(g.ctx, GGML_TYPE_I32, s.k, T));
        g.weights.push_back(ggml_new_tensor_3d(g.ctx, GGML_TYPE_F32, 1, s.k, T));
        ggml_set_input(g.ids.back());
        ggml_set_input(g.weights.back());
        cur = moe_layer(g.ctx, w, cur, g.ids.back(), g.weights.back(), s, T);
    }
    ggml_set_output(cur);
    ggml_build_forward_expand(g.graph, cur);
    g.alloc = ggml_gallocr_new(ggml_backend_cpu_buffer_type());
    if (!ggml_gallocr_alloc_graph(g.alloc, g.graph)) {
        std::fprintf(stderr, "graph allocation failed\n");
        std::exit(1);
    }
    return g;
}

// New activations and a new routing (k distinct experts per token, weights summing to 1).
void set_inputs(Graph& g, const Shape& s, int64_t T, std::mt19937& rng) {
    std::normal_distribution<float> normal(0.f, 1.f);
    std::uniform_real_distribution<float> uniform(0.1f, 1.1f);
    std::vector<float> x(s.H * T);
    for (float& v : x) v = normal(rng);
    ggml_backend_tensor_set(g.x, x.data(), 0, x.size() * sizeof(float));
    std::vector<int32_t> order(s.E), ids(s.k * T);
    std::vector<float> w(s.k * T);
    for (size_t l = 0; l < g.ids.size(); ++l) {
        for (int64_t t = 0; t < T; ++t) {
            for (int64_t e = 0; e < s.E; ++e) order[e] = int32_t(e);
            float sum = 0.f;
            for (int64_t j = 0; j < s.k; ++j) {
                std::swap(order[j], order[j + rng() % (s.E - j)]);
                ids[t * s.k + j] = order[j];
                sum += (w[t * s.k + j] = uniform(rng));
            }
            for (int64_t j = 0; j < s.k; ++j) w[t * s.k + j] /= sum;
        }
        ggml_backend_tensor_set(g.ids[l], ids.data(), 0, ids.size() * sizeof(int32_t));
        ggml_backend_tensor_set(g.weights[l], w.data(), 0, w.size() * sizeof(float));
    }
}

}  // namespace

int main(int argc, char** argv) {
    if (argc < 7) {
        std::fprintf(stderr, "usage: %s TYPE E K H I L [SEED]\n", argv[0]);
        return 2;
    }
    const ggml_type type = parse_type(argv[1]);
    const Shape s{std::atoll(argv[2]), std::atoll(argv[3]), std::atoll(argv[4]), std::atoll(argv[5]),
                  std::atoll(argv[6])};
    std::mt19937 rng(argc > 7 ? std::atoi(argv[7]) : 0);

    ggml_backend_t backend = ggml_backend_cpu_init();
    ggml_backend_buffer_type_t buft = weight_buffer_type(backend, type);
    ggml_init_params wparams = {ggml_tensor_overhead() * (3 * s.L + 1), nullptr, true};
    ggml_context* wctx = ggml_init(wparams);
    std::vector<Layer> layers(s.L);
    for (Layer& w : layers) {
        w.gate = ggml_new_tensor_3d(wctx, type, s.H, s.I, s.E);
        w.up = ggml_new_tensor_3d(wctx, type, s.H, s.I, s.E);
        w.down = ggml_new_tensor_3d(wctx, type, s.I, s.H, s.E);
    }
    ggml_backend_buffer_t wbuf = ggml_backend_alloc_ctx_tensors_from_buft(wctx, buft);
    if (!wbuf) {
        std::fprintf(stderr, "weight allocation failed\n");
        return 1;
    }
    for (Layer& w : layers)
        for (ggml_tensor* t : {w.gate, w.up, w.down}) fill_weight(t, rng);
    const size_t expert_bytes = 2 * layers[0].gate->nb[2] + layers[0].down->nb[2];
    std::printf("ready {\"type\": \"%s\", \"buffer\": \"%s\", \"expert_bytes\": %zu, \"layers\": %lld}\n",
                ggml_type_name(type), ggml_backend_buft_name(buft), expert_bytes, (long long)s.L);
    std::fflush(stdout);

    std::map<int64_t, Graph> graphs;
    std::string line;
    while (std::getline(std::cin, line)) {
        std::istringstream in(line);
        std::string cmd;
        in >> cmd;
        if (cmd == "quit") break;
        int64_t T = 0, threads = 1, reps = 1;
        if (cmd != "run" || !(in >> T >> threads >> reps) || T < 1 || threads < 1 || reps < 1) {
            std::printf("error bad command: %s\n", line.c_str());
            std::fflush(stdout);
            continue;
        }
        if (!graphs.count(T)) graphs[T] = build_graph(layers, s, T);
        Graph& g = graphs[T];
        ggml_backend_cpu_set_n_threads(backend, int(threads));
        std::printf("ms");
        for (int64_t r = 0; r < reps; ++r) {
            set_inputs(g, s, T, rng);
            auto t0 = std::chrono::steady_clock::now();
            ggml_backend_graph_compute(backend, g.graph);
            auto t1 = std::chrono::steady_clock::now();
            std::printf(" %.4f", std::chrono::duration<double, std::milli>(t1 - t0).count() / double(s.L));
        }
        std::printf("\n");
        std::fflush(stdout);
    }
    for (auto& [T, g] : graphs) {
        ggml_gallocr_free(g.alloc);
        ggml_free(g.ctx);
    }
    ggml_backend_buffer_free(wbuf);
    ggml_free(wctx);
    ggml_backend_free(backend);
    return 0;
}
