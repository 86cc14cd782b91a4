"""te-bench train and the gpt family: argument parsing and errors, a tiny real training run
through the CLI (curves, JSON schema), the model twins, the gpt family's providers, and the
tokens_per_s row field."""
import dataclasses
import functools
import json
import math

import pytest
import torch

from numerics import assert_close
from transformer_engine.bench import catalog, cli, gpt, gpt_cases, gpt_data, gpt_report, harness, layer_cases
from transformer_engine.bench.gpt_model import VOCAB, GPTConfig, PlainGPT, te_gpt_from

FLOORS = ("gemm_floor", "gemm_floor_fp8")

TINY = dict(layers=1, hidden=32, heads=2, seq=32, batch=4)
TINY_ARGS = [item for name, value in TINY.items() for item in (f"--{name}", str(value))]
CPU = torch.device("cpu")


@pytest.fixture(autouse=True)
def quiet_allocator(monkeypatch):
    monkeypatch.setattr(harness, "configure_allocator", lambda: "default")  # leave this process's malloc alone


def run_main(capsys, argv):
    code = cli.main(argv)
    out, err = capsys.readouterr()
    return code, out, err


def test_train_parser_defaults_and_options():
    args = cli.build_parser().parse_args(["train"])
    model, train = GPTConfig(), gpt.TrainConfig()
    assert (args.steps, args.layers, args.hidden, args.heads, args.seq, args.batch, args.lr, args.seed) == (
        train.steps, model.layers, model.hidden, model.heads, model.seq, model.batch, train.lr, 0)
    assert args.variants == ["ours", "ours_fp8", "eager"] and args.device is args.json is args.plot is None
    args = cli.build_parser().parse_args(["train", "--steps", "7", "--variants", "eager, compile,eager", "--lr", "1e-2",
                                          "--json", "t.json", "--device", "cpu", *TINY_ARGS])
    assert args.steps == 7 and args.variants == ["eager", "compile"] and args.lr == 0.01
    cfg = cli.train_config(args)
    assert cfg.model == GPTConfig(**TINY, groups=2) and cfg.steps == 7 and cfg.warmup == 7


@pytest.mark.parametrize("argv, words", [
    (["train", "--steps", "0"], "positive integer"),
    (["train", "--hidden", "-4"], "positive integer"),
    (["train", "--variants", "ours,nope"], "'ours,nope'"),
    (["train", "--variants", ","], "expected variants"),
    (["train", "--lr", "0"], "positive number"),
    (["train", "--lr", "fast"], "positive number"),
    (["train", "--hidden", "100", "--heads", "3"], "hidden (100) must be divisible by heads (3)"),
    (["train", "--hidden", "36", "--heads", "4"], "even head size"),
    (["train", "--device", "musa"], "no MUSA device"),
    (["train", "--device", "tpu"], "tpu"),
])
def test_train_bad_arguments_exit_2_with_one_line(capsys, argv, words):
    code, out, err = run_main(capsys, argv)
    assert code == 2 and out == "" and err.count("\n") == 1 and err.startswith("te-bench") and words in err, err


def test_corpus_is_the_standard_library_split_by_file():
    corpus = gpt_data.load_corpus(33)
    assert corpus.train_files > 5 * corpus.heldout_files > 0
    assert corpus.train.dtype == torch.uint8 and corpus.train.numel() + corpus.heldout.numel() <= gpt_data.MAX_BYTES
    first = gpt_data.stdlib_files()[0].read_bytes()
    assert bytes(corpus.train[:100].tolist()) == first[:100]
    one, two = (gpt_data.batches(corpus.train, 3, 16, 5, CPU) for _ in range(2))
    (ids, targets), (ids2, _) = next(one), next(two)
    assert ids.shape == targets.shape == (3, 16) and ids.dtype == torch.int64
    assert torch.equal(ids, ids2) and torch.equal(ids[:, 1:], targets[:, :-1])  # seeded; targets = next byte
    with pytest.raises(ValueError, match="fewer than one window"):
        gpt_data.load_corpus(10**9)


