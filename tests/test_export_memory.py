"""Large exports are read a conversation at a time: the same conversations and refusals as a
whole read, and memory that follows the largest conversation, not the file (peak resident
memory, VmHWM, measured in a subprocess)."""

from __future__ import annotations

import json
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from gleaner.harvest.errors import TranscriptFormatError
from gleaner.harvest.readers import iter_path, read_bytes, read_path
from gleaner.harvest.readers.stream import PIECE
from tests.big_export import tiny_conversation, write_tiny_export
from tests.samples import chatgpt_conversation, native

ROOT = Path(__file__).resolve().parent.parent
MiB = 1 << 20
# The bound README states: reading grows memory by at most this, plus
# LARGEST_FACTOR times the largest conversation's JSON.
FIXED_BYTES = 32 * MiB
LARGEST_FACTOR = 20


def summary(result: object) -> tuple[list[str], list[tuple[str, str]]]:
    transcripts = getattr(result, "transcripts")  # noqa: B009 - ReadResult
    ids = [t.model_dump_json() for t in transcripts]
    return ids, sorted(getattr(result, "errors"))  # noqa: B009


def test_a_streamed_export_reads_as_the_whole_file_does(tmp_path: Path) -> None:
    conversations: list[object] = [chatgpt_conversation(i) for i in range(300)]
    conversations.insert(7, {"neither": "a conversation"})
    conversations.insert(200, tiny_conversation(9_999, 5_000))  # spans several pieces
    text = json.dumps(conversations, ensure_ascii=False)
    assert len(text.encode()) > 4 * PIECE
    path = tmp_path / "conversations.json"
    path.write_bytes(b"\xef\xbb\xbf \n" + text.encode())  # a BOM and white space first

    streamed = read_path(path, default_owner="dana")
    whole = read_bytes(path.read_bytes(), str(path), default_owner="dana")
    assert len(streamed.transcripts) == 301 and len(streamed.errors) == 1
    assert summary(streamed) == summary(whole)

    archive = tmp_path / "export.zip"
    with zipfile.ZipFile(archive, "w", zipfile.ZIP_DEFLATED) as out:
        out.write(path, "conversations.json")
    zipped = read_path(archive, default_owner="dana")
    assert [t.conversation_id for t in zipped.transcripts] == [
        t.conversation_id for t in streamed.transcripts
    ]


def test_json_lines_streamed_read_as_the_whole_file_does(tmp_path: Path) -> None:
    lines = [json.dumps(native(i), ensure_ascii=False) for i in range(400)]
    lines[3] = "{not json"
    lines[9] = ""
    lines[11] = json.dumps(native(11, extra="a line\u2028separator inside"), ensure_ascii=False)
    lines[20] = json.dumps({"neither": "a conversation"})
    lines[30] = json.dumps(tiny_conversation(7, 3_000))  # a line longer than a piece
    path = tmp_path / "many.jsonl"
    path.write_bytes(b"\xef\xbb\xbf" + "\r\n".join(lines).encode())
    assert path.stat().st_size > 4 * PIECE

    streamed = read_path(path, default_owner="dana")
    whole = read_bytes(path.read_bytes(), str(path), default_owner="dana")
    assert len(streamed.transcripts) == 397 and len(streamed.errors) == 2
    assert summary(streamed) == summary(whole)

    path.write_text("\n".join(['{"no": 1}', "[2]"]))
    with pytest.raises(TranscriptFormatError, match="no line holds a conversation"):
        read_path(path)


