"""te-bench on CUDA / MUSA without a GPU: the device-event timer over a fake device module, the
table of device peaks (name matching, the probe for unknown devices), the fractions of peak in
result rows and the table's peak columns. A fake `torch.musa` stands in for torch_musa; the
device is a stand-in object with a `type`, since torch.device("musa") needs torch_musa loaded."""
import json
import types

import pytest
import torch

from transformer_engine.bench import catalog, cli, device_peaks, device_timing, harness

MUSA = types.SimpleNamespace(type="musa")  # what the bench code reads of a device: its type
ENV = harness.Environment(device="cpu", isa="avx2", version="0.0", torch=torch.__version__, git_commit="abc1234",
                          allocator="default", threads=1)


class FakeDeviceModule:
    """torch.cuda / torch.musa as the timer and peak lookup use them; every call is logged."""

    def __init__(self, name="MTT S4000", elapsed_ms=250.0):
        self.name, self.elapsed_ms, self.log = name, elapsed_ms, []
        module = self

        class Event:
            def __init__(self, enable_timing=False):
                assert enable_timing, "timing events must be created with enable_timing=True"
                self.label = "end" if len(module.events) % 2 else "start"  # timers make them in pairs
                module.events.append(self)

            def record(self):
                module.log.append(f"{self.label}.record")

            def synchronize(self):
                module.log.append(f"{self.label}.synchronize")

            def elapsed_time(self, end):
                module.log.append(f"{self.label}.elapsed_time({end.label})")
                return module.elapsed_ms
        self.events = []
        self.Event = Event

    def synchronize(self):
        self.log.append("synchronize")

    def get_device_name(self, device=None):
        return self.name


@pytest.fixture
def fake_musa(monkeypatch):
    module = FakeDeviceModule()
    monkeypatch.setattr(torch, "musa", module, raising=False)
    return module


def test_device_module_lookup(fake_musa, monkeypatch):
    assert device_timing.device_module(torch.device("cpu")) is None
    assert device_timing.device_module(torch.device("cuda")) is torch.cuda  # no GPU needed to look it up
    assert device_timing.device_module(MUSA) is fake_musa
    monkeypatch.delattr(torch, "musa")
    with pytest.raises(ValueError, match="device .*musa.*torch.musa .*not available"):
        device_timing.device_module(MUSA)


def test_event_timer_uses_elapsed_time_in_seconds(fake_musa):
    timer = device_timing.timer_for(MUSA)
    assert isinstance(timer, device_timing.EventTimer) and timer.module is fake_musa
    assert timer(lambda: fake_musa.log.append("fn")) == 0.25  # 250 ms
    assert fake_musa.log == ["synchronize", "start.record", "fn", "end.record", "end.synchronize",
                             "start.elapsed_time(end)"]


def test_time_rounds_on_a_fake_device(fake_musa):
    fake_musa.elapsed_ms = 2.0
    calls = []
    times = harness.time_rounds({"a": lambda: calls.append("a"), "b": lambda: calls.append("b")}, MUSA, rounds=3,
                                warmup=1)
    assert times == {"a": [0.002] * 3, "b": [0.002] * 3}
    assert calls == ["a", "b", "a", "b", "b", "a", "a", "b"]  # warm-up, then rotated rounds
    assert fake_musa.log.count("start.elapsed_time(end)") == 6


def test_cpu_timer_is_wall_time():
    assert device_timing.timer_for(torch.device("cpu")) is device_timing.cpu_time
    assert 0 <= device_timing.cpu_time(lambda: None) < 1.0


@pytest.mark.parametrize("name, device", [
    ("NVIDIA H100 80GB HBM3", "NVIDIA H100 SXM"),
    ("nvidia h100 sxm5 80gb", "NVIDIA H100 SXM"),
    ("NVIDIA H100 PCIe", "NVIDIA H100 PCIe"),
    ("NVIDIA H100 NVL", "NVIDIA H100 NVL"),
    ("NVIDIA H200", "NVIDIA H200"),
    ("NVIDIA H200 NVL", "NVIDIA H200 NVL"),
    ("NVIDIA H20", "NVIDIA H20"),
    ("NVIDIA A100-SXM4-40GB", "NVIDIA A100 40GB"),
    ("NVIDIA A100-PCIE-40GB", "NVIDIA A100 40GB"),
    ("NVIDIA A100-SXM4-80GB", "NVIDIA A100 80GB SXM"),
    ("NVIDIA A100 80GB PCIe", "NVIDIA A100 80GB PCIe"),
    ("NVIDIA L40S", "NVIDIA L40S"),
    ("NVIDIA L4", "NVIDIA L4"),
    ("NVIDIA GeForce RTX 4090", "NVIDIA GeForce RTX 4090"),
    ("MTT S4000", "MTT S4000"),
    ("Moore Threads MTT S80", "MTT S80"),
])
def test_spec_table_matches_reported_names(name, device):
    assert device_peaks.spec_peaks(name).source == f"spec: {device}"


