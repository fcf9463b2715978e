"""bench_e2e --model scaleN's pure parts: option parsing, the figures taken from a run's JSON lines, the table
and the targets, which model files count as whole, the forcing logits processor, the non-expert byte count.
No model is generated and nothing is timed."""
import json

import pytest
import torch

from benchmarks.model.bench_e2e import main as bench_e2e_main
from benchmarks.model.scale import common as C
from benchmarks.model.scale import decode_generate, e2e, models
from benchmarks.model.scale import e2e_report as R


# ---------------------------------------------------------------- options
@pytest.mark.parametrize("model, layers", [("scale16", 16), ("scale", 16), ("scale4", 4)])
def test_layers_of(model, layers):
    assert e2e.layers_of(model) == layers


@pytest.mark.parametrize("model", ["scalex", "scale0", "big16", "scale-1"])
def test_layers_of_refuses(model):
    with pytest.raises(ValueError, match="'tiny' or 'scaleN'"):
        e2e.layers_of(model)


def test_bench_e2e_refuses_an_unknown_model(capsys):
    with pytest.raises(SystemExit):
        bench_e2e_main(["--model", "huge"])
    assert "'tiny' or 'scaleN'" in capsys.readouterr().err


def test_parse_args_defaults():
    args = e2e.parse_args([], 16)
    assert args.systems == ["eager", "compiled", "llama"] and args.routings == ["uniform", "zipf"]
    assert args.new_tokens == 2 + 16 + 64 + 32  # first token, compiling step, cold window, warm-up, steady window
    assert args.out.endswith("bench_e2e_scale16.json")


@pytest.mark.parametrize("argv, message", [
    (["--systems", "eager,vllm"], "subset of eager,compiled,llama"),
    (["--routings", ""], "subset of uniform,zipf"),
    (["--steady", "0"], "--steady must be at least 1"),
    (["--warmup", "-1"], "cannot be negative"),
    (["--warmup", "500"], "exceed llama_decode's context of 512"),
    (["--profile-tokens", "200"], "--profile-tokens must be below 115"),
])
def test_parse_args_refuses(argv, message, capsys):
    with pytest.raises(SystemExit):
        e2e.parse_args(argv, 16)
    assert message in capsys.readouterr().err


@pytest.mark.parametrize("argv, message", [
    (["--prompt", "5"], "--prompt must leave at least one token"),
    (["--cache-len", "3"], "cannot hold the 5 tokens"),
    (["--profile", "5"], "--profile must be 0..4"),
])
def test_decode_generate_refuses(argv, message, capsys):
    with pytest.raises(SystemExit):
        decode_generate.parse_args(["dir", "zipf", "1,2,3,4,5", "--mode", "eager", "--profile", "0", *argv])
    assert message in capsys.readouterr().err


def test_forced_tokens_records_argmax_then_forces():
    forcing = decode_generate.forced_tokens([3, 1])
    scores = torch.tensor([[0.0, 5.0, 1.0, 2.0]])
    out = forcing(None, scores)
    assert forcing.argmax == [1] and int(out.argmax()) == 3 and torch.isinf(out[0, :3]).all()
    assert int(forcing(None, scores).argmax()) == 1 and forcing.argmax == [1, 1]


# ---------------------------------------------------------------- figures from JSON lines
def _rows(n, dt=0.1, first_dt=2.0, compile_dt=None, majflt_per_tok=0, start=100.0, experts_s=None):
    """A run's lines: loaded at start + 1, token 0 `first_dt` later, then `n - 1` tokens `dt` apart
    (token 1 `compile_dt` when given)."""
    rows = [dict(event="loaded", t=start + 1.0, load_s=1.0, majflt=0)]
    t, maj = start + 1.0, 0
    for i in range(n):
        d = first_dt if i == 0 else compile_dt if (i == 1 and compile_dt) else dt
        t += d
        maj += majflt_per_tok
        rows.append(dict(i=i, dt=d, t=t, majflt=maj, warmed_bytes=min(i, 5) * 10**9))
    if experts_s is not None:
        rows.append(dict(event="profile", experts_s=experts_s, forwards=8, op_calls=128, profiled_s=0.2))
    return rows


def test_summarize_eager():
    r = R.summarize_run("eager", "zipf", _rows(50, experts_s=0.04), 100.0, first=16, steady=32)
    assert r["load_s"] == 1.0 and r["ttft_s"] == 3.0
    assert r["first_tok_s"] == pytest.approx(10.0) and r["first_window_end_s"] == pytest.approx(4.6)
    assert r["steady_tok_s_median"] == pytest.approx(10.0) and r["steady_ms_median"] == pytest.approx(100.0)
    assert r["experts_ms"] == 40.0 and r["rest_ms"] == 60.0
    assert "compile_step_s" not in r and r["warm_read_gb_at_steady"] == 5.0
    assert r["model_load_s"] == 1.0 and r["warm_read_done_by_s"] == pytest.approx(3.5)  # token 5: loaded at 1 s, then 2 s + 5 x 0.1


def test_summarize_compiled_skips_its_compiling_step():
    r = R.summarize_run("compiled", "uniform", _rows(50, compile_dt=30.0, majflt_per_tok=2), 100.0, first=16,
                        steady=32)
    assert r["compile_step_s"] == 30.0
    assert r["first_tok_s"] == pytest.approx(10.0)  # tokens 2..17: the compiling step is not in the window
    assert r["first_majflt_per_tok"] == 2 and r["steady_majflt_per_tok"] == 2
    assert "experts_ms" not in r


