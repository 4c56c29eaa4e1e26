"""tools/kv_dtype_costs.py on two tiny bundles (fp32 KV, fp16 KV): every shape on both, one table."""

import sys

import kv_dtype_costs


def test_two_bundles_side_by_side(tiny_bundles, monkeypatch, capsys):
    monkeypatch.setattr(sys, "argv", ["kv_dtype_costs", str(tiny_bundles["int8"]), str(tiny_bundles["int8-kv16"]),
                                      "--reps", "1", "--lanes", "8", "--threads", "1"])
    kv_dtype_costs.main()
    out = capsys.readouterr().out
    assert "(KV float32, 512 B/token)" in out and "(KV float16, 256 B/token)" in out
    rows = [line for line in out.splitlines() if line.startswith("| ") and "ms" not in line and "---" not in line][1:]
    assert len(rows) == len(kv_dtype_costs.SHAPES) + 1  # S_max 256: context 128 only
    assert all(line.endswith("x |") for line in rows)
