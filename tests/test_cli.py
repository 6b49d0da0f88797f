"""The command line: ``demo`` runs the whole story and checks it; ``inspect`` and ``bench`` report
what the loader does, checked against the loader itself."""

from __future__ import annotations

import json
import re
import subprocess
import sys

import pyarrow.parquet as pq
import pytest
from helpers import write_dataset
from pyiceberg.catalog import load_catalog

import arrowstream
from arrowstream import StructuredDataset, cli


def test_demo_trains_checkpoints_resumes_and_proves_exactly_once(tmp_path):
    result = subprocess.run(
        [sys.executable, "-m", "arrowstream", "demo", "--rows", "30000", "--batch-size", "256",
         "--dir", str(tmp_path)], capture_output=True, text=True, timeout=300, check=False)
    assert result.returncode == 0, result.stdout + result.stderr
    out = result.stdout
    assert "checkpoint saved after" in out
    assert out.count("every row exactly once") == 2
    assert "resumed batches equal the uninterrupted run" in out
    assert "rows/s" in out
    assert re.search(r"\[resume\] worker 1: [\d,]+ rows, \d+ splits, busy \d+% of its time", out)
    assert (tmp_path / "checkpoint.pt").exists()


def test_demo_fails_loudly_when_the_checkpoint_is_wrong(tmp_path, monkeypatch):
    """The demo's own check is real: a resume that skips a batch is caught."""
    from arrowstream._tools import demo as _demo
    from arrowstream.cli import main

    original = _demo.run_phase

    def skip_one_batch(args):
        code = original(args)
        if args.phase == "resume":
            import json
            path = tmp_path / "resume.json"
            record = json.loads(path.read_text())
            record["batches"] = record["batches"][1:]
            path.write_text(json.dumps(record))
        return code

    def run_in_process(cmd, check):   # each phase in this process, with its exit status, as subprocess.run
        argv = cmd[cmd.index("demo"):]
        return subprocess.CompletedProcess(cmd, main(argv))

    monkeypatch.setattr(_demo, "run_phase", skip_one_batch)
    monkeypatch.setattr(_demo.subprocess, "run", run_in_process)
    assert main(["demo", "--rows", "5000", "--batch-size", "256", "--workers", "0", "--dir", str(tmp_path)]) == 1


def test_demo_of_a_mixture_checks_quotas_passes_and_exact_resume(tmp_path):
    result = subprocess.run(
        [sys.executable, "-m", "arrowstream", "demo", "--mixture", "--rows", "8000", "--batch-size", "256",
         "--epochs", "2", "--dir", str(tmp_path)], capture_output=True, text=True, timeout=300, check=False)
    assert result.returncode == 0, result.stdout + result.stderr
    out = result.stdout
    assert out.count("= the quotas") == 2
    assert out.count("no row twice before all once") == 3
    assert "wiki: 3,200 rows over 2 epochs = 3.20 passes of its 1,000" in out
    assert "resumed batches equal the uninterrupted run" in out and "demo passed" in out


def test_demo_on_an_iceberg_table_resumes_on_the_pinned_snapshot(tmp_path):
    result = subprocess.run(
        [sys.executable, "-m", "arrowstream", "demo", "--iceberg", "--rows", "30000", "--batch-size", "256",
         "--dir", str(tmp_path)], capture_output=True, text=True, timeout=300, check=False)
    assert result.returncode == 0, result.stdout + result.stderr
    out = result.stdout
    assert "Iceberg table demo.regression" in out
    assert "the table moves on: 7,500 rows appended" in out
    assert out.count("every row exactly once") == 2          # of the 30,000 rows of the pinned snapshot
    assert "resumed batches equal the uninterrupted run" in out
    assert (tmp_path / "data" / "catalog.db").exists()


def arrowstream_cli(*args: str, timeout: int = 300) -> str:
    result = subprocess.run([sys.executable, "-m", "arrowstream", *args], capture_output=True, text=True,
                            timeout=timeout, check=False)
    assert result.returncode == 0, result.stdout + result.stderr
    return result.stdout


