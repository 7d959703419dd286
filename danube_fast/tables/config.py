"""`[tables]` settings: how fresh the topic tables are, where their catalog and files live, and how big a
commit may be (docs/TABLES.md)."""

from __future__ import annotations

from dataclasses import dataclass

# Iceberg's write.parquet.compression-codec values that pyarrow writes and Spark's, DuckDB's and pyiceberg's
# readers read (brotli is left out: DuckDB reads it, Spark's bundled Parquet does not without a codec jar).
COMPRESSIONS = ("zstd", "lz4", "snappy", "gzip", "uncompressed")


@dataclass(frozen=True)
class TablesConfig:
    lag_ms: int = 10_000  # an acknowledged record is in its table at most about this long after
    catalog_uri: str = ""  # SQLAlchemy URI of the Iceberg SQL catalog; "" = DATA_DIR/tables/catalog.db
    warehouse: str = ""  # where table files go; "" = DATA_DIR/tables/warehouse
    commit_bytes: int = 256 * 1024 * 1024  # batches read for one commit, at most (the most "auto" gives)
    row_group_rows: int = 1024 * 1024  # Parquet row group: rows (pyiceberg sizes row groups by rows only)
    # New tables' Parquet codec (Iceberg's names). zstd: the smallest files; lz4 and none trade file size
    # for the writer's CPU (docs/TABLES.md, "Freshness and pacing").
    compression: str = "zstd"
    fail_on_data_loss: bool = True  # records gone before they reached the table stop it (false: skip, count)
    policy_check_ms: int = 5000  # how often the writer reads which topics want a table
    maintenance_ms: int = 60_000  # how often a table is compacted, expired and swept
    target_file_bytes: int = 128 * 1024 * 1024  # compaction joins the files under half this into files of it
    compact_min_files: int = 8  # small files a partition needs before it is compacted
    snapshot_keep_ms: int = 3_600_000  # snapshots (and the files only they name) kept this long for readers
    orphan_grace_ms: int = 600_000  # files no snapshot names are deleted once this old
    # A deleted topic's table (and dead-letter table) is dropped, files and all, at the next maintenance
    # round; false keeps it for its readers (a topic created later under the name stops at it, TableAhead).
    drop_with_topic: bool = False
    # Added to the table worker process's nice value: on a busy machine the broker's threads get the CPU
    # first (docs/TABLES.md, "Freshness and pacing").
    worker_nice: int = 10
    worker_threads: int = 1  # Arrow's pools in the table worker, and a commit's Parquet files encoded at once

    def check(self) -> None:
        if self.lag_ms < 100:
            raise ValueError(f"[tables] lag_ms must be at least 100, not {self.lag_ms}")
        if self.commit_bytes < 1024 * 1024:
            raise ValueError(f"[tables] commit_bytes must be at least 1 MiB, not {self.commit_bytes}")
        if self.row_group_rows < 1024:
            raise ValueError(f"[tables] row_group_rows must be at least 1024, not {self.row_group_rows}")
        if self.compression not in COMPRESSIONS:
            raise ValueError(f"[tables] compression must be one of {', '.join(COMPRESSIONS)}, not "
                             f"{self.compression!r}")
        if self.compact_min_files < 2:
            raise ValueError(f"[tables] compact_min_files must be at least 2, not {self.compact_min_files}")
        if self.target_file_bytes < 1024 * 1024:
            raise ValueError(f"[tables] target_file_bytes must be at least 1 MiB, not "
                             f"{self.target_file_bytes}")
        if self.orphan_grace_ms < 60_000:
            raise ValueError("[tables] orphan_grace_ms must be at least 60000: a commit in progress must not "
                             "lose its files to a sweep")
        if not 0 <= self.worker_nice <= 19:
            raise ValueError(f"[tables] worker_nice must be between 0 and 19, not {self.worker_nice}")
        if self.worker_threads < 1:
            raise ValueError(f"[tables] worker_threads must be at least 1, not {self.worker_threads}")
        if self.policy_check_ms < 100:
            raise ValueError(f"[tables] policy_check_ms must be at least 100, not {self.policy_check_ms}")