def test_te_gpt_matches_its_plain_twin():
    cfg = GPTConfig(**TINY, groups=1)  # grouped-query attention too
    plain = PlainGPT(cfg, torch.float32, CPU)
    ours = te_gpt_from(plain, torch.float32, CPU)
    ids = torch.randint(0, VOCAB, (cfg.batch, cfg.seq + 1))
    plain_loss, our_loss = plain.loss(ids[:, :-1], ids[:, 1:]), ours.loss(ids[:, :-1], ids[:, 1:])
    assert_close(our_loss, plain_loss, name="loss")
    assert abs(plain_loss.item() - math.log(VOCAB)) < 0.1  # small init: near a uniform guess
    plain_loss.backward()
    our_loss.backward()
    assert_close(ours.embed.weight.grad, plain.embed.weight.grad, name="embedding gradient")
    assert_close(ours.head.weight.grad, plain.head.weight.grad, name="head gradient")
    with pytest.raises(ValueError, match=r"heads \(4\) must be divisible by groups \(3\)"):
        GPTConfig(hidden=32, heads=4, groups=3)


def test_tiny_training_run(capsys, tmp_path):
    path = tmp_path / "train.json"
    argv = ["train", "--device", "cpu", "--steps", "30", "--lr", "1e-2", "--json", str(path), *TINY_ARGS]
    code, out, _ = run_main(capsys, argv)
    assert code == 0
    lines = out.splitlines()
    table = lines[lines.index("step         ours  ours_fp8     eager") + 1:]
    assert [line.split()[0] for line in table[:table.index("")]] == [str(s) for s in (1, 4, 7, 10, 13, 16, 19, 22,
                                                                                       25, 28, 30)]
    assert "ours_fp8 final loss vs ours: " in out and f"wrote {path}" in out
    document = json.loads(path.read_text())
    assert set(document) == {"schema", "environment", "train"} and document["schema"] == 1
    assert document["environment"]["command"] == ["te-bench", *argv] and document["environment"]["device"] == "cpu"
    result = document["train"]
    assert set(result) == {"config", "corpus", "variants", "fp8_loss_vs_high_precision_pct"}
    assert result["config"]["steps"] == 30 and result["config"]["model"]["hidden"] == 32
    variants = result["variants"]
    assert list(variants) == ["ours", "ours_fp8", "eager"]
    for name, v in variants.items():
        assert set(v) == {"variant", "dtype", "losses", "final_loss", "heldout_loss", "tokens_per_s", "saved_mb",
                          "seconds"} and v["dtype"] == str(layer_cases.step_dtype(CPU)).removeprefix("torch.")
        losses = v["losses"]
        assert len(losses) == 30 and all(math.isfinite(loss) for loss in losses), name
        assert v["final_loss"] < losses[0] - 1.0 and v["heldout_loss"] < losses[0] - 1.0, name  # it learns
        assert v["tokens_per_s"] > 0 and v["saved_mb"] > 0
    ours, fp8, eager = (torch.tensor(variants[n]["losses"]) for n in ("ours", "ours_fp8", "eager"))
    # Same weights, same batch: equal within the step dtype's rounding (bf16 where the CPU has bf16 matrix units).
    assert_close(ours[:1], eager[:1], dtype=layer_cases.step_dtype(CPU), name="first loss, ours vs eager")
    assert_close(ours, eager, dtype=torch.bfloat16, atol=0.05, name="loss curve, ours vs eager")
    assert abs(result["fp8_loss_vs_high_precision_pct"]) < 5  # FP8 tracks high precision
    assert variants["ours_fp8"]["saved_mb"] < variants["ours"]["saved_mb"]  # FP8 saves 1-byte GEMM inputs


