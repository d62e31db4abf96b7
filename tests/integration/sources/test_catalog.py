"""The file sources' catalog on a real Postgres (sources/catalog.py): the log's catalog answers as
the in-memory one does, over random histories checked against plain Python; two hosts (two
engines on one database) share what discovery found, so a second host reads no footer the first
read; concurrent looks at one partition neither fail nor leave it inconsistent; a landing source
bound to the log gives the answers of an unbound one."""

from __future__ import annotations

import dataclasses
import os
import random
import shutil
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from sqlalchemy import create_engine, text
from sqlalchemy.engine import Engine

from airflow_txn_provider.rules.sources import next_offset_ranges
from airflow_txn_provider.sources.catalog import (
    ANALYZE_AFTER,
    NAME_SEGMENTS,
    FileCatalog,
    MemoryCatalog,
    Partition,
    PostgresCatalog,
    with_log_catalog,
)
from airflow_txn_provider.sources.landing import LandingDirectorySource
from airflow_txn_provider.sources.parquet import PartitionedParquetSource
from tests.unit.sources.files_given import LandingHistory, record

SOURCES = ["parquet:/lake:offset", "landing:/in box"]
PARTITIONS = ["0", "1", "région=é/x", "it's"]
NAMES = [f"part-{i:04d}.parquet" for i in range(8)] + [
    "sub/a.parquet",
    "sub/deep/b.parquet",
    "ünï cödé.parquet",
]
NS = 1_760_000_000 * 10**9  # a modification time in ns: beyond 32 bits, as a real one is


@pytest.fixture
def other_host(db_url: str) -> Iterator[Engine]:
    """A second engine on the same database: another machine's begins and jobs."""
    eng = create_engine(db_url)
    yield eng
    eng.dispose()


@pytest.fixture(params=["memory", "postgres"])
def catalog(request: pytest.FixtureRequest) -> FileCatalog:
    if request.param == "memory":
        return MemoryCatalog()
    return PostgresCatalog(request.getfixturevalue("txlog").engine)


def names_kept(engine: Engine, s: str, p: str) -> list[str]:
    """A partition's kept names, duplicates kept: what a listing compares a folder with."""
    sql = "SELECT names FROM txn_source_names WHERE source = :s AND partition = :p"
    with engine.connect() as conn:
        values = conn.execute(text(sql), {"s": s, "p": p}).scalars()
        return sorted(name for value in values for name in value.split("\n"))


# -- the contract, on each catalog ---------------------------------------------------------------


class Truth:
    """What a catalog must answer, kept the plainest way: every file's facts and every
    partition's last folders; ends and newest files computed on each question."""

    def __init__(self) -> None:
        self.folders: dict[tuple[str, str], dict[str, tuple[int, int, int]]] = {}
        self.files: dict[tuple[str, str], dict[str, tuple[int, int, int, int]]] = {}

    def record(self, s: str, p: str, folders: dict, added: dict, dropped: list) -> Partition:
        files = self.files.setdefault((s, p), {})
        for name in dropped:
            if name not in added:
                files.pop(name, None)
        files.update(added)
        self.folders[(s, p)] = dict(folders)
        return self.partition(s, p)

    def partition(self, s: str, p: str) -> Partition:
        files = self.files[(s, p)]
        tops = [last for (_, _, _, last) in files.values() if last >= 0]
        if not tops:
            return Partition(dict(self.folders[(s, p)]), 0, {})
        top = max(tops)
        newest = {n: (f[0], f[1]) for n, f in files.items() if f[3] == top}
        return Partition(dict(self.folders[(s, p)]), top + 1, newest)

    def forget(self, s: str, partitions: list[str]) -> None:
        for p in partitions:
            self.folders.pop((s, p), None)
            self.files.pop((s, p), None)

    def partitions(self, s: str) -> dict[str, Partition]:
        return {p: self.partition(s, p) for (s2, p) in self.folders if s2 == s}

    def names(self, s: str, p: str) -> set[str]:
        return set(self.files.get((s, p), {}))

    def meeting(self, s: str, p: str, start: int, end: int) -> dict[str, tuple[int, int]]:
        """Files holding some offset of ``[start, end)``, offset by offset."""
        files = self.files.get((s, p), {})
        return {
            n: (f[2], f[3])
            for n, f in files.items()
            if any(f[2] <= o <= f[3] for o in range(start, end))
        }


