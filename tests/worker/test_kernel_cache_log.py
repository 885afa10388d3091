"""The start-up's Triton compile count: new cache entries per phase, nothing when disabled."""

from __future__ import annotations

import logging

from compiled_llm.worker.kernel_cache_log import KernelCacheLog, triton_cache_dirs


def test_counts_new_entries_per_phase(tmp_path, monkeypatch, caplog):
    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path))
    (tmp_path / "old").mkdir()
    log = KernelCacheLog(enabled=True)
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    log.mark("profile")
    log.mark("warmup")
    (tmp_path / "c").mkdir()
    log.mark("capture")
    assert log.phases == {"profile": 2, "warmup": 0, "capture": 1}
    assert triton_cache_dirs()[0] == tmp_path
    with caplog.at_level(logging.INFO, logger="compiled_llm.worker.kernel_cache_log"):
        log.log()
    assert "profile 2, warmup 0, capture 1" in caplog.text


def test_disabled_counts_nothing(tmp_path, monkeypatch):
    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path))
    log = KernelCacheLog(enabled=False)
    (tmp_path / "a").mkdir()
    log.mark("capture")
    assert log.phases == {}


def test_names_kernels_compiled_after_the_dry_pass(tmp_path, monkeypatch, caplog):
    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path))
    log = KernelCacheLog(enabled=True)

    def entry(name: str, kernel: str) -> None:
        (tmp_path / name).mkdir()
        for file in (f"{kernel}.json", f"__grp__{kernel}.json", f"{kernel}.cubin"):
            (tmp_path / name / file).write_text("")

    entry("a", "_decode_kernel")
    log.mark("precompile")  # foreseen by the dry pass: counted, not named
    entry("b", "_sampler_kernel")
    entry("c", "_gemm_kernel")
    log.mark("profile")
    log.mark("warmup")
    (tmp_path / "d").mkdir()  # a launcher built at a kernel's first launch: no json
    (tmp_path / "d" / "__triton_launcher.so").write_text("")
    log.mark("capture")
    assert log.phases == {"precompile": 1, "profile": 2, "warmup": 0, "capture": 1}
    assert log.late == {"profile": ["_gemm_kernel", "_sampler_kernel"],
                        "capture": ["__triton_launcher.so"]}
    with caplog.at_level(logging.INFO, logger="compiled_llm.worker.kernel_cache_log"):
        log.log()
    assert "by name: profile: _gemm_kernel, _sampler_kernel" in caplog.text
