"""No-op elimination on a toy graph; PassConfig keys, manager stats and the dump directory."""

from __future__ import annotations

import json

import torch

from compiled_llm.models.layers import rms_norm
from compiled_llm.passes import PassConfig, PassManager
from tests.passes.helpers import capture_run, compile_run


def test_noop_elimination_removes_only_noops():
    def fn(x, w):
        a = x.reshape(x.shape[0], 32)  # same shape
        b = a[:, 0:32]  # whole-dim slice
        c = b.to(torch.float32).contiguous().clone()  # same dtype, contiguous copy
        d = c.permute(0, 1)  # identity permute
        e = d.reshape(-1, 4, 8)  # real reshape: kept
        return torch.cat([e]) * w[:8]  # single-input cat; real slice of w: kept

    args = [torch.randn(6, 32), torch.randn(32)]
    out, before, after, m = capture_run(fn, args, PassConfig(inline_fused_ops=False))
    assert m.matches("NoOpEliminationPass") >= 4
    assert after["aten.view"] + after["aten.reshape"] + after["aten._unsafe_view"] == 1
    assert after["aten.slice"] == 1 and after["aten.clone"] == 0 and after["aten.cat"] == 0
    assert sum(before.values()) - sum(after.values()) == m.matches("NoOpEliminationPass")
    torch.testing.assert_close(out, fn(*args), rtol=0, atol=0)


def test_noop_elimination_reads_symbolic_slice_bounds():
    # buf[:T] with T dynamic: the slice's end is a node of the graph (a real slice: kept)
    def fn(x, buf):
        buf[:x.shape[0]].copy_(x)
        return buf[:x.shape[0]] * 2

    x, buf = torch.randn(6, 8), torch.zeros(32, 8)
    out, _, _ = compile_run(fn, [x, buf], PassConfig())
    torch.testing.assert_close(out, 2 * x)
    torch.testing.assert_close(buf[:6], x)
    assert not buf[6:].any()


def test_config_key_is_stable_and_tracks_flags():
    assert PassConfig().key() == PassConfig().key()
    assert PassConfig(dump_dir="/tmp/x").key() == PassConfig().key()  # dumps change no code
    assert PassConfig(enable_silu_mul=False).key() != PassConfig().key()
    assert PassManager(PassConfig()).uuid() == PassConfig().key()


def test_dump_dir_holds_graphs_diffs_and_summary(tmp_path):
    def fn(x, r, w):
        h = x + r
        return rms_norm(h, w, 1e-6), h

    manager_cfg = PassConfig(dump_dir=str(tmp_path))
    args = [torch.randn(5, 16), torch.randn(5, 16), torch.randn(16)]
    _, _, _, m = capture_run(fn, args, manager_cfg)
    piece = tmp_path / "graph"
    rows = json.loads((piece / "summary.json").read_text())
    assert [r["pass"] for r in rows] == [n for n, _, _ in m.stats]
    row = next(r for r in rows if r["pass"] == "AddRMSNormFusionPass")
    assert row["matches"] == 1 and row["changed"]
    diff = (piece / f"{row['index']:02d}_AddRMSNormFusionPass.diff").read_text()
    assert "+" in diff and "compiled_llm.fused_add_rms_norm" in diff
    assert "aten.rsqrt" in (piece / "00_before.py").read_text()
    assert "| AddRMSNormFusionPass | 1 |" in (piece / "summary.md").read_text()
    assert (piece / "99_after.py").exists()


def test_set_dump_dir_names_the_piece(tmp_path):
    m = PassManager(PassConfig())
    m.set_dump_dir(tmp_path, "piece 3/of 5")
    g = torch.fx.symbolic_trace(lambda x: x + 1).graph
    m(g)
    assert (tmp_path / "piece_3_of_5" / "summary.md").exists()
    m.set_dump_dir(None)
    assert m.config.dump_dir is None