def random_look(rng: random.Random) -> tuple[dict, dict, list]:
    """A look at a partition as discovery records one: folders, files added, files dropped."""
    folders = {
        d: (rng.randrange(1, 2**40), NS + rng.randrange(10**12), NS + 10**12 + rng.randrange(9))
        for d in rng.sample(["", "sub/", "sub/deep/"], rng.randrange(4))
    }
    added = {}
    for name in rng.sample(NAMES, rng.randrange(5)):
        if rng.random() < 0.1:
            first = last = -1  # a file of no rows
        else:
            first = rng.randrange(30)
            last = first + rng.randrange(6)  # narrow and close: ties on the end are common
        added[name] = (rng.randrange(1, 2**40), NS + rng.randrange(10**12), first, last)
    dropped = rng.sample(NAMES, rng.randrange(4))  # known or not, some added again
    return folders, added, dropped


@pytest.mark.parametrize("seed", [11, 12, 13])
def test_postgres_and_memory_catalogs_answer_alike_over_random_histories(txlog, seed):
    """Records, drops and forgets at random over two sources and four partitions: after every
    step both catalogs give the plain Python answer to every question."""
    print(f"seed {seed}")
    rng = random.Random(seed)
    truth = Truth()
    catalogs: list[FileCatalog] = [MemoryCatalog(), PostgresCatalog(txlog.engine)]
    for step in range(100):
        where = f"seed {seed} step {step}"
        s = rng.choice(SOURCES)
        roll = rng.random()
        if roll < 0.8:
            p = rng.choice(PARTITIONS)
            folders, added, dropped = random_look(rng)
            expected = truth.record(s, p, folders, added, dropped)
            for cat in catalogs:
                got = record(cat, s, p, folders, added, dropped)
                assert got == expected, f"{where}: {type(cat).__name__}.record"
        elif roll < 0.9:
            gone = rng.sample([*PARTITIONS, "never"], rng.randrange(3))
            truth.forget(s, gone)
            for cat in catalogs:
                cat.forget(s, gone)
        for other in SOURCES:
            expected_parts = truth.partitions(other)
            for cat in catalogs:
                got_parts = cat.partitions(other)
                assert got_parts == expected_parts, f"{where}: {type(cat).__name__} {other}"
            asked = rng.sample([*PARTITIONS, "never"], rng.randrange(1, 4))  # names, at once
            expected_names = {p: truth.names(other, p) for p in asked}
            for cat in catalogs:
                got_names = {p: set(names) for p, names in cat.names(other, asked).items()}
                assert got_names == expected_names, f"{where}: {type(cat).__name__} {other}"
        for p in PARTITIONS:  # of the source looked at
            if rng.random() < 0.5:
                start = rng.randrange(40)
                end = start + rng.randrange(1, 12)
                want = (truth.names(s, p), truth.meeting(s, p, start, end))
                for cat in catalogs:
                    got = (set(cat.names(s, [p])[p]), cat.meeting(s, p, start, end))
                    assert got == want, f"{where}: {type(cat).__name__} {s} {p} [{start}, {end})"
                kept = names_kept(txlog.engine, s, p)  # each name once, as the files' rows
                assert kept == sorted(truth.names(s, p)), f"{where}: names kept"


