from dataclasses import replace
import json
import time

import matplotlib
import pytest
import torch

from course_utils import bench


def sleepy(seconds: float) -> None:
    time.sleep(seconds)


def test_time_fn_measures_a_known_duration():
    t = bench.time_fn(sleepy, 0.004, warmup=1, min_run_time=0.1)
    assert t.samples >= 3
    assert 0.0035 < t.median_s < 0.05  # sleep never returns early; a busy machine only adds
    assert t.iqr_s >= 0 and t.median_ms == pytest.approx(t.median_s * 1e3)


def test_time_fn_always_has_one_sample_per_round():
    """Even when one block exceeds min_run_time (a slow call, a busy machine), each round counts."""
    t = bench.time_fn(sleepy, 0.02, warmup=0, min_run_time=0.01, rounds=4)
    assert t.samples >= 4
    with pytest.raises(ValueError, match="rounds"):
        bench.time_fn(sleepy, 0.0, rounds=0)


def test_time_fn_passes_kwargs_and_warms_up():
    calls = []

    def f(x, scale=1):
        calls.append((x, scale))

    bench.time_fn(f, 1, scale=3, warmup=2, min_run_time=0.01)
    assert calls[0] == (1, 3) and len(calls) > 2


def test_time_fn_rejects_non_callables():
    with pytest.raises(TypeError, match="callable"):
        bench.time_fn(42)


def test_first_call_times_one_call():
    assert 0.01 <= bench.first_call(sleepy, 0.01) < 1.0


def test_compare_orders_variants_and_computes_ratios():
    table = bench.compare({"slow": lambda: time.sleep(0.003), "fast": lambda: None},
                          rounds=2, warmup=1, min_run_time=0.1)
    assert table.baseline == "slow"
    assert [r.label for r in table.rows] == ["slow", "fast"]
    assert table.speedup("slow") == pytest.approx(1.0)
    assert table.speedup("fast") > 10  # a no-op against a 3 ms sleep
    assert table.ratio("slow", "fast") == pytest.approx(table.speedup("fast"))
    assert "| fast |" in table.to_markdown()
    assert "slow" in str(table)
    with pytest.raises(KeyError, match="variants"):
        table.row("medium")


def test_compare_bad_input():
    with pytest.raises(ValueError):
        bench.compare({})
    with pytest.raises(TypeError, match="'x' is not callable"):
        bench.compare({"x": 3})
    with pytest.raises(KeyError, match="baseline"):
        bench.compare({"a": lambda: None}, baseline="b")


def test_timer_uses_torch_thread_count(monkeypatch):
    seen = {}
    real = bench.benchmark.Timer

    def spy(*args, **kwargs):
        seen["num_threads"] = kwargs["num_threads"]
        return real(*args, **kwargs)

    monkeypatch.setattr(bench.benchmark, "Timer", spy)
    bench.time_fn(lambda: None, min_run_time=0.01)
    assert seen["num_threads"] == torch.get_num_threads()


def test_record_appends_json_lines(results_file):
    bench.record("setup.first_call_s", 1.5, "s", size=512)
    bench.record("setup.steady_speedup", 2, "x")
    lines = [json.loads(x) for x in results_file.read_text().splitlines()]
    assert [r["name"] for r in lines] == ["setup.first_call_s", "setup.steady_speedup"]
    assert lines[0]["value"] == 1.5 and lines[0]["unit"] == "s"
    assert lines[0]["context"] == {"size": 512}
    assert lines[0]["mode"] in ("quick", "full") and lines[0]["torch"] == torch.__version__
    assert bench.read_results(results_file) == lines


def test_record_without_results_file_writes_nothing(monkeypatch, tmp_path):
    monkeypatch.delenv("COURSE_RESULTS", raising=False)
    monkeypatch.chdir(tmp_path)
    entry = bench.record("a.b", 1.0, "x")
    assert entry["name"] == "a.b"
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("name,value", [("Bad Name", 1.0), ("", 1.0), ("a.b", float("nan")),
                                        ("a.b", "fast"), ("a.b", True), ("a..b", 1.0)])
def test_record_rejects_bad_input(results_file, name, value):
    with pytest.raises(ValueError):
        bench.record(name, value, "x")
    assert not results_file.exists()


def test_read_results_reports_a_corrupt_line(tmp_path):
    path = tmp_path / "r.jsonl"
    path.write_text('{"name": "a"}\nnot json\n')
    with pytest.raises(ValueError, match="line 2"):
        bench.read_results(path)