def test_an_export_cut_short_yields_what_came_before_then_names_the_file(tmp_path: Path) -> None:
    text = json.dumps([chatgpt_conversation(i) for i in range(50)])
    path = tmp_path / "conversations.json"
    path.write_text(text[: len(text) * 2 // 3])
    seen: list[object] = []
    with pytest.raises(TranscriptFormatError) as refused:
        seen.extend(iter_path(path, default_owner="dana"))
    assert 0 < len(seen) < 50
    assert str(path) in str(refused.value) and "not JSON" in str(refused.value)
    # As a whole the file is refused, as before: nothing half-read is handed on.
    with pytest.raises(TranscriptFormatError, match="not JSON"):
        read_path(path, default_owner="dana")
    for broken in ('[{"a": 1} {"b": 2}]', "[1,]", "[1] 2"):
        path.write_text(broken)
        with pytest.raises(TranscriptFormatError, match="not a transcript"):
            read_path(path, default_owner="dana")


MEASURE = """
import json, sys
from pathlib import Path

def hwm():
    for line in open("/proc/self/status"):
        if line.startswith(("VmHWM", "VmRSS")):
            yield line.split()[0], int(line.split()[1]) * 1024

import gleaner.harvest.readers
from gleaner.harvest.transcript import Limits
before = dict(hwm())["VmRSS:"]
conversations = 0
for read in gleaner.harvest.readers.iter_path(Path(sys.argv[1]), default_owner="dana",
                                      limits=Limits(file_bytes=300 * 2**20)):
    conversations += read.transcript is not None
print(json.dumps({"before": before, "peak": dict(hwm())["VmHWM:"],
                  "conversations": conversations}))
"""


@pytest.mark.slow
@pytest.mark.parametrize("name", ["conversations.json", "export.jsonl"])
def test_reading_a_250_mb_export_holds_the_largest_conversation_not_the_file(
    tmp_path: Path, name: str
) -> None:
    path = tmp_path / name
    lines = name.endswith(".jsonl")
    count, largest = write_tiny_export(path, 250 * 10**6, lines=lines)
    # One conversation far larger than the rest: the bound follows it.
    with path.open("r+b") as out:
        out.seek(-1, 2)
        big = json.dumps(tiny_conversation(count, 4_000))
        out.write(("\n" + big + "\n" if lines else "," + big + "]").encode())
    largest = max(largest, len(big))
    done = subprocess.run(
        [sys.executable, "-c", MEASURE, str(path)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
        check=True,
    )
    measured = json.loads(done.stdout)
    assert measured["conversations"] == count + 1
    grown = measured["peak"] - measured["before"]
    print(
        f"{path.stat().st_size / MiB:.0f} MiB export, largest conversation "
        f"{largest / MiB:.2f} MiB: peak {measured['peak'] / MiB:.0f} MiB, "
        f"grown {grown / MiB:.1f} MiB while reading"
    )
    assert grown < FIXED_BYTES + LARGEST_FACTOR * largest, measured


IMPORT = """
import json, sys
from pathlib import Path

def status(name):
    for line in open("/proc/self/status"):
        if line.startswith(name):
            return int(line.split()[1]) * 1024

from gleaner.harvest.imports import plan_import
from gleaner.store import Store
store = Store(sys.argv[2])
store.warm_up()
before = status("VmRSS:")
planned = plan_import(store, Path(sys.argv[1]), owner="dana")
print(json.dumps({"before": before, "peak": status("VmHWM:"), "jobs": len(planned.job_ids)}))
"""


@pytest.fixture(params=["sqlite", "postgresql"])
def database_url(
    request: pytest.FixtureRequest, tmp_path: Path, sqlite_template: Path, worker_id: str
) -> str:
    if request.param == "postgresql":
        from tests.workers_harness import migrated_pg_database

        return migrated_pg_database(f"gleaner_export_memory_{worker_id}")
    path = tmp_path / "gleaner.store.db"
    path.write_bytes(sqlite_template.read_bytes())
    return f"sqlite:///{path}"


@pytest.mark.slow
@pytest.mark.postgres
def test_importing_a_50_mb_export_records_it_in_batches_not_whole(
    tmp_path: Path, database_url: str
) -> None:
    path = tmp_path / "conversations.json"
    count, _ = write_tiny_export(path, 50 * 10**6)
    done = subprocess.run(
        [sys.executable, "-c", IMPORT, str(path), database_url],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
        check=True,
    )
    measured = json.loads(done.stdout)
    assert measured["jobs"] == count
    grown = measured["peak"] - measured["before"]
    print(f"import of {path.stat().st_size / MiB:.0f} MiB: grown {grown / MiB:.1f} MiB")
    # Whole, the export's parsed value alone was about ten times the file (500 MB here).
    assert grown < 2 * FIXED_BYTES, measured
