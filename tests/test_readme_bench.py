"""The README's benchmark numbers are those of the committed benchmark outputs in docs/bench/."""

import pathlib
import re

from experiments.bench.rollout import INCREMENTAL

ROOT = pathlib.Path(__file__).resolve().parents[1]
COLUMNS = (*INCREMENTAL, "ours, re-prefilling", "transformers, re-prefilling")


def readme_row(bench: str) -> str:
    """The README's Benchmarks table row of `bench`."""
    return next(line for line in (ROOT / "README.md").read_text().splitlines()
                if line.startswith(f"| `{bench}`"))


def tables(name: str) -> list[dict[str, list[str]]]:
    """Each table of a committed rollout output: {column: the cells after the column's name} ('>= '
    bounds read as their number)."""
    found = []
    for line in (ROOT / "docs/bench" / name).read_text().splitlines():
        if line.startswith("model "):
            found.append({})
        column = next((column for column in COLUMNS if f" {column} " in line), None)
        if found and column and line.startswith("SmolLM2-135M"):
            found[-1][column] = line.split(column)[1].replace(">= ", "").split()
    return found


def test_the_readme_rollout_row_quotes_the_committed_p4g_and_tau2_outputs():
    row = readme_row("rollout")
    (p4g,) = tables("rollout_smollm2_p4g.txt")
    cached_x = 3  # gen tok/s, wall s, s/turn, cached x, ...
    assert f"**{p4g['transformers, re-prefilling'][cached_x]}**" in row
    assert f"({p4g['ours, cached'][1]} vs {p4g['transformers, re-prefilling'][1]} s)" in row  # wall s
    assert f"**{p4g['ours, re-prefilling'][cached_x]}x**" in row
    assert f"{p4g['transformers, past_key_values'][cached_x]}x transformers with" in row

    for name in ("rollout_smollm2_p4g_amd_epyc_avx2_e5106ac.txt", "rollout_smollm2_p4g_intel_xeon.txt"):
        (machine,) = tables(name)
        quoted = row.split(f"docs/bench/{name}")[1]  # the numbers follow the file's name
        cached, carried, reprefilled, theirs = (machine[column] for column in COLUMNS)
        assert quoted.startswith(f"): **{theirs[cached_x]}** over transformers re-prefilling ({cached[1]} vs "
                                 f"{theirs[1]} s), {reprefilled[cached_x]}x ours re-prefilling, "
                                 f"{carried[cached_x]}x transformers with"), quoted[:200]

    first_turns, whole = tables("rollout_smollm2_tau2.txt")  # whole: measured turns, wall s, cached x
    assert f"**{first_turns['transformers, re-prefilling'][cached_x]}x** transformers re-prefilling" in row
    assert f"cached in {whole['ours, cached'][1]} s" in row
    assert f"**{whole['transformers, re-prefilling'][2]}x**, a bound" in row
    assert f"{whole['ours, re-prefilling'][2]}x ours re-prefilling" in row
    assert f"{whole['transformers, past_key_values'][2]}x transformers with" in row


MACHINES = ("", "_intel_xeon", "_amd_epyc_avx2")  # AMD EPYC with AVX-512, Intel Xeon, AMD EPYC without


def summary(name: str, reference: str) -> dict[str, tuple[str, str, str]]:
    """{dtype: (ours s, reference s, ratio)} of a committed train_step or sft output's SmolLM2 lines."""
    pattern = rf"  SmolLM2-135M (\w+): ours ([\d.]+)s, {reference} ([\d.]+)s.*ratio ([\d.]+);"
    found = {m[1]: m.groups()[1:] for m in re.finditer(pattern, (ROOT / "docs/bench" / name).read_text())}
    assert found, name
    return found


def test_the_readme_train_step_and_sft_rows_quote_the_committed_outputs_of_every_machine():
    for bench, reference in (("train_step", "torch"), ("sft", "peft")):
        row = readme_row(bench)
        for machine in MACHINES:
            name = f"{bench}_smollm2{machine}.txt"
            assert f"docs/bench/{name}" in row, name
            quoted = row.split(f"docs/bench/{name}")[1]  # the numbers follow the file's name
            for dtype, (ours, theirs, ratio) in summary(name, reference).items():
                assert f"{dtype} **{ratio}** ({ours} vs {theirs} s)" in quoted, (name, dtype)


def test_the_readme_train_step_row_quotes_the_float32_rerun_without_avx512():
    row = readme_row("train_step")
    name = "train_step_smollm2_amd_epyc_avx2_float32_d8eece0.txt"
    peak = lambda file: re.search(r"SmolLM2-135M float32: .*matmul peak (\d+) GFLOP/s",
                                  (ROOT / "docs/bench" / file).read_text())[1]
    ours, theirs, ratio = summary(name, "torch")["float32"]
    assert f"gave {ratio} ({ours} vs {theirs} s, docs/bench/{name})" in row
    assert f"matmul peak {peak(name)} against {peak('train_step_smollm2_amd_epyc_avx2.txt')} GFLOP/s" in row


def test_the_readme_train_step_and_sft_rows_quote_the_earlier_intel_runs_of_the_same_host():
    for bench, reference in (("train_step", "torch"), ("sft", "peft")):
        row = readme_row(bench)
        quoted = re.findall(rf"docs/bench/({bench}_smollm2_intel_xeon_93b9849_\w+\.txt) ([\d.]+)", row)
        assert len(quoted) == 2, quoted
        for name, ratio in quoted:
            assert ratio == summary(name, reference)["float32"][2], name


def test_the_readme_train_step_and_sft_rows_quote_the_intel_runs_beside_and_before_cpu_gemm():
    """The full runs with `cpu_gemm` before the headline, and the headline before `cpu_gemm`."""
    for bench, reference in (("train_step", "torch"), ("sft", "peft")):
        row = readme_row(bench)
        name = f"{bench}_smollm2_intel_xeon_71d7ef9_first_run.txt"
        assert f"docs/bench/{name} {summary(name, reference)['float32'][2]} (load" in row, name
        for commit in ("893e422", "57d9af9", "fd282fb", "71d7ef9", "93b9849"):
            name = f"{bench}_smollm2_intel_xeon_{commit}.txt"
            quoted = row.split(f"docs/bench/{name}")[1]
            for dtype, (ours, theirs, ratio) in summary(name, reference).items():
                assert f"{dtype} {ratio} ({ours} vs {theirs} s)" in quoted, (name, dtype)


def test_the_readme_train_step_and_sft_rows_quote_the_bfloat16_runs_with_mkl():
    for bench, reference, commit in (("train_step", "torch", "58f46bf"), ("sft", "peft", "a24ed43")):
        row = readme_row(bench)
        name = f"{bench}_smollm2_intel_xeon_bf16_{commit}.txt"
        ours, theirs, ratio = summary(name, reference)["bfloat16"]
        assert f"docs/bench/{name}) bfloat16 {ratio} ({ours} vs {theirs} s)" in row, name


def test_the_readme_sampler_row_quotes_the_committed_output():
    row = readme_row("sampler")
    lines = (ROOT / "docs/bench/sampler_smollm2.txt").read_text().splitlines()
    table_row = next(line for line in lines if line.startswith("SmolLM2-135M "))
    _, batch, ours, theirs, _, ratio = table_row.split()[:6]  # model, batch, ours tok/s, torch tok/s, threads
    assert f"batch {batch} (docs/bench/sampler_smollm2.txt): **{ratio}** ({ours} vs {theirs} tok/s)" in row