@pytest.fixture(scope="module")
def skewed(tmp_path_factory):
    """Three files of different sizes: 57,000 rows in 12 row groups."""
    return write_dataset(tmp_path_factory.mktemp("cli") / "data", [(30000, 5000), (20000, 5000), (7000, 3500)])


@pytest.mark.parametrize("world_size, num_workers", [(1, 0), (2, 2), (3, 1)])
def test_inspect_reports_the_assignment_the_loader_uses(skewed, world_size, num_workers):
    report = json.loads(arrowstream_cli("inspect", skewed, "--world-size", str(world_size), "--num-workers",
                                        str(num_workers), "--batch-size", "1000", "--json"))
    assert (report["files"], report["rows"], report["units"]) == (3, 57000, 12)
    assert [name for name, _ in report["schema"]] == pq.read_schema(f"{skewed}/part-000.parquet").names
    assert [f["rows"] for f in report["file_list"]] == [30000, 20000, 7000]
    assert sum(s["rows"] for s in report["slots"]) == 57000
    for rank in range(world_size):  # what each rank's own dataset says
        dataset = StructuredDataset(skewed, batch_size=1000, rank=rank, world_size=world_size)
        mine = report["ranks"][rank]
        assert mine["batches"] == dataset.num_batches(num_workers)
        assert mine["rows_trimmed"] == dataset.rows_trimmed_per_epoch(num_workers)
    assert len({r["batches"] for r in report["ranks"]}) == 1   # even_batches: the same on every rank
    assert report["batches_per_rank"] == [r["batches"] for r in report["ranks"]]   # as a mixture's report says it
    assert report["rows_trimmed"] == sum(r["rows"] - r["rows_yielded"] for r in report["ranks"])


def test_inspect_shows_a_cut_file_over_3_ranks_of_2_workers_trimmed_by_at_most_a_batch_per_slot(tmp_path):
    """Issue #19: 4,000 rows in 2 row groups used to be cut into 8 ranges of 500 and lose 976 rows an epoch."""
    folder = write_dataset(tmp_path / "d", [(4000, 2000)])
    report = json.loads(arrowstream_cli("inspect", folder, "--world-size", "3", "--num-workers", "2",
                                        "--batch-size", "128", "--json"))
    assert sorted(s["rows"] for s in report["slots"]) == [666, 666, 667, 667, 667, 667]
    assert all(s["rows_trimmed"] <= 128 for s in report["slots"])
    assert report["rows_trimmed"] == 0
    assert len({r["batches"] for r in report["ranks"]}) == 1
    assert report["topology"]["planning"] == 2


def test_inspect_prints_the_same_report_as_text(skewed):
    text = arrowstream_cli("inspect", skewed, "--world-size", "2", "--num-workers", "2", "--batch-size", "1000")
    report = json.loads(arrowstream_cli("inspect", skewed, "--world-size", "2", "--num-workers", "2",
                                        "--batch-size", "1000", "--json"))
    assert text.startswith("parquet files: 3 files, 57,000 rows, 12 row groups")
    assert f"even_batches trims {report['rows_trimmed']:,} rows per epoch" in text
    slot_lines = [line.split() for line in text.splitlines() if re.match(r"^\s+\d+\s+\d+\s+\d+\s+[\d,]+\s", line)]
    assert [(int(r), int(w), int(b.replace(",", ""))) for r, w, _, _, b, *_ in slot_lines] == [
        (s["rank"], s["worker"], s["batches"]) for s in report["slots"]]


