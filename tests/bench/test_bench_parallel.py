"""te-bench parallel: a tensor-parallel TransformerLayer step on 2 gloo ranks, split into
compute and communication (figures are not checked, only that they are there and coherent)."""
import json

from transformer_engine.bench import cli, parallel


def test_parallel_step_reports_compute_communication_and_overlap(tmp_path, capsys):
    out = tmp_path / "parallel.json"
    assert cli.main(["parallel", "--hidden", "64", "--ffn", "128", "--heads", "4", "--seq", "16", "--batch", "1",
                     "--steps", "1", "--dtype", "fp32", "--json", str(out)]) == 0
    assert "| rank | step ms | compute ms" in capsys.readouterr().out
    result = json.loads(out.read_text())
    assert [row["rank"] for row in result["ranks"]] == [0, 1]
    for row in result["ranks"]:
        # column QKV and fc1 gather the sequence, row proj and fc2 reduce-scatter it, and again in backward
        assert row["collectives"] >= 8 and row["bytes"] > 0
        assert 0.0 <= row["overlap"] <= 1.0 and abs(row["compute_ms"] + row["exposed_ms"] - row["step_ms"]) < 1e-6


def test_bad_split_is_refused(capsys):
    assert cli.main(["parallel", "--heads", "3", "--steps", "1"]) == 2
    assert "heads=3" in capsys.readouterr().err
    assert parallel.ParallelConfig().tp == 2