@pytest.mark.parametrize("name", ["NVIDIA GH200 480GB", "NVIDIA H100", "NVIDIA H800", "NVIDIA H100 64GB HBM3",
                                  "NVIDIA GeForce RTX 4090 D", "NVIDIA A100", "Tesla V100-SXM2-16GB", "MTT S3000", ""])
def test_unlisted_variants_are_not_guessed(name):
    assert device_peaks.spec_peaks(name) is None


def test_spec_figures():
    names = [name for names, *_ in device_peaks._SPECS.values() for name in names]
    assert len(device_peaks.SPEC_TABLE) == len(names)  # no two reported names share a key
    h200 = device_peaks.spec_peaks("NVIDIA H200")
    assert (h200.memory_gbps, h200.bf16_tflops, h200.fp8_tflops, h200.fp32_tflops) == (4800, 989.4, 1978.9, 67.0)
    assert h200.tflops(torch.bfloat16) == h200.tflops(torch.float16) == 989.4
    assert h200.tflops(torch.float32) == 67.0 and h200.tflops(torch.bfloat16, fp8=True) == 1978.9
    assert h200.tflops(torch.int8) is None
    assert device_peaks.spec_peaks("NVIDIA A100-SXM4-80GB").tflops(torch.bfloat16, fp8=True) is None
    assert h200.summary() == "4800 GB/s; TFLOP/s bf16 989.4, fp8 1978.9, fp32 67.0 (spec: NVIDIA H200)"
    for peaks in device_peaks.SPEC_TABLE.values():  # every device: bandwidth set, dense bf16 above fp32
        assert peaks.memory_gbps > 0
        assert peaks.bf16_tflops is None or peaks.bf16_tflops > peaks.fp32_tflops


def test_peaks_for_known_unknown_and_cpu(fake_musa, monkeypatch):
    probed = []
    measured = device_peaks.Peaks(device_peaks.MEASURED, 100.0, 10.0, None, 1.0)
    monkeypatch.setattr(device_peaks, "measure_peaks", lambda device: probed.append(device) or measured)
    assert device_peaks.peaks_for(MUSA).source == "spec: MTT S4000" and not probed
    fake_musa.name = "MTT S9999 prototype"
    assert device_peaks.peaks_for(MUSA) is measured and probed == [MUSA]
    assert device_peaks.peaks_for(torch.device("cpu")) is None and probed == [MUSA]


def test_probe_figures_from_its_timings(monkeypatch):
    monkeypatch.setattr(device_peaks, "PROBE_COPY_BYTES", 1000)
    monkeypatch.setattr(device_peaks, "PROBE_MATMUL_SIZE", 10)
    seconds = iter([9.0, 0.5, 2.0, 0.5, 0.5] + [1e-9, 1e-9, 4e-9, 1e-9, 1e-9] + [2e-9] * 5)
    calls = []

    def timer(fn):
        calls.append(fn())
        return next(seconds)
    peaks = device_peaks.measure_peaks(torch.device("cpu"), timer)
    assert peaks.source == "measured probe" and peaks.fp8_tflops is None
    assert peaks.memory_gbps == pytest.approx(2 * 1000 / 0.5 / 1e9)  # best copy: 0.5 s, read + write
    assert peaks.bf16_tflops == pytest.approx(2 * 10**3 / 1e-9 / 1e12)  # 2 n^3 FLOP in the best 1 ns
    assert peaks.fp32_tflops == pytest.approx(2 * 10**3 / 2e-9 / 1e12)
    assert len(calls) == 15 and calls[5].dtype == torch.bfloat16 and calls[10].dtype == torch.float32
    assert calls[5].shape == (10, 10) and calls[0].numel() == 1000


def peak_case(op="fake", dtype=torch.bfloat16, nbytes=10**9, flops=2e12, fp8_providers=()):
    return harness.Case(op=op, shape=(2, 3), dtype=dtype, mode="full", device=torch.device("cpu"), bytes=nbytes,
                        main_bytes=10**9, flops=flops, fp8_providers=fp8_providers,
                        providers={name: (lambda: None) for name in ("ours", "ours_fp8", "eager")})