def test_record_keeps_ends_newest_and_folders(catalog):
    s, p = SOURCES[0], PARTITIONS[2]
    folders = {"": (2**40 + 1, NS + 1, NS + 10**10), "sub/": (7, NS + 2, NS + 10**10)}
    added = {
        "a.parquet": (10, NS + 3, 0, 9),
        "sub/b.parquet": (2**40, NS + 4, 10, 19),
        "ünï.parquet": (30, NS + 5, 12, 19),
    }
    part = record(catalog, s, p, folders, added, ())
    expected = Partition(
        folders, 20, {"sub/b.parquet": (2**40, NS + 4), "ünï.parquet": (30, NS + 5)}
    )
    assert part == expected
    assert catalog.partitions(s) == {p: expected}
    assert catalog.partitions(SOURCES[1]) == {}
    assert set(catalog.names(s, [p])[p]) == set(added)
    assert catalog.meeting(s, p, 10, 12) == {"sub/b.parquet": (10, 19)}
    assert catalog.meeting(s, p, 9, 13) == {
        "a.parquet": (0, 9),
        "sub/b.parquet": (10, 19),
        "ünï.parquet": (12, 19),
    }
    part = record(catalog, s, p, {}, {}, ["sub/b.parquet", "ünï.parquet"])
    assert part == Partition({}, 10, {"a.parquet": (10, NS + 3)})
    assert catalog.partitions(s)[p] == part
    part = record(catalog, s, p, folders, {"e.parquet": (1, 1, -1, -1)}, ["a.parquet"])
    assert part == Partition(folders, 0, {})
    assert set(catalog.names(s, [p])[p]) == {"e.parquet"}
    catalog.forget(s, [p, "never"])
    assert catalog.partitions(s) == {} and set(catalog.names(s, [p])[p]) == set()


def test_a_partitions_names_stay_in_a_few_values_each_name_once(txlog):
    """A look per new file, some finding known files again, one dropping a file: the names a
    listing reads stay at most ``NAME_SEGMENTS`` values, each name once."""
    s, p, cat = SOURCES[0], "0", PostgresCatalog(txlog.engine)
    known: set[str] = set()
    for i in range(3 * NAME_SEGMENTS):
        added = {f"{i:03d}.parquet": (1, NS, i, i)} | (
            {"000.parquet": (2, NS, 0, 0)} if i % 5 else {}
        )
        dropped = ["001.parquet"] if i == 2 * NAME_SEGMENTS else []
        record(cat, s, p, {}, added, dropped)
        known = (known | set(added)) - set(dropped)
        with txlog.engine.connect() as conn:
            sql = "SELECT count(*) FROM txn_source_names WHERE source = :s AND partition = :p"
            values = conn.execute(text(sql), {"s": s, "p": p}).scalar()
        assert values <= NAME_SEGMENTS, f"look {i}: {values} values"
        assert names_kept(txlog.engine, s, p) == sorted(known), f"look {i}"
        assert set(cat.names(s, [p])[p]) == known, f"look {i}"


def test_a_large_look_has_the_catalogs_tables_analysed_at_once(txlog):
    """Without it the planner takes a new dataset for a few rows until autovacuum comes, and
    plans the next looks as scans of all of them (``make bench-begin``: 76 ms, not 10).
    ``last_analyze`` is set by an ANALYZE command only, never by autovacuum."""
    sql = text(
        "SELECT relname, last_analyze IS NOT NULL FROM pg_stat_user_tables"
        " WHERE relname IN ('txn_source_file', 'txn_source_names')"
    )
    cat, few = PostgresCatalog(txlog.engine), ANALYZE_AFTER - 1
    record(cat, "small", "0", {}, {f"{i}.parquet": (1, NS, i, i) for i in range(few)}, ())
    with txlog.engine.connect() as conn:
        assert dict(conn.execute(sql).all()) == {
            "txn_source_file": False,
            "txn_source_names": False,
        }
    record(cat, "large", "0", {}, {f"{i}.parquet": (1, NS, i, i) for i in range(few + 1)}, ())
    with txlog.engine.connect() as conn:
        assert dict(conn.execute(sql).all()) == {"txn_source_file": True, "txn_source_names": True}


