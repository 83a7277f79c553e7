from __future__ import annotations

from bench.machine import describe_cpu, machine

AVX2_ONLY = """processor\t: 0
vendor_id\t: AuthenticAMD
model name\t: AMD EPYC
flags\t\t: fpu sse sse2 avx fma avx2 f16c
processor\t: 1
model name\t: AMD EPYC
flags\t\t: fpu sse sse2 avx fma avx2 f16c avx512f
"""

SAPPHIRE = """processor\t: 0
model name\t: Intel(R) Xeon(R) Platinum 8480+
flags\t\t: avx2 avx512f avx512_vnni avx512_bf16 amx_bf16 amx_tile amx_int8
"""


def test_the_first_processors_model_and_kernel_flags_are_described() -> None:
    assert describe_cpu(AVX2_ONLY) == {"cpu_model": "AMD EPYC", "isa": ["avx2"]}
    assert describe_cpu(SAPPHIRE) == {
        "cpu_model": "Intel(R) Xeon(R) Platinum 8480+",
        "isa": ["avx2", "avx512f", "avx512_bf16", "avx512_vnni", "amx_bf16", "amx_tile"],
    }


def test_a_text_without_flags_names_no_isa() -> None:
    assert describe_cpu("")["isa"] == []


def test_this_machine_is_described_with_its_cpus_and_load() -> None:
    described = machine()
    assert described["cpus"] >= 1
    assert described["load_avg_1m"] >= 0
    assert isinstance(described["cpu_model"], str) and described["cpu_model"]