def test_fractions_of_peak_in_rows():
    env = harness.Environment(**{**vars(ENV), "peaks": device_peaks.Peaks("spec: test", 4.0, 8.0, 16.0, 2.0)})
    times = {name: [1.0, 1.0, 1.0] for name in ("ours", "ours_fp8", "eager", "copy")}  # 1 GB, 2 TFLOP in 1 s

    def fractions(case, name="ours", environment=env):
        row = harness.provider_row(case, name, times, environment, "now")
        return row["frac_of_peak_bw"], row["frac_of_peak_flops"]
    assert fractions(peak_case()) == (0.25, 0.25)                              # 1 / 4 GB/s, 2 / 8 bf16
    assert fractions(peak_case(dtype=torch.float16)) == (0.25, 0.25)
    assert fractions(peak_case(dtype=torch.float32)) == (0.25, 1.0)            # 2 / 2 fp32
    assert fractions(peak_case(), "ours_fp8") == (0.25, 0.125)                 # 2 / 16 fp8
    assert fractions(peak_case(op="linear_fp8"), "eager") == (0.25, 0.125)
    assert fractions(peak_case(fp8_providers=("ours",))) == (0.25, 0.125)
    assert fractions(peak_case(fp8_providers=("ours",)), "eager") == (0.25, 0.25)
    assert fractions(peak_case(nbytes=None, flops=None)) == (None, None)
    no_fp8 = harness.Environment(**{**vars(ENV), "peaks": device_peaks.Peaks("spec: test", 4.0, 8.0, None, 2.0)})
    assert fractions(peak_case(), "ours_fp8", no_fp8) == (0.25, None)
    assert fractions(peak_case(), "ours", ENV) == (None, None)                 # CPU: no peaks


def test_table_shows_peak_columns_only_with_peaks():
    row = harness.provider_row(peak_case(), "ours", {n: [1.0] for n in ("ours", "eager", "copy")}, ENV, "now")
    assert "% of peak" not in harness.table_header() and harness.table_header(False) == harness.table_header()
    row.update(frac_of_peak_bw=0.5, frac_of_peak_flops=0.125)
    header, line = harness.table_header(True), harness.table_line(row, True)
    assert header.index("% of copy") < header.index("% of peak BW") < header.index("TFLOP/s") \
        < header.index("% of peak FLOP") < header.index("x vs eager")
    for title, cell in (("% of peak BW", "50%"), ("% of peak FLOP", "12%"), ("TFLOP/s", "2.000"), ("GB/s", "1.0")):
        start = header.index(title)
        assert line[start:start + len(title)].split()[0] == cell, title


def scale_cases(quick, device):
    x = torch.ones(4, 8, device=device)
    yield harness.Case(op="scale", shape=(4, 8), dtype=torch.float32, mode="fwd", device=device, bytes=256,
                       main_bytes=128, flops=32.0, providers={"ours": lambda: x * 2, "eager": lambda: x + x})


def test_cli_run_with_device_peaks(capsys, monkeypatch, tmp_path):
    """A CPU run given an accelerator's peaks: the peak line, the peak columns and the JSON."""
    peaks = device_peaks.Peaks("spec: test", 1.0, 1.0, None, 1e-3)
    monkeypatch.setattr(catalog, "FAMILIES", {"scale": scale_cases})
    monkeypatch.setattr(harness, "MIN_COPY_BYTES", 1 << 12)
    monkeypatch.setattr(harness, "configure_allocator", lambda: "default")
    environment = harness.environment
    monkeypatch.setattr(harness, "environment", lambda *a: harness.Environment(
        **{**vars(environment(*a)), "peaks": peaks}))
    path = tmp_path / "run.json"
    assert cli.main(["run", "--device", "cpu", "--rounds", "2", "--json", str(path)]) == 0
    out = capsys.readouterr().out.splitlines()
    assert "device peaks: 1 GB/s; TFLOP/s bf16 1.0, fp8 -, fp32 0.0 (spec: test)" in out
    header = out.index(harness.table_header(True))
    assert [line.split()[:5] for line in out[header + 1:header + 3]] == [
        ["scale", "4x8", "float32", "fwd", p] for p in ("ours", "eager")]
    document = json.loads(path.read_text())
    assert document["environment"]["peaks"] == {"source": "spec: test", "memory_gbps": 1.0, "bf16_tflops": 1.0,
                                                "fp8_tflops": None, "fp32_tflops": 1e-3}
    for row in document["rows"]:
        assert row["frac_of_peak_bw"] == pytest.approx(row["gbps"] / 1.0)
        assert row["frac_of_peak_flops"] == pytest.approx(row["tflops"] / 1e-3)