def test_curve_steps_and_summary():
    assert gpt_report.curve_steps(1) == [0] and gpt_report.curve_steps(5) == [0, 1, 2, 3, 4]
    assert gpt_report.curve_steps(120) == list(range(0, 120, 12)) + [119]
    result = {"variants": {"eager": dict(dtype="float32", losses=[5.5, 2.0], final_loss=2.0, heldout_loss=2.5,
                                         tokens_per_s=None, saved_mb=None)},
              "fp8_loss_vs_high_precision_pct": None}
    assert gpt_report.curve_table(result) == ["step        eager", "1           5.500", "2           2.000"]
    assert gpt_report.summary_lines(result)[1].split() == ["eager", "float32", "-", "2.000", "2.500", "-"]


@pytest.fixture
def tiny_gpt_family(monkeypatch):
    """gpt_cases at TINY size; torch.compile through aot_eager (it traces forward and backward
    as inductor would, without minutes of C++ compilation)."""
    monkeypatch.setattr(gpt_cases, "QUICK", GPTConfig(**TINY, groups=2))
    monkeypatch.setattr(gpt_cases, "HEADLINE", GPTConfig(**TINY, groups=1))
    monkeypatch.setattr(torch, "compile", functools.partial(torch.compile, backend="aot_eager"))
    monkeypatch.setattr(harness, "MIN_COPY_BYTES", 1 << 12)


def test_gpt_family_listed_in_both_suites():
    quick, full = (catalog.describe(quick, CPU, ["gpt"]) for quick in (True, False))
    assert [(i.op, i.shape, i.dtype, i.mode, i.providers) for i in quick] == [
        ("gpt_train_step", "4x128x128", catalog.dtype_text(layer_cases.step_dtype(CPU)), "step",
         ("ours", "ours_fp8", "eager", *FLOORS))]
    assert [(i.op, i.shape, i.providers) for i in full] == [
        ("gpt_train_step", "8x256x256", ("ours", "ours_fp8", "eager", "compile", *FLOORS))]


def test_gpt_family_steps_every_provider(tiny_gpt_family):
    (case,) = list(gpt_cases.cases(False, CPU))
    assert case.tokens == 4 * 32 and case.mode == "step" and list(case.providers) == [*gpt_cases.PROVIDERS, *FLOORS]
    steps = {name: case.providers[name] for name in gpt_cases.PROVIDERS}
    first = {name: provider() for name, provider in steps.items()}  # same weights, same batch
    for name, loss in first.items():
        assert loss.shape == () and math.isfinite(loss.item()), name
        fp8_error = {"atol": 0.02} if name == "ours_fp8" else {}  # FP8 GEMMs: a few 1e-3 off
        assert_close(loss, first["eager"], name=f"{name} first loss", **fp8_error)
    env = harness.environment(CPU, "default")
    rows = harness.run_case(case, env, rounds=1, warmup=1)
    for row in rows:
        assert row["tokens_per_s"] == pytest.approx(case.tokens / (row["p50_ms"] / 1e3))
        assert (row["saved_mb"] is None) == (row["provider"] not in ("ours", "ours_fp8", "eager"))
        assert (row["vs_floor"] is None) == (row["provider"] in FLOORS)
    # each provider steps its own copy of the weights: after 3 steps on the one batch its loss fell
    for name, provider in steps.items():
        assert provider().item() < first[name].item() - 1e-3, name


def test_gpt_gemm_floor_runs_the_steps_gemms(tiny_gpt_family):
    """Forward, dgrad and wgrad of every block's Linear weights and the LM head's, after each
    layer's causal attention products."""
    (case,) = list(gpt_cases.cases(False, CPU))
    cfg = gpt_cases.HEADLINE
    outputs = case.providers["gemm_floor"]()
    blocks = layer_cases.linear_weights(cfg.block, with_attention=True)
    attention = 6 * layer_cases.CAUSAL_BLOCKS * cfg.layers
    assert len(outputs) == attention + 3 * (cfg.layers * len(blocks) + 1)
    head_y, head_dx, head_dw = outputs[-3:]
    tokens = cfg.batch * cfg.seq
    assert head_y.shape == (tokens, VOCAB) and head_dx.shape == (tokens, cfg.hidden)
    assert head_dw.shape == (VOCAB, cfg.hidden)
    assert len(case.providers["gemm_floor_fp8"]()) == len(outputs)