def test_two_hosts_see_each_others_records(txlog, other_host):
    """Two engines on one database, as two machines' begins: what one records the other reads,
    drops and forgets included."""
    a, b = PostgresCatalog(txlog.engine), PostgresCatalog(other_host)
    assert a.engine is not b.engine
    s = SOURCES[0]
    folders = {"": (5, NS, NS + 10**10)}
    record(a, s, "0", folders, {"x.parquet": (1, NS, 0, 9)}, ())
    assert b.partitions(s) == {"0": Partition(folders, 10, {"x.parquet": (1, NS)})}
    assert b.meeting(s, "0", 0, 1) == {"x.parquet": (0, 9)}
    record(b, s, "0", folders, {"y.parquet": (2, NS + 1, 10, 14)}, ())
    record(b, s, "1", {}, {"z.parquet": (3, NS + 2, 0, 0)}, ())
    assert a.partitions(s) == {
        "0": Partition(folders, 15, {"y.parquet": (2, NS + 1)}),
        "1": Partition({}, 1, {"z.parquet": (3, NS + 2)}),
    }
    assert set(a.names(s, ["0"])["0"]) == {"x.parquet", "y.parquet"}
    record(a, s, "0", folders, {}, ["y.parquet"])
    assert b.partitions(s)["0"].end == 10 and set(b.names(s, ["0"])["0"]) == {"x.parquet"}
    b.forget(s, ["0"])
    assert set(a.partitions(s)) == {"1"} and set(a.names(s, ["0"])["0"]) == set()


def record_at_once(
    s: str, p: str, folders: dict, gone: list[str], looks: list[tuple[FileCatalog, dict]]
) -> list[BaseException]:
    """Each catalog records its files in a thread of its own, all released at once: the
    errors raised."""
    barrier = threading.Barrier(len(looks))
    errors: list[BaseException] = []

    def look(cat: FileCatalog, added: dict) -> None:
        barrier.wait()
        try:
            record(cat, s, p, folders, added, gone)
        except BaseException as err:  # reported by the caller
            errors.append(err)

    threads = [threading.Thread(target=look, args=pair) for pair in looks]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return errors


def test_concurrent_looks_at_one_partition_neither_fail_nor_disagree(txlog, other_host):
    """Two hosts record overlapping files of one partition at the same moment, 50 times: rows
    are written in name order, so neither deadlocks, and the partition's end and newest files
    are those of the files both left."""
    rng = random.Random(5)
    s, p = SOURCES[0], "0"
    hosts = [PostgresCatalog(txlog.engine), PostgresCatalog(other_host)]
    pool = [f"f{i:03d}.parquet" for i in range(40)]
    known: set[str] = set()
    for round_ in range(50):
        shared = rng.choice(pool)
        looks = []
        for _ in hosts:
            added = {}
            for name in sorted({shared, *rng.sample(pool, 12)}):
                first = rng.randrange(50)
                added[name] = (rng.randrange(1, 99), NS + round_, first, first + 2)
            looks.append(added)
        # files gone, dropped by both (in name order too), never among those added
        gone = sorted(known - set(looks[0]) - set(looks[1]))[: rng.randrange(3)]
        folders = {"": (1, NS + round_, NS + 10**10)}
        errors = record_at_once(s, p, folders, gone, list(zip(hosts, looks, strict=True)))
        assert errors == [], f"round {round_}: {errors!r}"
        known = (known - set(gone)) | set(looks[0]) | set(looks[1])
        assert names_kept(txlog.engine, s, p) == sorted(known), f"round {round_}: no name twice"
        for cat in hosts:
            assert set(cat.names(s, [p])[p]) == known, f"round {round_}"
            files = cat.meeting(s, p, 0, 10**6)
            top = max(last for _, last in files.values())
            part = cat.partitions(s)[p]
            assert part.end == top + 1, f"round {round_}"
            assert set(part.newest) == {n for n, (_, last) in files.items() if last == top}


