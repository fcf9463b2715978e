"""The figures and the table of ``bench_e2e --model scaleN`` (benchmarks/model/scale/e2e.py), from what the children
printed: pure functions, no model, no timing.

A run's JSON lines (decode_generate.py for ours, llama_decode.cpp for llama.cpp) hold ``loaded`` and one
line per new token ``i`` with ``dt`` (seconds since the previous token), ``t`` (wall clock at its end)
and cumulative major faults; ours adds ``profile`` (seconds per forward inside the experts op, from
torch.profiler) and, compiled, ``compile`` (graphs compiled). Token 0 is the prompt's (time to first
token, from the process's start). The first window is the next ``first`` tokens; in the compiled run
the first decode step compiles, so its window starts one token later and that step is reported as
``compile_step_s``. The steady window is the last ``steady`` tokens. Ours' token lines also carry the
bytes the background warm (warm="auto") has read: ``warm_read_done_by_s`` is when the first token that saw
its final count ended, from process start.
"""
from __future__ import annotations

import statistics

SYSTEM_NAMES = dict(eager="ours, eager", compiled="ours, compiled", llama="llama.cpp")
TARGETS = dict(steady_vs_llama=1.3, first_vs_steady=0.8, nonexpert_vs_read=1.5)


def summarize_run(system: str, routing: str, rows: list, t_spawn: float, first: int, steady: int) -> dict:
    """One run's figures (see the module); ``error`` when the run did not produce every token needed."""
    res = dict(system=system, routing=routing)
    loaded = next((r for r in rows if r.get("event") == "loaded"), None)
    toks = [r for r in rows if "i" in r]
    start = 2 if system == "compiled" else 1
    if loaded is None or len(toks) < start + first + steady:
        res["error"] = f"{len(toks)} tokens, needs {start + first + steady}" + ("" if loaded else "; never loaded")
        return res
    win, before = toks[start:start + first], toks[start - 1]
    st = toks[-steady:]
    dts = [r["dt"] for r in st]
    res.update(load_s=round(loaded["t"] - t_spawn, 2), ttft_s=round(toks[0]["t"] - t_spawn, 2),
               first_tok_s=round(first / (win[-1]["t"] - before["t"]), 3),
               first_majflt_per_tok=round((win[-1]["majflt"] - before["majflt"]) / first, 1),
               first_window_end_s=round(win[-1]["t"] - t_spawn, 2),
               steady_tok_s_median=round(1 / statistics.median(dts), 3), steady_tok_s_min=round(1 / max(dts), 3),
               steady_ms_median=round(1e3 * statistics.median(dts), 1),
               steady_majflt_per_tok=round((st[-1]["majflt"] - toks[-steady - 1]["majflt"]) / steady, 1),
               tokens=len(toks))
    if system == "compiled":
        res["compile_step_s"] = round(toks[1]["dt"], 2)
    profile = next((r for r in rows if r.get("event") == "profile"), None)
    if profile:
        res["experts_ms"] = round(1e3 * profile["experts_s"], 1)
        res["rest_ms"] = round(res["steady_ms_median"] - res["experts_ms"], 1)
    for event in ("compile", "warm"):
        found = next((r for r in rows if r.get("event") == event), None)
        if found:
            res[event] = {k: v for k, v in found.items() if k != "event"}
    if "load_s" in loaded:
        res["model_load_s"] = round(loaded["load_s"], 2)  # the child's own clock: the load, without its start-up
    if "warmed_bytes" in st[0]:
        res["warm_read_gb_at_steady"] = round(st[0]["warmed_bytes"] / 1e9, 2)
        done = next(r for r in toks if r["warmed_bytes"] >= toks[-1]["warmed_bytes"])
        res["warm_read_done_by_s"] = round(done["t"] - t_spawn, 2)  # the first token that saw the warm's last read
    return res


def _cell(r: dict, key: str, fmt: str = "{:.2f}") -> str:
    return fmt.format(r[key]) if key in r else "—"