def test_bar_chart_draws_one_bar_per_variant():
    matplotlib.use("Agg")
    table = bench.Comparison("eager", [bench.Row("eager", 0.002, 0.0001, 1.0),
                                       bench.Row("compiled", 0.001, 0.0001, 2.0)])
    fig = bench.bar_chart(table, title="t")
    ax = fig.axes[0]
    assert len(ax.patches) == 2 and ax.get_title() == "t"
    assert any("2.00x" in t.get_text() for t in ax.texts)


def _two(a_med: float, a_iqr: float, b_med: float, b_iqr: float) -> "bench.Comparison":
    return bench.Comparison("b", [bench.Row("b", b_med, b_iqr, 1.0), bench.Row("a", a_med, a_iqr, b_med / a_med)])


def test_bands_text_names_the_bands_the_verdict_compares():
    assert _two(1.0, 0.8, 1.3, 0.8).bands_text("a") == (
        "median ± IQR/2: a 600.000-1400.000 ms, b 900.000-1700.000 ms; the bands overlap")
    assert _two(1.0, 0.1, 2.0, 0.1).bands_text("a", "b").endswith("; the bands are apart")
    assert _two(1.0, 0.1, 2.0, 0.1).bands_text("b", "a").startswith("median ± IQR/2: b 1950.000-2050.000 ms")


def test_row_band_and_overlap_across_comparisons():
    a, b = _two(1.0, 0.8, 1.3, 0.8).row("a"), _two(2.0, 0.1, 1.0, 0.1).row("a")
    assert a.band == (0.6, 1.4) and b.band == (1.95, 2.05)
    assert not bench.bands_overlap(a, b) and bench.bands_overlap(a, a)


def test_verdict_needs_a_gap_beyond_the_spread():
    assert _two(1.0, 0.1, 2.0, 0.1).verdict("a") == "faster"
    assert _two(2.0, 0.1, 1.0, 0.1).verdict("a") == "slower"
    assert _two(1.0, 0.8, 1.3, 0.8).verdict("a") == "no clear difference"  # bands overlap
    assert _two(1.0, 0.0, 1.02, 0.0).verdict("a") == "no clear difference"  # under the 5% margin
    assert _two(2.0, 0.1, 1.0, 0.1).verdict("b", "a") == "faster"


def test_describe_words_follow_the_verdict():
    assert _two(1.0, 0.1, 2.0, 0.1).describe("a") == "2.00x faster than b"
    assert _two(4.0, 0.1, 1.0, 0.1).describe("a").startswith("4.00x slower than b")
    assert _two(1.0, 0.8, 1.3, 0.8).describe("a") == "not clearly different from b (1.30x, inside the timing spread)"
    assert _two(1.0, 0.001, 1.03, 0.001).describe("a") == "not clearly different from b (1.03x, within 5%)"
    # 4.9% less time reads as 1.05x faster: the phrase gives the gap in time, which the margin is on
    assert _two(0.951, 0.001, 1.0, 0.001).describe("a") == (
        "not clearly different from b (1.05x: 4.9% less time than b, within the 5% margin)")
    assert _two(1.049, 0.001, 1.0, 0.001).describe("a") == (
        "not clearly different from b (0.95x: 4.9% more time than b, within the 5% margin)")


def test_describe_can_name_the_other_row_as_a_sentence_would():
    assert _two(1.0, 0.01, 2.0, 0.01).describe("a", against_as="the old one") == "2.00x faster than the old one"
    assert _two(2.0, 0.01, 1.0, 0.01).describe("a", against_as="the old one").startswith("2.00x slower than the old one")
    assert _two(1.049, 0.001, 1.0, 0.001).describe("a", against_as="B") == (
        "not clearly different from B (0.95x: 4.9% more time than B, within the 5% margin)")


def test_a_noisy_table_says_so_in_one_line():
    quiet = _two(1.0, 0.1, 2.0, 0.2)  # IQRs at 10% of the medians
    assert quiet.spread_note() == "" and "spread is large" not in str(quiet)
    noisy = _two(1.0, 0.1, 2.0, 0.9)  # b's IQR is 45% of its median
    note = noisy.spread_note()
    assert "45%" in note and "'b'" in note and "rough" in note
    assert str(noisy).splitlines()[-1] == note
    assert bench.Comparison("b", []).spread_note() == ""
    # just over the 20% limit: "20%" would read as at the limit, so a decimal more
    assert "IQR 20.3% of the median" in _two(1.0, 0.1, 2.0, 0.406).spread_note()