def test_concurrent_looks_with_disjoint_or_crossing_files_are_exact(txlog, other_host):
    """Two hosts record at the same moment, 30 times, files no other look has (each computes
    the partition's end from what it can read) or one dropping what the other adds: one look
    at a source records at a time, so the end is the files' and neither deadlocks."""
    s, p = SOURCES[0], "0"
    hosts = [PostgresCatalog(txlog.engine), PostgresCatalog(other_host)]
    for round_ in range(30):
        base = round_ * 1000
        a = {f"a{round_:02d}-{i:02d}": (1, NS, base + i * 10, base + i * 10 + 9) for i in range(12)}
        b = {f"b{round_:02d}-{i:02d}": (1, NS, base + 500 + i, base + 500 + i) for i in range(12)}
        errors = record_at_once(
            s, p, {"": (1, NS, NS + 10**10)}, [], [(hosts[0], a), (hosts[1], b)]
        )
        assert errors == [], f"round {round_}: {errors!r}"
        for cat in hosts:
            assert cat.partitions(s)[p].end == base + 512, f"round {round_}"
    x, y = {"x.parquet": (1, NS, 0, 1)}, {"y.parquet": (1, NS, 2, 3)}
    for round_ in range(30):
        barrier = threading.Barrier(2)
        errors: list[BaseException] = []

        def look(cat: FileCatalog, added: dict, gone: dict, barrier=barrier, errors=errors) -> None:
            barrier.wait()
            try:
                record(cat, s, "1", {}, added, set(gone))
            except BaseException as err:  # reported below
                errors.append(err)

        threads = [
            threading.Thread(target=look, args=(hosts[0], x, y)),
            threading.Thread(target=look, args=(hosts[1], y, x)),
        ]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert errors == [], f"round {round_}: {errors!r}"
        names = set(hosts[0].names(s, ["1"])["1"])
        assert len(names) == 1 and names <= {"x.parquet", "y.parquet"}, f"round {round_}"
        assert names_kept(txlog.engine, s, "1") == sorted(names), f"round {round_}"


# -- the sources, bound to the log's catalog -----------------------------------------------------


def write_parquet(root: Path, partition: str, first: int, count: int) -> Path:
    """A file of offsets ``first .. first + count - 1``, named by its first offset."""
    path = root / f"p={partition}" / f"part-{first:010d}.parquet"
    path.parent.mkdir(parents=True, exist_ok=True)
    offsets = list(range(first, first + count))
    table = pa.table(
        {"offset": pa.array(offsets, pa.int64()), "line": [f"{partition} {o}" for o in offsets]}
    )
    pq.write_table(table, path)
    return path