def test_summarize_steady_min_is_the_slowest_token():
    rows = _rows(40)
    rows[-3]["dt"] = 0.5
    r = R.summarize_run("llama", "zipf", rows, 100.0, first=4, steady=8)
    assert r["steady_tok_s_min"] == pytest.approx(2.0) and r["steady_tok_s_median"] == pytest.approx(10.0)


def test_summarize_short_run_is_an_error():
    r = R.summarize_run("compiled", "zipf", _rows(20), 100.0, first=16, steady=8)
    assert r["error"] == "20 tokens, needs 26"
    assert R.summarize_run("eager", "zipf", [], 100.0, 1, 1)["error"].endswith("never loaded")


# ---------------------------------------------------------------- table and targets
def _results():
    out = []
    for system, dt, first_dt in (("eager", 0.1, 2.0), ("compiled", 0.05, 2.0), ("llama", 0.1, 8.0)):
        for routing in ("uniform", "zipf"):
            rows = _rows(60, dt=dt, first_dt=first_dt, compile_dt=20.0 if system == "compiled" else None,
                         experts_s=None if system == "llama" else 0.03)
            if system == "compiled":
                rows.append(dict(event="compile", backend="inductor", graphs=1, graph_breaks=0))
            r = R.summarize_run(system, routing, rows, 100.0, first=16, steady=32)
            r["load_avg"] = 1.5
            out.append(r)
    return out


def test_table_has_a_row_per_run_and_dashes_for_what_was_not_measured():
    results = _results() + [dict(system="llama", routing="zipf", error="rc -9: killed", load_avg=3.0)]
    table = R.fmt_table(results, first=16).splitlines()
    assert len(table) == 2 + len(results) and "first 16 tok/s" in table[0]
    llama = next(line for line in table if line.startswith("| llama.cpp | uniform"))
    assert llama.count("—") == 3  # compile step, experts, rest
    assert "failed: rc -9: killed" in table[-1]


def test_targets_verdicts():
    text = R.fmt_targets(_results(), ["uniform"], nonexpert_read_ms=10.0)
    assert "steady, compiled / llama.cpp: 2.00x (met; target >= 1.3x)" in text
    assert "(eager / llama.cpp: 1.00x)" in text  # no target of its own against llama.cpp
    assert "time to first token 3.0 s vs llama.cpp's 9.0 s (met)" in text
    assert "ours, compiled: non-expert part per token 20.0 ms" in text and "2.00x (not met; target <= 1.5x)" in text


def test_report_prints_table_targets_and_compile_count():
    report = dict(args=dict(layers=16, threads=2, prompt_tokens=1, first=16, warmup=64, steady=32, profile_tokens=8,
                            routings=["uniform", "zipf"]),
                  results=_results(), prime=dict(compile_step_s=95.0, graphs=1), read_roof_gbps=31.0,
                  nonexpert_read_bytes=C.nonexpert_read_bytes(16), nonexpert_read_ms=20.3,
                  uptime_start="up 1 day, load average: 1.00", uptime_end="up 1 day, load average: 2.00",
                  generation={}, generation_s=3.0, runs_s=400.0)
    text = R.fmt_report(json.loads(json.dumps(report)))  # what the JSON file holds prints the same
    assert "graphs compiled per run (both generate calls) [1, 1]: no recompiles" in text
    assert "compiling step 95.0 s" in text and "629 MB" in text and "31.0 GB/s" in text
    assert "model files: reused" in text and "load average: 2.00" in text


# ---------------------------------------------------------------- model files
def test_packed_dir_is_whole_only_with_its_layer_count(tmp_path):
    path = models.model_path(str(tmp_path), "ours", 2)
    assert path.endswith("qwen3moe30b_L2_int8_packed") and not models.is_complete("ours", path, 2)
    (tmp_path / "qwen3moe30b_L2_int8_packed").mkdir()
    (tmp_path / "qwen3moe30b_L2_int8_packed" / "ktmoe_packed.json").write_text(json.dumps(dict(layers=[{}, {}])))
    assert models.is_complete("ours", path, 2) and not models.is_complete("ours", path, 3)


def test_gguf_is_whole_only_untruncated_with_its_layer_count(tmp_path):
    gguf = pytest.importorskip("gguf")
    path = models.model_path(str(tmp_path), "llama", 2)
    w = gguf.GGUFWriter(path, "qwen3moe")
    w.add_block_count(2)
    w.add_tensor("t", torch.ones(64, 64).numpy())
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    assert models.is_complete("llama", path, 2) and not models.is_complete("llama", path, 16)
    with open(path, "r+b") as f:
        f.truncate(f.seek(0, 2) - 100)
    assert not models.is_complete("llama", path, 2)


def test_nonexpert_bytes_match_the_generated_weights():
    sizes = {name: t.numel() * 2 for name, t in C.nonexpert_tensors(0)}
    glob = {name: t.numel() * 2 for name, t in C.nonexpert_tensors(None)}
    one_embedding_row = C.H * 2
    expected = sum(sizes.values()) + sum(glob.values()) - glob["model.embed_tokens.weight"] + one_embedding_row
    assert C.nonexpert_read_bytes(1)["total"] == expected