def test_attention_floor_covers_the_causal_blocks():
    """Query block i meets keys [0, (i + 1) rows): S, O, dP, dV, dQ, dK of each, in dtype."""
    shape = layer_cases.AttentionShape(batch_heads=3, seq=16, head_dim=4, count=2)
    products = [gemm() for gemm in layer_cases.attention_gemms(shape, torch.float32, CPU)]
    rows = 16 // layer_cases.CAUSAL_BLOCKS
    assert len(products) == 2 * 6 * layer_cases.CAUSAL_BLOCKS
    for i in range(layer_cases.CAUSAL_BLOCKS):
        keys = (i + 1) * rows
        s, o, dp, dv, dq, dk = products[6 * i:6 * i + 6]
        assert s.shape == dp.shape == (3, rows, keys)
        assert o.shape == dq.shape == (3, rows, 4) and dv.shape == dk.shape == (3, keys, 4)
    uneven = layer_cases.AttentionShape(batch_heads=1, seq=10, head_dim=2)
    assert [g().shape for g in layer_cases.attention_gemms(uneven, torch.float32, CPU)][0] == (1, 10, 10)


def test_floor_row_fields():
    """A step row's distance to its floor provider: time over the floor's (median over rounds)
    and the p50s' difference; rows without a floor have neither."""
    times = {"ours": [0.5, 0.3, 1.0], "gemm_floor": [0.4, 0.2, 0.5], "copy": [0.01, 0.01, 0.01]}
    case = harness.Case(op="fake", shape=(2, 3), dtype=torch.float32, mode="step", device=CPU, bytes=None,
                        main_bytes=8, providers={"ours": lambda: None, "gemm_floor": lambda: None},
                        floors={"ours": "gemm_floor"})
    env = harness.environment(CPU, "default")
    row = harness.provider_row(case, "ours", times, env, "now")
    assert row["vs_floor"] == pytest.approx(1.5)  # median of 1.25, 1.5, 2.0
    assert row["above_floor_ms"] == pytest.approx(100.0)  # p50 0.5 s - p50 0.4 s
    assert "1.50x" in harness.table_line(row).split() and "x floor" in harness.table_header()
    floor = harness.provider_row(case, "gemm_floor", times, env, "now")
    assert floor["vs_floor"] is None and floor["above_floor_ms"] is None


def test_tokens_per_s_row_field():
    times = {"ours": [0.5, 0.25, 1.0], "copy": [0.01, 0.01, 0.01]}
    case = harness.Case(op="fake", shape=(2, 3), dtype=torch.float32, mode="step", device=CPU, bytes=None,
                        main_bytes=8, providers={"ours": lambda: None}, tokens=1000)
    env = harness.environment(CPU, "default")
    row = harness.provider_row(case, "ours", times, env, "now")
    assert "tokens_per_s" in harness.ROW_FIELDS and row["tokens_per_s"] == 2000.0  # over p50 = 0.5 s
    assert "2000" in harness.table_line(row).split() and "tok/s" in harness.table_header()
    untokened = dataclasses.replace(case, tokens=None)
    assert harness.provider_row(untokened, "ours", times, env, "now")["tokens_per_s"] is None
    mlp = layer_cases.mlp_case(layer_cases.LlamaConfig(hidden=8, ffn=16, heads=2, groups=1, batch=3, seq=5),
                               torch.float32, CPU)
    assert mlp.tokens == 15