def test_load_note_names_other_programs_only_when_a_sample_found_them_busy():
    table = _two(1.0, 0.1, 2.0, 0.2)
    assert table.load_note() == ""  # not sampled
    assert replace(table, other_load=bench.BUSY_LOAD - 0.01).load_note() == ""
    assert replace(table, other_load=1.26).load_note() == "other programs used about 1.3 cores just after the timings"


def test_a_noisy_tables_note_blames_other_programs_only_when_they_were_busy():
    noisy = _two(1.0, 0.1, 2.0, 0.9)
    assert "rerun the cell" in noisy.spread_note() and "other programs were" not in noisy.spread_note()
    assert "other programs were using about 1.3 cores" in replace(noisy, other_load=1.3).spread_note()
    note = replace(noisy, other_load=0.1).spread_note()
    assert "nearly idle" in note and "about 0.1 cores" in note and "the calls themselves varied" in note
    assert noisy.spread_note(cause="my reason").split("; even so")[0].endswith("): my reason")


def test_a_noisy_note_says_when_the_spread_cannot_change_the_order():
    apart = _two(1.0, 0.1, 2.0, 0.9)  # b's IQR is 45% of its median, yet its band (1.55-2.45) is far from a's
    assert apart.spread_note().endswith("; even so, 'b' stays clearly apart from 'a' (beyond the 5% margin, with the "
                                        "median ± IQR/2 bands apart), so the spread does not change the order, "
                                        "only the exact figures")
    assert apart.spread_note(cause="my reason.").startswith("note: the spread is large (IQR 45% of the median for 'b')"
                                                           ": my reason; even so")
    touching = _two(1.5, 0.1, 2.0, 0.9)  # a's band 1.45-1.55 meets b's 1.55-2.45: no clear order
    assert "rough" in touching.spread_note() and "even so" not in touching.spread_note()
    three = bench.Comparison.from_samples({"a": [1.0] * 5, "b": [1.0, 1.5, 2.0, 2.5, 3.0], "c": [4.0] * 5})
    assert three.verdict("b", "a") == "slower" and three.verdict("b", "c") == "faster"
    assert "even so, 'b' stays clearly apart from every other row" in three.spread_note()


def test_one_note_for_several_tables_names_the_noisy_ones_and_the_worst_load():
    quiet, noisy = _two(1.0, 0.1, 2.0, 0.2), _two(1.0, 0.1, 2.0, 0.9)
    assert bench.noisy_note({"4": quiet, "8": quiet}) == ""
    note = bench.noisy_note({"4": quiet, "8": replace(noisy, other_load=0.7), "16": replace(noisy, other_load=1.1)},
                            where="at batch")
    assert note.startswith("note: the timing spread (IQR) was over 20% of the median at batch 8, 16: ")
    assert "about 1.1 cores" in note and "nearly idle" not in note  # one cause: the busiest load names it
    idle = bench.noisy_note({"8": replace(noisy, other_load=0.2)})
    assert "nearly idle" in idle and "busy while" not in idle
    assert "varied from call to call" in bench.noisy_note({"8": noisy})
    mixed = bench.noisy_note({"8": replace(noisy, other_load=0.1), "16": replace(noisy, other_load=1.4)}, where="at batch")
    assert "at batch 16, other programs were using about 1.4 cores" in mixed
    assert "at batch 8, other programs were nearly idle" in mixed


def test_compare_samples_other_programs_only_for_a_noisy_table():
    table = bench.compare({"a": lambda: None, "b": lambda: None}, min_run_time=0.01)
    assert (table.other_load is None) == (table.spread_note() == "")


def test_from_samples_gives_timings_measured_elsewhere_the_same_verdict():
    table = bench.Comparison.from_samples({"eager": [1.0, 1.1, 0.9, 1.0], "compiled": [0.5, 0.55, 0.45, 0.5]})
    assert table.baseline == "eager" and table.speedup("compiled") == 2.0
    assert table.verdict("compiled") == "faster"
    tie = bench.Comparison.from_samples({"a": [1.0, 1.5, 0.6], "b": [1.1, 0.7, 1.4]}, baseline="b")
    assert tie.verdict("a") == "no clear difference"
    with pytest.raises(ValueError, match="at least one timing"):
        bench.Comparison.from_samples({"a": [1.0], "b": []})
    with pytest.raises(KeyError, match="baseline 'c'"):
        bench.Comparison.from_samples({"a": [1.0]}, baseline="c")


