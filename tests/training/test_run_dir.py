"""A run directory shared by the processes of a job: what the others read is written whole, and once."""

import pathlib
import time

import jax
import pytest
from jax.experimental import multihost_utils

from scope_jax.training.run_dir import ADAPTERS, CONFIG, METRICS, SUMMARY, RunDir, RunDirError

CONFIG_DICT = {"seed": 0, "train": {"steps": 2}}
PINNED = {"base+adapter": "sha256 of its weights"}


def test_a_resumed_run_leaves_its_config_and_pinned_record_as_they_are(tmp_path):
    with RunDir.create(tmp_path, CONFIG_DICT) as run:
        run.pin(ADAPTERS, PINNED)
    files = (tmp_path / CONFIG, tmp_path / ADAPTERS)
    before = [(file.stat().st_ino, file.stat().st_mtime_ns) for file in files]
    time.sleep(0.05)  # past the file system's timestamp granularity
    with RunDir.create(tmp_path, CONFIG_DICT) as run:
        run.pin(ADAPTERS, PINNED)
    assert [(file.stat().st_ino, file.stat().st_mtime_ns) for file in files] == before


def test_a_process_opening_the_run_while_process_0_writes_the_config_never_reads_half_of_it(
        tmp_path, monkeypatch):
    write_text = pathlib.Path.write_text

    def write_in_two_halves(path, text, *args, **kwargs):
        write_text(path, text[:len(text) // 2])
        monkeypatch.setattr(jax, "process_index", lambda: 1)  # process 1 opens the run in between
        with RunDir.create(tmp_path, CONFIG_DICT):
            pass
        monkeypatch.setattr(jax, "process_index", lambda: 0)
        return write_text(path, text, *args, **kwargs)

    monkeypatch.setattr(pathlib.Path, "write_text", write_in_two_halves)
    with RunDir.create(tmp_path, CONFIG_DICT):
        pass
    monkeypatch.undo()
    assert RunDir.create(tmp_path, CONFIG_DICT).path == tmp_path  # the config came out whole


def test_a_process_killed_while_cutting_the_metrics_back_leaves_them_whole(tmp_path, monkeypatch):
    with RunDir.create(tmp_path, CONFIG_DICT) as run:
        for step in range(4):
            run.log(step, {"reward": float(step)})
    write_text = pathlib.Path.write_text

    def killed_half_way(path, text, *args, **kwargs):
        write_text(path, text[:len(text) // 2])
        raise KeyboardInterrupt  # stands for the kill

    monkeypatch.setattr(pathlib.Path, "write_text", killed_half_way)
    with pytest.raises(KeyboardInterrupt):
        RunDir(tmp_path).keep_metrics(lambda record: record["step"] < 2)
    monkeypatch.undo()
    assert [record["step"] for record in RunDir(tmp_path).read_metrics()] == [0, 1, 2, 3]


@pytest.mark.parametrize("process", [0, 1])
def test_only_process_0_removes_the_run_that_overwrite_replaces_before_the_processes_meet(
        tmp_path, monkeypatch, process):
    with RunDir.create(tmp_path, CONFIG_DICT) as run:
        run.write_summary("# a finished run")
    met = []  # whether the finished run was still there when this process met the others
    monkeypatch.setattr(jax, "process_index", lambda: process)
    monkeypatch.setattr(jax, "process_count", lambda: 2)
    monkeypatch.setattr(multihost_utils, "sync_global_devices",
                        lambda name: met.append((tmp_path / SUMMARY).exists()))
    RunDir.create(tmp_path, {**CONFIG_DICT, "seed": 1}, overwrite=True)
    # process 0 removed it before meeting the others; process 1 left it to process 0
    assert met == [process == 1]


def test_a_last_metrics_line_cut_short_is_left_out_with_a_warning_an_earlier_one_named(tmp_path, capsys):
    with RunDir.create(tmp_path, CONFIG_DICT) as run:
        for step in range(3):
            run.log(step, {"reward": float(step)})
    whole = (tmp_path / METRICS).read_text()
    (tmp_path / METRICS).write_text(whole[:-10])  # a process stopped while writing the last record
    run = RunDir(tmp_path)
    run.keep_metrics(lambda record: True)  # as a resumed run does
    assert "ends in a line that is not a whole record" in capsys.readouterr().err
    assert [record["step"] for record in run.read_metrics()] == [0, 1]
    assert (tmp_path / METRICS).read_text().endswith("}\n")  # the next record starts a line of its own

    lines = whole.splitlines()
    (tmp_path / METRICS).write_text("\n".join([lines[0], lines[1][:-10], lines[2]]) + "\n")
    with pytest.raises(RunDirError, match=f"{METRICS} line 2 is not a JSON record"):
        run.read_metrics()


def test_a_damaged_config_is_named_as_damaged_not_as_another_config(tmp_path):
    RunDir.create(tmp_path, CONFIG_DICT)
    (tmp_path / CONFIG).write_text((tmp_path / CONFIG).read_text()[:20])
    with pytest.raises(RunDirError, match=f"{CONFIG} is damaged"):
        RunDir.create(tmp_path, CONFIG_DICT)