@pytest.fixture
def footers_read(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The names of the files whose footer was opened, in order."""
    opened: list[str] = []
    real = pq.ParquetFile

    def counting(file: Any, *args: Any, **kwargs: Any) -> Any:
        opened.append(os.path.basename(str(file)))
        return real(file, *args, **kwargs)

    monkeypatch.setattr(pq, "ParquetFile", counting)
    return opened


@pytest.mark.parametrize("template", [None, "part-{offset:010d}.parquet"])
def test_a_second_host_reads_no_footer_the_first_read(
    tmp_path, txlog, other_host, footers_read, template
):
    """Host A's begins find new files (and a new partition) and read each footer once; host B,
    a source built afresh on another engine, finds the same offsets and a job's batch files
    with no footer opened, then reads only a file landed since; a partition gone is forgotten
    for every host. Listing by folder, or looking up names made from the offsets."""
    root = tmp_path / "lake"
    write_parquet(root, "0", 0, 10)
    write_parquet(root, "0", 10, 10)
    write_parquet(root, "1", 0, 5)

    def host(engine: Engine) -> PartitionedParquetSource:
        """The source as a DAG file builds it on a machine, bound to the log there."""
        return with_log_catalog(
            PartitionedParquetSource(str(root), file_name_template=template), engine
        )

    host_a = host(txlog.engine)
    assert host_a.latest_offsets() == {"0": 20, "1": 5}
    assert sorted(footers_read) == sorted(
        ["part-0000000000.parquet"] * 2 + ["part-0000000010.parquet"]
    )
    write_parquet(root, "0", 20, 5)
    write_parquet(root, "2", 0, 3)
    footers_read.clear()
    latest = host_a.latest_offsets()
    assert latest == {"0": 25, "1": 5, "2": 3}  # new files found
    assert sorted(footers_read) == ["part-0000000000.parquet", "part-0000000020.parquet"]

    footers_read.clear()
    host_b = host(other_host)
    assert host_b.latest_offsets() == latest
    base = str(root)
    batch = host_b._files_holding(base, "0", 5, 22)  # a job on host B finds its batch's files
    assert batch == [f"{base}/p=0/part-{f:010d}.parquet" for f in (0, 10, 20)]
    assert footers_read == []  # every footer read once, by host A

    write_parquet(root, "1", 5, 3)
    assert host_b.latest_offsets() == {**latest, "1": 8}
    assert footers_read == ["part-0000000005.parquet"]
    footers_read.clear()
    assert host(txlog.engine).latest_offsets() == {**latest, "1": 8}
    assert footers_read == []

    shutil.rmtree(root / "p=2")
    assert host(other_host).latest_offsets() == {"0": 25, "1": 8}
    key = host_a.catalog_key()
    assert set(PostgresCatalog(txlog.engine).partitions(key)) == {"0", "1"}  # p=2 forgotten
    assert PartitionedParquetSource(str(root)).latest_offsets() == {"0": 25, "1": 8}  # unbound


def test_a_landing_source_bound_to_the_log_answers_as_an_unbound_one(
    tmp_path, txlog, other_host, monkeypatch
):
    """A random landing history (files landing, a gap, partitions offline and back, consumed
    files deleted); each begin on one of two hosts, bound to the log, built afresh: the same
    ``latest_offsets_after`` and batch as an unbound source (and the full listing)."""
    seed = 21
    print(f"seed {seed}")
    rng = random.Random(seed)
    root = tmp_path / "landing"
    root.mkdir()
    unbound = LandingDirectorySource(str(root), max_files_per_partition=3)
    hosts = [txlog.engine, other_host]

    def bound(engine: Engine) -> LandingDirectorySource:
        return with_log_catalog(dataclasses.replace(unbound), engine)

    history = LandingHistory(root, rng, partitions=3, most=4, gaps=True)
    prev: dict | None = None
    for txid in range(1, 30):
        history.step(prev)
        where = f"seed {seed} txid {txid}"
        starts = {p: r[1] for p, r in (prev or {}).items()}
        begin = bound(hosts[txid % 2])
        assert begin.latest_offsets_after(starts) == unbound.latest_offsets_after(starts), where
        expected = next_offset_ranges(prev, unbound.latest_offsets(), max_per_partition=3)
        assert bound(hosts[txid % 2]).initialize_transaction(txid, prev) == expected, where
        prev = expected or prev

    # Nothing changed since the last begin: another host lists no folder.
    starts = {p: r[1] for p, r in (prev or {}).items()}
    answer = bound(txlog.engine).latest_offsets_after(starts)
    listed: list[str] = []
    real = LandingDirectorySource.files
    monkeypatch.setattr(
        LandingDirectorySource, "files", lambda self, p: listed.append(p) or real(self, p)
    )
    assert bound(other_host).latest_offsets_after(starts) == answer
    assert listed == []
