"""bench_scale --gguf's pure parts: limits as a share of the model, the figures taken from llama.cpp's harness lines
(bytes read, disk busy), the table's names and failed rows, the page cache helpers, set_routing's type check.
Nothing is generated, run under a cgroup or timed."""
import json
import os

import pytest
import torch

from benchmarks.model import bench_scale as B
from benchmarks.model.scale import common as C
from benchmarks.model.scale import models


def test_limit_bytes_takes_gib_or_a_share_of_the_model():
    assert B.limit_bytes("none", 3 << 30) is None
    assert B.limit_bytes("12") == 12 * C.GIB
    assert B.limit_bytes("1/3", 9_000) == 3_000


def _llama_lines(read, disk, n=3):
    rows = [dict(event="loaded", load_s=1.5, majflt=0, minflt=0, t=10.0, read_bytes=read[0], disk_ms=disk[0])]
    for i in range(n):
        rows.append(dict(i=i, dt=0.5, majflt=10 * (i + 1), minflt=0, argmax=1, t=10.5 + 0.5 * i,
                         read_bytes=read[i + 1], disk_ms=disk[i + 1]))
    return "\n".join(json.dumps(r) for r in rows)


def test_summarize_reads_llama_cpps_bytes_and_disk_busy():
    out = _llama_lines(read=[0, 100, 300, 500], disk=[0, 400, 900, 1400])
    res = B.summarize("llama-norepack", "uniform", "1/3", 0, out, "", 5.0, {}, 9.0, 1, 2)
    assert res["load_s"] == 1.5 and res["tok_s_median"] == 2.0
    assert res["read_bytes_per_tok"] == 200  # tokens 1 and 2 over token 0's row
    assert res["disk_busy_pct"] == 100.0     # 1000 ms busy over 1.0 s
    assert res["disk_GBps_decode"] == pytest.approx(400 / 1.0 / 1e9)


def test_table_names_gguf_systems_and_marks_oom():
    ok = B.summarize("ours-gguf", "uniform", "1/3", 0, _llama_lines([0, 1, 2, 3], [0, 1, 2, 3]), "", 5.0, {}, 9.0, 1, 2)
    ok.update(limit_gib=3.1, page_cache=dict(mode="cold"))
    dead = dict(system="llama", routing="uniform", limit="1/3", limit_gib=3.1, rc=-9, load_avg=1.0,
                cgroup={"memory.oom_control": "oom_kill_disable 0\nunder_oom 0\noom_kill 1"})
    failed = dict(dead, system="llama-norepack", rc=1,
                  cgroup={"memory.oom_control": "oom_kill_disable 0\nunder_oom 0\noom_kill 0"})
    table = B.fmt_table([ok, dead, failed], gguf=True)
    assert "GGUF experts in place" in table and "1/3 (3.10 GiB)" in table
    assert "llama.cpp, mmap (repack on: its default) | uniform | 1/3 (3.10 GiB) | cold | failed (OOM-killed)" in table
    assert "llama.cpp, mmap, --no-repack | uniform | 1/3 (3.10 GiB) | cold | failed (rc 1)" in table


def test_cached_fraction_and_read_whole(tmp_path):
    p = tmp_path / "f.bin"
    p.write_bytes(os.urandom(1 << 20))
    assert C.read_whole(str(p)) >= 0
    assert 0.0 <= C.cached_fraction(str(p)) <= 1.0
    assert C.disk_busy_ms(C.disk_stat_path(str(p))) >= -1


def test_llama_argv_no_repack_flag(tmp_path, monkeypatch):
    monkeypatch.setattr("benchmarks.model.scale.gen_gguf.set_routing", lambda path, routing: None)
    assert models.llama_argv("h", "m.gguf", "uniform", 2, "5,6")[-1] == "1"
    assert models.llama_argv("h", "m.gguf", "uniform", 2, "5,6", no_repack=True)[-1] == "--no-repack"


def test_set_routing_refuses_a_quantized_embedding(tmp_path):
    gguf = pytest.importorskip("gguf")
    from benchmarks.model.scale.gen_gguf import set_routing

    path = str(tmp_path / "m.gguf")
    w = gguf.GGUFWriter(path, "qwen3moe")
    w.add_tensor("token_embd.weight", torch.ones(4, 32).numpy().astype("float32"))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    with pytest.raises(ValueError, match="token_embd.weight is F32"):
        set_routing(path, "zipf")