def test_inspect_shows_who_reads_which_canonical_slots(skewed, capsys):
    """order="canonical": a range of canonical slots per (rank, worker), the rows each canonical slot gives a global
    batch, the global batches of an epoch (what a single process reading the same global batch yields), the rows of
    each canonical slot in runs (64 of them on one line)."""
    args = ["inspect", skewed, "--order", "canonical", "--canonical-slots", "64", "--world-size", "2",
            "--num-workers", "2", "--batch-size", "128"]
    assert cli.main([*args, "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    canonical = report["canonical"]
    assert report["topology"]["order"] == "canonical"
    assert [(r["rank"], r["worker"], r["canonical_slots"]) for r in canonical["readers"]] == [
        (0, 0, [0, 15]), (0, 1, [16, 31]), (1, 0, [32, 47]), (1, 1, [48, 63])]
    assert (canonical["slots"], canonical["chunk"], canonical["global_batch"]) == (64, 4, 256)
    assert sorted(set(canonical["rows"])) == [890, 891] and sum(canonical["rows"]) == 57000   # an even cut
    one, _ = arrowstream.StructuredDataset.create_dataloader(path=skewed, batch_size=256, order="canonical",
                                                             canonical_slots=64, columns=["id"])
    read = [len(batch["id"]) for batch in one]   # the same global batches in one process
    assert canonical["batches_per_epoch"] == len(read) == 223 and sum(canonical["rows_yielded"]) == sum(read)
    assert report["batches_per_rank"] == [223, 223]
    for rank in range(2):   # what each rank's own dataset says
        dataset = StructuredDataset(skewed, batch_size=128, rank=rank, world_size=2, order="canonical",
                                    canonical_slots=64)
        assert report["ranks"][rank]["batches"] == dataset.num_batches(2) == 223
    assert cli.main(args) == 0
    text = capsys.readouterr().out
    assert ("order=canonical: 64 canonical slots, each gives 4 rows to every global batch of 256 rows (world_size 2 x "
            "batch_size 128); 223 global batches per epoch\n") in text
    assert "\n  rank 0 worker 1: canonical slots 16-31\n" in text and "\n  rank 1 worker 1: canonical slots 48-63\n" in text
    assert (canonical["rows"].count(890), canonical["rows"].count(891)) == (24, 40)   # not in runs: counted
    assert "\n  rows per canonical slot: 890 in 24 slots, 891 in 40 (each slot's: --json)\n" in text
    assert cli.main(["inspect", skewed, "--batch-size", "128", "--json"]) == 0   # order="topology": none of it
    report = json.loads(capsys.readouterr().out)
    assert report["canonical"] is None and report["topology"]["order"] == "topology"


@pytest.mark.parametrize("world_size, num_workers", [(2, 3), (1, 2)])
def test_inspect_shows_what_dynamic_assignment_fixes_per_rank_and_leaves_to_leases(tmp_path, world_size, num_workers):
    """Under assignment='dynamic' a rank's workers lease its splits at run time: the report has no per-worker lines
    (it says why) and each rank's splits, rows and batches are its work's, as its loader yields them (the static
    per-slot figures said 30 batches a rank here, where the loader yields 34)."""
    folder = write_dataset(tmp_path / "d", [(3000, 1000), (2000, 1000), (700, 350), (1300, 1300)])
    argv = ["inspect", folder, "--world-size", str(world_size), "--num-workers", str(num_workers), "--batch-size", "100",
            "--assignment", "dynamic"]
    report = json.loads(arrowstream_cli(*argv, "--json"))
    assert report["topology"]["assignment"] == "dynamic" and report["slots"] == []
    assert "lease" in report["workers"] and "run time" in report["workers"]
    assert sum(r["splits"] for r in report["ranks"]) == report["splits"]["count"]
    assert sum(r["rows"] for r in report["ranks"]) == 7000
    for rank in range(world_size):
        loader, dataset = StructuredDataset.create_dataloader(folder, batch_size=100, num_workers=num_workers, rank=rank,
                                                              world_size=world_size, assignment="dynamic",
                                                              plan_locally=True)
        mine = report["ranks"][rank]
        rows = [len(batch["id"]) for batch in loader]
        assert (mine["batches"], mine["rows_yielded"]) == (len(loader), sum(rows)) == (len(rows), sum(rows))
        assert mine["rows_trimmed"] == dataset.rows_trimmed_per_epoch(num_workers)
    text = arrowstream_cli(*argv)
    assert "assignment=dynamic" in text and "decided at run time" in text
    assert not re.search(r"^rank  worker", text, re.MULTILINE)   # no per-worker table


def test_inspect_reads_an_iceberg_table(tmp_path):
    from arrowstream._tools import demo as _demo

    _demo.write_table(str(tmp_path), 4000)
    report = json.loads(arrowstream_cli("inspect", "--iceberg-table", "demo.regression", "--catalog-root",
                                        str(tmp_path), "--num-workers", "2", "--json"))
    catalog = load_catalog("default", **arrowstream.iceberg_catalog_config(str(tmp_path)))
    table = catalog.load_table("demo.regression")
    assert report["source"]["table"] == "demo.regression"
    assert report["source"]["snapshot_id"] == table.current_snapshot().snapshot_id
    assert report["rows"] == table.scan().to_arrow().num_rows == 4000
    assert report["files"] == len(table.inspect.files())
    assert report["unit_name"] == "row groups/stripes"   # the format's own name for its units


def test_bench_raw_loop_of_an_iceberg_table_is_its_snapshot_scan(tmp_path):
    from arrowstream._tools import demo as _demo
    from arrowstream._tools.bench import raw_batches

    _demo.write_table(str(tmp_path), 4000)
    dataset = arrowstream.IcebergDataset("demo.regression", arrowstream.iceberg_catalog_config(str(tmp_path)))
    batches = list(raw_batches(dataset, 300))
    assert sum(batch.num_rows for batch in batches) == 4000 and max(batch.num_rows for batch in batches) == 300


def _user_error(argv: list[str], capsys) -> str:
    """The one line the CLI prints for a user error (exit code 2, as argparse's own errors)."""
    with pytest.raises(SystemExit) as info:
        cli.main(argv)
    assert info.value.code == 2
    return capsys.readouterr().err


def test_inspect_names_what_is_missing(capsys):
    assert "catalog-root" in _user_error(["inspect", "--iceberg-table", "demo.regression"], capsys)
    assert "KEY=VALUE" in _user_error(["inspect", ".", "--storage-option", "anon"], capsys)


def test_bench_compares_with_pyarrow_and_plots_each_worker(tmp_path):
    folder = write_dataset(tmp_path / "data", [(40000, 5000)] * 4)
    plot = tmp_path / "workers.png"
    result = json.loads(arrowstream_cli("bench", folder, "--num-workers", "2", "--columns", "id,x,vec", "--json",
                                        "--quiet", "--sample-every", "0.02", "--plot", str(plot)))
    raw, ours = result["raw"], result["arrowstream"]
    assert raw["rows"] == ours["rows"] == ours["metrics"]["rows"] == 160000
    assert result["ratio"] == pytest.approx(ours["rows_per_s"] / raw["rows_per_s"])
    assert [w["rows"] for w in ours["metrics"]["workers"]] == [80000, 80000]
    assert len(result["samples"]) >= 2
    assert plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and plot.stat().st_size > 10_000


def test_bench_prints_the_ratio_and_the_worker_table(skewed):
    out = arrowstream_cli("bench", skewed, "--num-workers", "2", "--quiet")
    assert re.search(r"ratio:\s+[\d.]+x the pyarrow loop", out)
    rows = [int(line.split()[1].replace(",", "")) for line in out.splitlines() if re.match(r"^\s+[01]\s+[\d,]+\s", line)]
    assert sum(rows) == 57000 and len(rows) == 2


def test_bench_dynamic_assignment_leases_every_row_once(skewed):
    result = json.loads(arrowstream_cli("bench", skewed, "--num-workers", "2", "--assignment", "dynamic",
                                        "--batch-size", "1000", "--json", "--quiet"))
    metrics = result["arrowstream"]["metrics"]
    assert result["raw"]["rows"] == result["arrowstream"]["rows"] == metrics["rows"] == 57000
    assert metrics["leases"] >= 2 and all(w["leases"] >= 1 for w in metrics["workers"])   # static takes none
    assert metrics["tail_s"] >= 0
    out = arrowstream_cli("bench", skewed, "--num-workers", "2", "--assignment", "dynamic", "--quiet")
    assert "assignment=dynamic" in out and re.search(r"^worker .* leases$", out, re.MULTILINE)


def test_bench_plot_checks_matplotlib_before_it_runs(skewed, tmp_path):
    """Without matplotlib, `bench --plot` stops before the benchmark (torch not even imported) with the hint."""
    code = ("import sys; sys.modules['matplotlib'] = None\n"     # as if matplotlib were not installed
            "from arrowstream.cli import main\n"
            "try:\n"
            f"    main(['bench', {skewed!r}, '--num-workers', '0', '--plot', {str(tmp_path / 'p.png')!r}])\n"
            "except SystemExit as exc:\n"
            "    print('torch' in sys.modules, 'pyarrow' in sys.modules)\n"
            "    sys.exit(exc.code)\n")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, check=False)
    assert result.returncode == 2 and result.stdout == "False False\n"
    assert result.stderr.startswith("arrowstream: error: --plot needs matplotlib") and result.stderr.count("\n") == 1
    assert 'pip install "tqdm>=4.60" "matplotlib>=3.8"' in result.stderr and ".[cli]" in result.stderr


def test_bench_samples_a_short_epoch_often_enough_to_plot(skewed):
    """57 batches in well under a second: the default samples every len(loader)/100 batches (rounded to the
    workers), not every 0.1 s, so each worker's line on the plot has its 20+ points."""
    from arrowstream._tools.bench import series

    result = json.loads(arrowstream_cli("bench", skewed, "--num-workers", "2", "--json", "--quiet"))
    lines = series(result["samples"])
    assert sorted(lines) == [0, 1]
    assert all(len(line["rows_per_s"]) >= 20 for line in lines.values()), {w: len(v["t"]) for w, v in lines.items()}
    assert [s["batches"] for s in result["samples"]][:3] == [1, 2, 4]   # a sample every 2 batches: one per worker


def test_bench_on_a_short_epoch_says_why_the_plot_is_flat_and_what_to_do(skewed, tmp_path):
    """57 batches in a fraction of a second: the workers read ahead, so their lines are zeros between bursts;
    the report and the figure say so, with the way out (a longer epoch, --sample-every)."""
    from arrowstream._tools.bench import plot_note

    plot = tmp_path / "workers.png"
    out = arrowstream_cli("bench", skewed, "--num-workers", "2", "--quiet", "--plot", str(plot))
    note = out.split("\nnote: ", 1)[1]
    assert note.startswith("the plot has little to show: the epoch took ") and "zeros between bursts" in note
    assert "bench a longer epoch" in note and "--sample-every SECONDS" in note and plot.stat().st_size > 10_000
    worker = [{"worker": 0, "rows": 0, "idle_s": 0.0, "read_s": 0.0, "convert_s": 0.0}]
    steady = [{"t": t, "metrics": {"workers": [{**worker[0], "rows": 1000 * t, "read_s": t / 2}]}} for t in range(9)]
    assert plot_note(steady, 8.0) is None   # rows in each interval: a rate to draw


def test_bench_piped_to_a_log_prints_plain_progress_lines(skewed):
    """stderr is not a terminal (a log file, CI): lines, not one bar redrawn with carriage returns."""
    result = subprocess.run([sys.executable, "-m", "arrowstream", "bench", skewed, "--num-workers", "0",
                             "--batch-size", "1000"], capture_output=True, text=True, timeout=300, check=False)
    assert result.returncode == 0, result.stderr
    assert "\r" not in result.stderr, result.stderr[:300]
    lines = result.stderr.splitlines()
    assert lines[0] == "pyarrow: 57 batches", lines
    assert [line.split(" batches")[0] for line in lines[1:]] == [f"arrowstream: {n}/57" for n in (*range(5, 56, 5), 57)]


def test_bench_help_states_the_defaults(capsys):
    with pytest.raises(SystemExit):
        cli.main(["bench", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    for option, default in (("--batch-size BATCH_SIZE rows per batch", "1024"), ("--seed SEED the shuffle's seed", "0"),
                            ("--num-workers NUM_WORKERS loader workers", "2")):
        assert re.search(rf"{re.escape(option)} \(default:? {default}\)", text), option
    assert "--split-bytes SPLIT_BYTES target split size in bytes (default: one split per row group" in text
    assert "(default: False)" not in text and "(default: None)" not in text and "(default: [])" not in text


def test_inspect_and_bench_read_csv_with_parse_options(tmp_path):
    path = tmp_path / "data.txt"
    path.write_text("# exported\n" + "".join(f"{i};{i * 0.5};name {i}\n" for i in range(3000)))
    options = ["--format", "csv", "--split-bytes", "4096", "--parse-option", "delimiter=;",
               "--parse-option", "skip_rows=1", "--parse-option", "header=false",
               "--parse-option", 'column_names=["id", "x", "name"]']
    report = json.loads(arrowstream_cli("inspect", str(path), *options, "--num-workers", "3", "--json"))
    assert report["rows"] == 3000 and report["unit_name"] == "byte ranges" and report["units"] > 10
    assert [name for name, _ in report["schema"]] == ["id", "x", "name"]
    result = json.loads(arrowstream_cli("bench", str(path), *options, "--num-workers", "0", "--json", "--quiet"))
    assert result["raw"]["rows"] == result["arrowstream"]["rows"] == 3000


def test_user_errors_are_one_line_without_traceback(tmp_path, capsys):
    """A user error (an ArrowStreamError) prints `arrowstream: error: ...` and exits with 2, like argparse."""
    missing = str(tmp_path / "nope")
    for argv in (["inspect", missing], ["bench", missing, "--quiet"], ["inspect", tmp_path.as_posix(), "--format", "xml"]):
        err = _user_error(argv, capsys)
        assert err.startswith("arrowstream: error: ") and err.count("\n") == 1, err
    result = subprocess.run([sys.executable, "-m", "arrowstream", "inspect", missing], capture_output=True, text=True,
                            timeout=120, check=False)
    assert result.returncode == 2
    assert result.stderr == f"arrowstream: error: path: {missing!r} does not exist; check the path and the " \
                            "storage_options\n"


COMMANDS = ([], ["demo"], ["inspect"], ["bench"], ["plan"])


def test_help_imports_neither_torch_nor_pyarrow():
    """`arrowstream --help` (and each command's) is fast: building the parser imports no heavy module."""
    code = ("import sys\nfrom arrowstream.cli import main\n"
            f"for argv in {COMMANDS!r}:\n"
            "    try:\n        main([*argv, '--help'])\n    except SystemExit:\n        pass\n"
            "print('loaded:', sorted(m for m in ('torch', 'pyarrow', 'numpy', 'fsspec') if m in sys.modules))")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=False)
    assert result.returncode == 0, result.stderr
    assert result.stdout.count("usage: arrowstream") == len(COMMANDS)
    assert result.stdout.splitlines()[-1] == "loaded: []"


def test_bench_offers_the_registered_assignments(capsys):
    """`bench --assignment` offers the names the registry holds (one tuple, which `_assignment` checks at import
    against its registry), without importing torch to know them (see the test above)."""
    from arrowstream._assignment import ASSIGNMENTS
    from arrowstream._core.assignment_names import ASSIGNMENT_NAMES

    assert ASSIGNMENT_NAMES == tuple(ASSIGNMENTS)
    with pytest.raises(SystemExit):
        cli.main(["bench", "--help"])
    assert f"--assignment {{{','.join(ASSIGNMENTS)}}}" in capsys.readouterr().out


def test_the_package_imports_its_public_names_on_first_use():
    assert set(arrowstream.__all__) <= set(dir(arrowstream))
    for name in arrowstream.__all__:
        assert getattr(arrowstream, name) is not None
    assert arrowstream.StructuredDataset is StructuredDataset
    assert arrowstream.merge_state_dicts.__module__ == "arrowstream._loader.checkpoint"
    with pytest.raises(AttributeError, match="no attribute 'StructuredDatasett'"):
        arrowstream.StructuredDatasett  # noqa: B018


@pytest.mark.parametrize("argv", COMMANDS)
def test_help_is_plain_text(argv, capsys):
    with pytest.raises(SystemExit) as info:
        cli.main([*argv, "--help"])
    assert info.value.code == 0
    text = capsys.readouterr().out
    assert text.startswith("usage: arrowstream")
    markup = re.findall(r"``|`\w|:(?:func|meth|class|data|mod|attr|ref):", text)
    assert not markup, text
    if argv == ["plan"]:
        from arrowstream._planning.cache import CACHE_DIR_ENV

        assert f"${CACHE_DIR_ENV}" in text


def test_user_errors_of_every_command_are_one_line_with_status_2(tmp_path, skewed, capsys):
    missing = str(tmp_path / "nope")
    for argv in (["plan", missing], ["inspect", skewed, "--batch-size", "0"],
                 ["bench", skewed, "--plot", str(tmp_path / "no-folder" / "p.png")],
                 ["inspect", "--source", "web"]):
        err = _user_error(argv, capsys)
        assert err.startswith("arrowstream: error: ") and err.count("\n") == 1, err
    assert "no-folder" in _user_error(["bench", skewed, "--plot", str(tmp_path / "no-folder" / "p.png")], capsys)
    for argv in (["demo", "--rows", "-5"], ["demo", "--stop-at", "1.5"], ["bench", skewed, "--num-workers", "x"]):
        err = _user_error(argv, capsys)   # argparse: the usage, then one error line
        assert err.splitlines()[-1].startswith("arrowstream ") and "error: argument" in err.splitlines()[-1], err


def test_other_failures_are_one_line_with_status_1_and_traceback_shows_them(tmp_path, capsys, monkeypatch):
    monkeypatch.delenv("ARROWSTREAM_DEBUG", raising=False)
    argv = ["inspect", "--iceberg-table", "demo.t", "--catalog-config", str(tmp_path / "missing.json")]
    with pytest.raises(SystemExit) as info:
        cli.main(argv)
    err = capsys.readouterr().err
    assert info.value.code == 1 and err.count("\n") == 1
    assert err.startswith("arrowstream: error: FileNotFoundError: ") and "--traceback" in err
    with pytest.raises(FileNotFoundError):           # the exception itself, so Python prints its traceback
        cli.main(["--traceback", *argv])
    with pytest.raises(FileNotFoundError):
        cli.main([*argv, "--traceback"])
    monkeypatch.setenv("ARROWSTREAM_DEBUG", "1")
    with pytest.raises(arrowstream.DatasetNotFoundError):
        cli.main(["plan", str(tmp_path / "nope")])


def test_inspect_describes_a_mixture_with_the_loaders_numbers(tmp_path):
    import os

    import pyarrow as pa

    from arrowstream import Mixture, Source

    for name, rows in (("web", 5000), ("wiki", 150)):
        (tmp_path / name).mkdir()
        pq.write_table(pa.table({"id": list(range(rows))}), tmp_path / name / "p.parquet", row_group_size=500)
    result = subprocess.run(
        [sys.executable, "-m", "arrowstream", "inspect", "--source", f"web={tmp_path / 'web'}", "--source",
         f"wiki={tmp_path / 'wiki'}", "--weight", "web=0.9", "--weight", "wiki=0.1", "--epoch-rows", "2000",
         "--world-size", "3", "--num-workers", "2", "--batch-size", "128", "--epoch", "1", "--json"],
        capture_output=True, text=True, timeout=120, check=False,
        env={**os.environ, "ARROWSTREAM_CACHE_DIR": str(tmp_path / "cache")})
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert report["sources"]["wiki"] == {"rows": 150, "quota": 200, "pass": 1, "pass_row": 50}
    assert sum(slot["sources"]["wiki"] for slot in report["slots"]) == 200
    for rank in range(3):
        loader, mixture = Mixture.create_dataloader(
            sources={"web": Source(str(tmp_path / "web")), "wiki": Source(str(tmp_path / "wiki"))},
            weights={"web": 0.9, "wiki": 0.1}, epoch_rows=2000, batch_size=128, num_workers=2, rank=rank,
            world_size=3, plan_locally=True, plan_cache=False)
        mixture.set_epoch(1)
        assert report["batches_per_rank"][rank] == report["ranks"][rank]["batches"] == len(loader) == len(list(loader))
    # the slots, ranks and rows left out of a dataset's report (one walk over the slots for both)
    assert {"rank", "worker", "rows", "batches", "rows_yielded", "rows_trimmed", "rows_dropped"} <= set(report["slots"][0])
    assert [r["rows"] for r in report["ranks"]] == [sum(s["rows"] for s in report["slots"] if s["rank"] == r)
                                                    for r in range(3)]
    assert report["rows_trimmed"] + report["rows_dropped"] == report["rows_left_out"] == sum(
        r["rows"] - r["rows_yielded"] for r in report["ranks"])