def test_band_text_gives_the_interval_band_verdict_uses():
    assert bench.band_text(0.15) == "a ratio between 0.87x and 1.15x is called no clear difference"
    assert bench.band_text(0.15, inside=True) == "the ratio was between 0.87x and 1.15x"
    lo, hi = 1 / 1.15, 1.15
    assert bench.band_verdict(lo * 1.001, 1.0, band=0.15) == "no clear difference"
    assert bench.band_verdict(lo * 0.999, 1.0, band=0.15) == "lower"
    assert bench.band_verdict(hi * 1.001, 1.0, band=0.15) == "higher"
    with pytest.raises(ValueError, match="band"):
        bench.band_text(-0.1)


def test_ratio_text_never_prints_a_band_edge_beside_a_verdict_that_crossed_it():
    # 0.8667 is "lower" with a 15% band (below 1/1.15 = 0.8696) but rounds to the edge's "0.87"
    assert bench.band_verdict(0.8667, 1.0, band=0.15) == "lower"
    assert bench.ratio_text(0.8667, 0.15) == "0.867x"
    assert bench.ratio_text(1.1520, 0.15) == "1.152x"
    assert bench.ratio_text(1.23, 0.15) == "1.23x" and bench.ratio_text(0.5, 0.15) == "0.50x"
    assert bench.ratio_text(0.905, 0.1) == "0.905x"  # the 10% band's lower edge prints as 0.91x
    for bad in (0.0, -1.0, float("nan")):
        with pytest.raises(ValueError):
            bench.ratio_text(bad, 0.15)


def test_band_verdict_needs_a_gap_beyond_the_band():
    assert bench.band_verdict(1.2, 1.0) == "higher"
    assert bench.band_verdict(1.0, 1.2) == "lower"
    assert bench.band_verdict(1.05, 1.0) == "no clear difference"
    assert bench.band_verdict(1.0, 1.05) == "no clear difference"
    assert bench.band_verdict(1.14, 1.0, band=0.15) == "no clear difference"
    assert bench.band_verdict(1.0, 1.16, band=0.15) == "lower"
    with pytest.raises(ValueError, match="two positive figures"):
        bench.band_verdict(0.0, 1.0)


def test_a_record_says_where_it_was_computed_and_a_cuda_one_names_the_gpu_class(results_file, monkeypatch):
    from course_utils import device

    # What the machine has does not matter: a lesson measured on the CPU says cpu on a GPU machine.
    monkeypatch.setattr(device, "get_device", lambda: torch.device("cuda"))
    monkeypatch.setattr(device, "cuda_description", lambda: "NVIDIA H200 (sm_90)")
    cpu_rec = bench.record("setup.first_call_s", 1.0, "s")
    gpu_rec = bench.record("setup.first_call_s", 1.0, "s", device=torch.device("cuda", 0))
    assert "gpu_class" not in cpu_rec and cpu_rec["device"] == "cpu"
    assert gpu_rec["device"] == "cuda" and gpu_rec["gpu_class"] == "NVIDIA H200 (sm_90)"
    assert bench.record_verdict("a.b", "faster", device="cuda")  # recorded with the GPU's class
    assert [r.get("gpu_class") for r in bench.read_results(results_file)] == [None, "NVIDIA H200 (sm_90)",
                                                                            "NVIDIA H200 (sm_90)"]
    with pytest.raises(ValueError, match="not a device torch understands"):
        bench.record("setup.first_call_s", 1.0, "s", device="gpu0")


def test_a_comparison_records_its_verdict_on_the_device_its_variants_ran_on(results_file, monkeypatch):
    from course_utils import device

    monkeypatch.setattr(device, "cuda_description", lambda: "NVIDIA H200 (sm_90)")
    x = torch.ones(8)
    on_cpu = bench.compare({"a": torch.neg, "b": torch.abs}, x, rounds=1, warmup=0, min_run_time=0.001)
    assert on_cpu.device == "cpu"
    on_cpu.verdict("a", name="t.cpu")
    told = bench.compare({"a": lambda: None}, rounds=1, warmup=0, min_run_time=0.001, device="cuda")
    assert told.device == "cuda"  # no tensor arguments to infer from: the cell says where
    told.verdict("a", name="t.told")
    sampled = bench.Comparison.from_samples({"a": [1.0, 1.1], "b": [2.0, 2.1]}, device=torch.device("cuda", 1))
    bench.band_verdict(2.0, 1.0, name="t.band", device=sampled.device)
    got = {r["name"]: r["device"] for r in bench.read_results(results_file)}
    assert got == {"t.cpu": "cpu", "t.told": "cuda", "t.band": "cuda"} and sampled.device == "cuda"