def fmt_table(results: list, first: int = 16) -> str:
    """One markdown row per run (`first`: the cold window's length, for the headers)."""
    lines = ["| system | routing | loaded at s | first token at s | compile step s | "
             f"first {first} tok/s | major faults / token, first {first} | steady tok/s median | steady tok/s min | "
             "major faults / token, steady | experts ms / token | rest ms / token | load avg |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in results:
        name = SYSTEM_NAMES.get(r["system"], r["system"])
        load = f"{r['load_avg']:.1f}" if "load_avg" in r else "—"
        if "error" in r:
            lines.append(f"| {name} | {r['routing']} | failed: {r['error'][:80]} | | | | | | | | | | {load} |")
            continue
        lines.append(f"| {name} | {r['routing']} | {_cell(r, 'load_s', '{:.1f}')} | {_cell(r, 'ttft_s', '{:.1f}')} | "
                     f"{_cell(r, 'compile_step_s', '{:.1f}')} | {_cell(r, 'first_tok_s')} | "
                     f"{_cell(r, 'first_majflt_per_tok', '{:.0f}')} | {_cell(r, 'steady_tok_s_median')} | "
                     f"{_cell(r, 'steady_tok_s_min')} | {_cell(r, 'steady_majflt_per_tok', '{:.0f}')} | "
                     f"{_cell(r, 'experts_ms', '{:.1f}')} | {_cell(r, 'rest_ms', '{:.1f}')} | {load} |")
    return "\n".join(lines)


def median_of(results: list, system: str, routing: str, key: str):
    """The median of `key` over the runs of (system, routing) that have it, or None."""
    vals = [r[key] for r in results if r["system"] == system and r["routing"] == routing and key in r]
    return statistics.median(vals) if vals else None


def _ratio(a, b):
    return None if a is None or not b else a / b


def _verdict(value, target, at_least=True) -> str:
    if value is None:
        return "not measured"
    met = value >= target if at_least else value <= target
    return f"{value:.2f}x ({'met' if met else 'not met'}; target {'>=' if at_least else '<='} {target}x)"


def _plain(value) -> str:
    return "not measured" if value is None else f"{value:.2f}x"


def fmt_targets(results: list, routings: list, nonexpert_read_ms: float | None) -> str:
    """The issue's targets per routing, from the medians over rounds (markdown list)."""
    lines = []
    for routing in routings:
        m = lambda system, key: median_of(results, system, routing, key)  # noqa: E731
        lines.append(f"- {routing}:")
        lines.append(f"  - steady, compiled / llama.cpp: "
                     f"{_verdict(_ratio(m('compiled', 'steady_tok_s_median'), m('llama', 'steady_tok_s_median')), TARGETS['steady_vs_llama'])}; "
                     f"(eager / llama.cpp: {_plain(_ratio(m('eager', 'steady_tok_s_median'), m('llama', 'steady_tok_s_median')))})")
        for system in ("compiled", "eager"):
            first = _ratio(m(system, "first_tok_s"), m(system, "steady_tok_s_median"))
            ttft, ttft_llama = m(system, "ttft_s"), m("llama", "ttft_s")
            ttft_text = ("not measured" if ttft is None or ttft_llama is None else
                         f"{ttft:.1f} s vs llama.cpp's {ttft_llama:.1f} s ({'met' if ttft <= ttft_llama else 'not met'})")
            lines.append(f"  - {SYSTEM_NAMES[system]}: first window / steady {_verdict(first, TARGETS['first_vs_steady'])}; "
                         f"time to first token {ttft_text}")
        for system in ("compiled", "eager"):
            rest = m(system, "rest_ms")
            ratio = _ratio(rest, nonexpert_read_ms)
            rest_text = "not measured" if rest is None else f"{rest:.1f} ms"
            lines.append(f"  - {SYSTEM_NAMES[system]}: non-expert part per token {rest_text} / reading the non-expert "
                         f"weights at the read roof: {_verdict(ratio, TARGETS['nonexpert_vs_read'], at_least=False)}")
    return "\n".join(lines)


def fmt_compile_notes(results: list, prime: dict | None) -> str:
    """Graphs compiled per compiled run (1 = no recompiles from token to token) and the priming compile."""
    runs = [r["compile"] for r in results if r["system"] == "compiled" and "compile" in r]
    text = ""
    if runs:
        graphs = [c["graphs"] for c in runs]
        breaks = sum(c["graph_breaks"] for c in runs)
        verdict = "no recompiles" if all(g == 1 for g in graphs) else "RECOMPILED"
        text = (f"compiled runs: graphs compiled per run (both generate calls) {graphs}: {verdict}; "
                f"graph breaks {breaks}; backend {runs[0]['backend']}.")
    if prime:
        step = "failed" if prime.get("compile_step_s") is None else f"{prime['compile_step_s']:.1f} s"
        text += (f" Priming run (compiles the graph the timed runs then load from the inductor's on-disk cache): "
                 f"compiling step {step}, {prime.get('graphs')} graph(s).")
    return text.strip()


def fmt_report(report: dict) -> str:
    """The whole printout of bench_e2e --model scaleN from its JSON report (e2e.py)."""
    a = report["args"]
    ne = report["nonexpert_read_bytes"]
    lines = [f"bench_e2e --model scale{a['layers']}: {a['layers']} layers, {a['threads']} threads, prompt "
             f"{a['prompt_tokens']} token(s); first window {a['first']} tokens, {a['warmup']} warm-up, steady window "
             f"{a['steady']}; page cache dropped before each run", "",
             fmt_table(report["results"], a["first"]), ""]
    notes = fmt_compile_notes(report["results"], report.get("prime"))
    if notes:
        lines += [notes, ""]
    lines += [f"experts ms / token: time inside the ktmoe::moe_forward op, summed by torch.profiler over "
              f"{a['profile_tokens']} forwards after the timed ones; rest: the steady median token minus that.",
              f"non-expert weights read per token: {ne['total'] / 1e6:.0f} MB (attention {ne['attention'] / 1e6:.0f}, "
              f"router {ne['router'] / 1e6:.1f}, LM head + an embedding row {ne['lm_head_and_embedding'] / 1e6:.1f}); "
              f"at the read roof measured now ({report['read_roof_gbps']:.1f} GB/s, {a['threads']} threads): "
              f"{report['nonexpert_read_ms']:.1f} ms.", "",
              "targets (medians over rounds):",
              fmt_targets(report["results"], a["routings"], report["nonexpert_read_ms"]), "",
              f"uptime at start: {report['uptime_start']}", f"uptime at end:   {report['uptime_end']}"]
    gen = report.get("generation") or {}
    made = "; ".join(f"{s} {g['total_bytes'] / 1e9:.1f} GB in {g['seconds']:.0f} s" for s in sorted(gen)
                     for g in [gen[s]])
    lines.append(f"model files: {'generated ' + made if made else 'reused'} (setup {report['generation_s']:.0f} s); "
                 f"the runs took {report['runs_s']:.0f} s")
    return "\n".join(lines)