def test_a_caller_that_knows_why_the_spread_is_large_says_so():
    noisy = _two(1.0, 0.1, 2.0, 0.9)
    cause = "the ranks wait on each other every step"
    table = noisy.format(cause=cause)
    assert table.splitlines()[-1] == noisy.spread_note(cause=cause)
    assert f": {cause}; even so" in table and "something else was using the CPU" not in table
    assert str(noisy) == noisy.format()
    assert _two(1.0, 0.1, 2.0, 0.2).format(cause=cause) == str(_two(1.0, 0.1, 2.0, 0.2))  # quiet: no note


def test_first_call_and_cache_counts_what_inductors_graph_cache_did():
    from torch._inductor.utils import fresh_cache

    seconds, events = bench.first_call_and_cache(lambda t: t + 1, torch.ones(4))  # nothing compiled
    assert seconds >= 0 and events == dict.fromkeys(bench.CACHE_EVENTS, 0)
    with fresh_cache():  # an empty cache directory: the first compile misses, the same graph again hits
        torch._dynamo.reset()
        _, cold = bench.first_call_and_cache(torch.compile(lambda t: t * 3 + 1), torch.ones(8))
        torch._dynamo.reset()
        _, warm = bench.first_call_and_cache(torch.compile(lambda t: t * 3 + 1), torch.ones(8))
    torch._dynamo.reset()
    assert cold["miss"] >= 1 and cold["hit"] == 0, cold
    assert warm["hit"] >= 1 and warm["miss"] == 0, warm


def test_cache_words_say_what_a_first_call_did():
    assert bench.cache_words({"hit": 0, "miss": 2, "bypass": 0}) == "miss 2"
    assert bench.cache_words({"hit": 1, "bypass": 1}) == "hit 1, bypass 1"
    assert bench.cache_words(dict.fromkeys(bench.CACHE_EVENTS, 0)) == "no cache events"
    assert bench.first_call_words({"miss": 2}) == "compiled: miss 2"
    assert bench.first_call_words({"miss": 1, "bypass": 1}) == "compiled: miss 1, bypass 1"
    assert bench.first_call_words({"hit": 3}) == "traced, code from the cache: hit 3"
    assert bench.first_call_words({"hit": 1, "bypass": 2}) == "compiled, part from the cache: hit 1, bypass 2"
    assert bench.first_call_words({}) == "no cache events"
    assert [bench.graphs_built(e) for e in ({"hit": 2}, {"hit": 1, "miss": 1, "bypass": 2}, {})] == [0, 3, 0]


@pytest.mark.parametrize("events", [{"hits": 1}, {"miss": -1}, {"hit": 1.5}, {"bypass": True}])
def test_cache_words_reject_what_first_call_and_cache_never_returns(events):
    for words in (bench.cache_words, bench.first_call_words, bench.graphs_built):
        with pytest.raises(ValueError, match="graph-cache event"):
            words(events)


def test_page_faults_per_call_counts_fresh_pages_and_not_reused_memory():
    import mmap

    pytest.importorskip("resource", reason="the OS counts page faults for Python only where `resource` exists")

    def touch_fresh_pages() -> None:  # 64 fresh anonymous pages, each written once
        with mmap.mmap(-1, 64 * mmap.PAGESIZE) as m:
            for off in range(0, len(m), mmap.PAGESIZE):
                m[off] = 1

    buf = bytearray(64 * mmap.PAGESIZE)

    def reuse() -> None:  # the same, already touched memory
        for off in range(0, len(buf), mmap.PAGESIZE):
            buf[off] = 1

    assert bench.page_faults_per_call(touch_fresh_pages, calls=5) >= 60
    assert bench.page_faults_per_call(reuse, calls=5) < 30
    with pytest.raises(ValueError, match="calls"):
        bench.page_faults_per_call(reuse, calls=0)


def test_with_load_samples_other_programs_once_and_keeps_a_sample_compare_took(monkeypatch):
    calls = []
    monkeypatch.setattr(bench.threads, "other_load", lambda: calls.append(1) or 1.2)
    table = _two(1.0, 0.01, 2.0, 0.01)
    assert table.other_load is None
    sampled = table.with_load()
    assert sampled.other_load == 1.2 and calls == [1]
    assert sampled.load_note() == "other programs used about 1.2 cores just after the timings"
    assert sampled.with_load() is sampled and calls == [1], "a table that has its sample keeps it"
